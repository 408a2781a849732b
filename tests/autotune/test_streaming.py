"""Streaming from disk in the plan, without a disk: what a token's page faults bring in of a
MoE's routed experts for the disk's read-ahead (recorded: this VM's virtio disk has
read_ahead_kb = 8192, a desktop's default is 128), and why repacked weights never stream.
`test_streaming_measured.py` holds the measured side."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hearthside.autotune.memory import CPU, WeightPiece, pieces_from_spec
from hearthside.autotune.planner import Plan, expert_fetch_share, plan
from hearthside.core.models.catalog import catalog_entry, catalog_spec
from hearthside.core.models.descriptor import spec_from_descriptor
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import expand_spec

pytestmark = pytest.mark.beside

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
VIRTIO_READ_AHEAD_KB = 8192  # /sys/block/vda/queue/read_ahead_kb on the 2-core EPYC VM
NO_REPACKING = ["avx", "f16c", "fma"]
AVX2 = ["avx", "avx2", "f16c", "fma"]  # Q4_0, Q4_K and IQ4_NL repacked


def expert_tensors(n_expert: int, slice_bytes: int, layers: int = 4) -> list[WeightPiece]:
    """A file's routed expert tensors: gate, up and down per layer, `slice_bytes` an expert."""
    size = n_expert * slice_bytes
    return [
        WeightPiece(f"blk.{layer}.ffn_{kind}_exps.weight", layer, size, ("Q8_0",), True, offset=0)
        for layer in range(layers)
        for kind in ("gate", "up", "down")
    ]


def moe(n_expert: int, used: int) -> ModelSpec:
    return replace(catalog_spec("qwen3-30b-a3b"), n_expert=n_expert, n_expert_used=used)


def test_a_fault_window_within_an_expert_slice_reads_the_active_experts_only() -> None:
    spec = moe(32, 4)
    # a page per fault (MADV_RANDOM): the 4 of 32 slices
    share = expert_fetch_share(spec, expert_tensors(32, 544 * KIB), 4 * KIB)
    assert share == pytest.approx(4 / 32, rel=0.01)
    # a 256 KiB window around 8 MiB slices: a little more than 4/32, by its overhang
    share = expert_fetch_share(spec, expert_tensors(32, 8 * MIB), 256 * KIB)
    assert 4 / 32 < share < 1.05 * (4 / 32 + 4 * 128 * KIB / (32 * 8 * MIB))


def test_a_fault_window_wider_than_the_slices_brings_in_whole_expert_tensors() -> None:
    # the benchmark's synthetic qwen3moe: 32 experts of 544 KiB a slice (Q8_0, 512 x 1024)
    spec, tensors = moe(32, 4), expert_tensors(32, 544 * KIB)
    measured_window = 2 * VIRTIO_READ_AHEAD_KB * KIB  # llama.cpp fadvises the file sequential
    assert expert_fetch_share(spec, tensors, measured_window) == 1.0
    half = expert_fetch_share(spec, tensors, measured_window // 2)
    assert 0.85 < half < 1.0  # 4 windows of 8 MiB leave a few of the 17 MiB uncovered
    # more active experts cover more of a tensor with the same window
    assert expert_fetch_share(moe(32, 2), tensors, measured_window // 4) < expert_fetch_share(
        moe(32, 8), tensors, measured_window // 4
    )


def streaming(spec: ModelSpec, read_ahead_kb: int | None, memory_gb: int = 14) -> Plan:
    disk: dict[str, float] = {"read_gb_s": 2.0}
    if read_ahead_kb is not None:
        disk["read_ahead_kb"] = read_ahead_kb
    profile = expand_spec(
        {
            "schema": 1,
            "cpu": {"cores": 8, "threads": 16, "flags": NO_REPACKING},
            "memory_gb": memory_gb,
            "disk": disk,
        }
    )
    return plan(spec, profile, n_ctx=4096, free_margin_bytes=GIB)


def streaming_reason(result: Plan) -> str:
    return next(r.why for r in result.reasons if r.setting == "use_mmap")


def test_the_disks_read_ahead_sets_what_a_moe_token_reads_from_disk() -> None:
    spec = catalog_spec("qwen3-30b-a3b")  # 128 experts, 8 used, ~1 MiB slices
    desktop = streaming(spec, read_ahead_kb=128)
    virtio = streaming(spec, read_ahead_kb=VIRTIO_READ_AHEAD_KB)
    assert desktop.streams_from_disk and virtio.streams_from_disk
    assert desktop.speed.expert_fetch_share < 0.1 < 0.5 < virtio.speed.expert_fetch_share
    assert virtio.speed.disk_read_bytes_per_token > 3 * desktop.speed.disk_read_bytes_per_token
    assert virtio.speed.decode_tps < desktop.speed.decode_tps / 3
    why = streaming_reason(virtio)
    assert "this disk's read-ahead of 8 MiB" in why
    assert f"read about {virtio.speed.expert_fetch_share:.0%} of the routed experts" in why
    assert "an assumed read-ahead of 128 KiB" in streaming_reason(streaming(spec, None))


def test_whole_expert_tensors_each_token_leave_nothing_in_ram_to_keep() -> None:
    # a MoE of small experts on the virtio disk: every fault's 16 MiB window covers its tensor
    spec = replace(catalog_spec("qwen3-30b-a3b"), n_expert=32, n_expert_used=4)
    pieces = [
        replace(piece, bytes=piece.bytes // 4) if "_exps" in piece.name else piece
        for piece in pieces_from_spec(spec)
    ]
    profile = expand_spec(
        {
            "schema": 1,
            "cpu": {"cores": 8, "threads": 16, "flags": NO_REPACKING},
            "memory_gb": 6,
            "disk": {"read_gb_s": 2.0, "read_ahead_kb": VIRTIO_READ_AHEAD_KB},
        }
    )
    result = plan(spec, profile, n_ctx=4096, free_margin_bytes=GIB, pieces=pieces)
    assert result.streams_from_disk and result.speed.expert_fetch_share > 0.9
    assert result.speed.resident_weights_bytes == 0
    why = streaming_reason(result)
    assert "brings in whole expert tensors" in why and "none stay" in why


def q4_0_spec() -> ModelSpec:
    entry = catalog_entry("llama-3.1-8b")
    return spec_from_descriptor(entry.model_copy(update={"quant": "Q4_0"}))


def q4_0_pieces(spec: ModelSpec, repacked_share: str = "all") -> list[WeightPiece]:
    """The spec's pieces as single-type tensors: Q4_0 matrices (the FFNs only, or all), the
    rest Q8_0."""

    def typed(piece: WeightPiece) -> WeightPiece:
        q4_0 = piece.matmul and (repacked_share == "all" or ".ffn_" in piece.name)
        return replace(piece, type_names=("Q4_0",) if q4_0 else ("Q8_0",))

    return [typed(piece) for piece in pieces_from_spec(spec)]


def cpu_only(flags: list[str], memory_gb: int) -> HardwareProfile:
    return expand_spec(
        {
            "schema": 1,
            "cpu": {"cores": 8, "threads": 16, "flags": flags},
            "memory_gb": memory_gb,
            "disk": {"read_gb_s": 2.0},
        }
    )


def plan_on_cpu(
    spec: ModelSpec, pieces: list[WeightPiece], flags: list[str], memory_gb: int
) -> Plan:
    profile = cpu_only(flags, memory_gb)
    return plan(spec, profile, n_ctx=4096, free_margin_bytes=GIB, pieces=pieces)


def test_repacked_weights_that_do_not_fit_in_ram_do_not_stream() -> None:
    spec = q4_0_spec()
    pieces = q4_0_pieces(spec)
    # without repacking the file-backed weights stream; with it they live in anonymous memory
    plain = plan_on_cpu(spec, pieces, NO_REPACKING, memory_gb=4)
    assert plain.streams_from_disk
    result = plan_on_cpu(spec, pieces, AVX2, memory_gb=4)
    assert not result.fits and not result.streams_from_disk
    (advice,) = result.advice
    assert "repacks Q4_0 weights" in advice  # the types the model holds
    assert "cannot be streamed from the file" in advice


def test_repacked_weights_that_fit_stay_in_ram_while_the_rest_streams() -> None:
    spec = q4_0_spec()
    pieces = q4_0_pieces(spec, repacked_share="ffn")
    repacked = sum(p.bytes for p in pieces if p.type_names == ("Q4_0",))
    result = plan_on_cpu(spec, pieces, AVX2, memory_gb=5)
    assert result.streams_from_disk
    speed = result.speed
    assert speed.pinned_weights_bytes == repacked
    assert speed.resident_weights_bytes >= repacked
    cpu = next(d for d in result.devices if d.device == CPU)
    # what streams is the file's other weights, not the repacked copies
    assert speed.disk_read_bytes_per_token <= cpu.weights_bytes - repacked
    assert "repacked weights stay in any case" in streaming_reason(result)
