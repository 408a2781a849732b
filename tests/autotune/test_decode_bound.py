"""What bounds decode, per machine and model — RAM bandwidth, the CPU's compute, the cache, the
disk — and what stays in RAM when the weights stream from disk."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hearthside.autotune.memory import CPU, pieces_from_gguf, pieces_from_spec
from hearthside.autotune.planner import (
    MMAP_STREAMING_EFFICIENCY,
    Plan,
    decode_bound_text,
    plan,
    token_work,
)
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.probe.spec import expand_spec
from tests.sapphire_rapids import (
    MEASURED_DECODE_TPS,
    MEASURED_PREFILL_TPS,
    MIB,
    gemma_q4_0,
    sapphire_rapids,
    sapphire_rapids_calibration,
)

pytestmark = pytest.mark.beside

GIB = 1 << 30


def decode_reason(result: Plan) -> str:
    return next(f"{r.value}: {r.why}" for r in result.reasons if r.setting == "decode")


def test_a_model_in_a_480_mib_l3_is_compute_bound_not_bandwidth_bound() -> None:
    result = plan(gemma_q4_0(), sapphire_rapids(), calibration=sapphire_rapids_calibration())
    assert result.speed.decode_limit == "cache"
    reason = decode_reason(result)
    assert "compute" in reason and "L3 cache" in reason and "480 MiB" in reason
    assert "limited by memory bandwidth" not in reason
    assert decode_bound_text(result) in reason
    # the kernels' own cost from the cache, not bytes over the RAM bandwidth
    assert result.speed.decode_tps_empty_context == pytest.approx(MEASURED_DECODE_TPS, rel=0.15)
    assert result.speed.prefill_tps == pytest.approx(MEASURED_PREFILL_TPS, rel=0.15)


def test_a_model_much_larger_than_l3_is_bound_by_memory_bandwidth_there() -> None:
    spec = catalog_spec("llama-3.1-8b")  # ~4.6 GiB of Q4_K_M weights a token
    result = plan(spec, sapphire_rapids(), calibration=sapphire_rapids_calibration())
    assert result.fits and result.speed.decode_limit == "memory bandwidth"
    reason = decode_reason(result)
    ram = sapphire_rapids_calibration()["cpu_read_bytes_per_s"]  # 31 GB/s measured there
    assert "limited by memory bandwidth" in reason and f"from RAM (~{ram / 1e9:.0f} GB/s)" in reason
    # no faster than its bytes at the RAM bandwidth
    read = result.speed.decode_read_bytes_per_token
    assert read > 4 * GIB
    assert result.speed.decode_tps_empty_context <= ram / read


def test_the_same_model_without_a_large_cache_reads_from_ram() -> None:
    small_l3 = sapphire_rapids(l3_bytes=32 * MIB)
    result = plan(gemma_q4_0(), small_l3, calibration=sapphire_rapids_calibration())
    # its kernels, measured there, take longer than RAM needs to feed them
    assert result.speed.decode_limit == "compute"
    assert "RAM" in decode_reason(result) and "L3 cache" not in decode_reason(result)
    unknown_l3 = replace(small_l3, cpu=replace(small_l3.cpu, l3_cache_bytes=None))
    assert plan(gemma_q4_0(), unknown_l3).speed.decode_limit != "cache"


def test_costs_measured_from_the_cache_do_not_outrun_ram_for_a_model_that_is_not_in_it() -> None:
    # probes that fitted in the cache ran at twice the RAM bandwidth's pace per byte
    from_cache = {"cpu_read_bytes_per_s": 20e9, "decode_efficiency:Q4_K": 2.0}
    from_cache["decode_efficiency:Q6_K"] = 2.0
    profile = sapphire_rapids()
    big = plan(catalog_spec("llama-3.1-8b"), profile, n_ctx=2048, calibration=from_cache)
    ram_floor_tps = 20e9 / big.speed.decode_read_bytes_per_token
    assert big.speed.decode_tps_empty_context == pytest.approx(ram_floor_tps, rel=0.02)
    assert big.speed.decode_limit == "memory bandwidth"
    # in the cache, the same costs hold as measured: faster than RAM could feed it
    small = plan(gemma_q4_0(), profile, n_ctx=2048, calibration=from_cache)
    assert small.speed.decode_limit == "cache"
    assert small.speed.decode_tps_empty_context > 20e9 / small.speed.decode_read_bytes_per_token


def test_kernels_slower_than_ram_make_decode_compute_bound() -> None:
    slow = {"cpu_read_bytes_per_s": 40e9, "decode_efficiency:Q4_K": 0.2}
    slow["decode_efficiency:Q6_K"] = 0.2
    result = plan(
        catalog_spec("llama-3.1-8b"), sapphire_rapids(l3_bytes=32 * MIB), calibration=slow
    )
    assert result.speed.decode_limit == "compute"
    assert "limited by the CPU's compute" in decode_reason(result)


def test_a_gpu_tier_is_bound_by_its_memory_bandwidth() -> None:
    profile = expand_spec({"schema": 1, "gpus": [{"model": "rtx-3090"}], "memory_gb": 32})
    result = plan(catalog_spec("llama-3.1-8b"), profile)
    assert result.speed.decode_limit == "memory bandwidth"
    assert "from CUDA0's memory" in decode_reason(result)


# --- streaming from disk: what stays in RAM --------------------------------------------------


def cpu_budget(result: Plan) -> Any:
    return next(device for device in result.devices if device.device == CPU)


def room_for_weights(result: Plan) -> int:
    cpu = cpu_budget(result)
    return cpu.capacity_bytes - (cpu.used_bytes - cpu.weights_bytes)


def streaming(
    spec: ModelSpec,
    memory_gb: int,
    disk_gb_s: float = 2.0,
    calibration: dict[str, float] | None = None,
) -> Plan:
    profile = expand_spec(
        {
            "schema": 1,
            "cpu": {"cores": 8, "threads": 16, "flags": ["avx", "f16c", "fma"]},  # no repacking
            "memory_gb": memory_gb,
            "disk": {"read_gb_s": disk_gb_s},
        }
    )
    return plan(spec, profile, n_ctx=4096, free_margin_bytes=GIB, calibration=calibration)


def test_a_dense_model_larger_than_ram_reads_all_its_weights_from_disk_each_token() -> None:
    # the page cache evicts the least recently used page: with every weight read once a
    # token, in order, each is gone before the next token needs it (benchmarks/disk_streaming)
    spec = catalog_spec("llama-3.1-8b")  # untied: the embeddings are looked up, not streamed
    result = streaming(spec, memory_gb=4)
    assert result.streams_from_disk and result.speed.decode_limit == "disk"
    speed = result.speed
    assert speed.resident_weights_bytes == 0
    read_per_token = spec.size_bytes - spec.embeddings.bytes
    assert speed.disk_read_bytes_per_token == pytest.approx(read_per_token, rel=0.01)
    # a token: its CPU work as in RAM, plus its bytes at the disk's streaming speed
    disk_s = speed.disk_read_bytes_per_token / (2e9 * MMAP_STREAMING_EFFICIENCY)
    in_ram = streaming(spec, memory_gb=64)
    assert not in_ram.streams_from_disk
    cpu_s = 1 / in_ram.speed.decode_tps_empty_context
    assert 1 / speed.decode_tps_empty_context == pytest.approx(disk_s + cpu_s, rel=0.01)
    faster_disk = streaming(spec, memory_gb=4, disk_gb_s=4.0).speed
    assert faster_disk.decode_tps > speed.decode_tps
    why = next(r.why for r in result.reasons if r.setting == "use_mmap")
    room = f"{room_for_weights(result) / GIB:.1f} GiB"
    assert f"more than the {room} of RAM left for them" in why
    assert "all of it is read from disk each token" in why


def test_streaming_runs_at_the_page_fault_speed_the_calibration_measured() -> None:
    # the Sapphire Rapids VM: faults read 1.8 GB/s where read() read 0.8 (8 MiB read-ahead)
    spec = catalog_spec("llama-3.1-8b")
    measured = {"disk_read_bytes_per_s": 0.8e9, "disk_fault_read_bytes_per_s": 1.8e9}
    result = streaming(spec, memory_gb=4, calibration=measured)
    assert result.streams_from_disk and result.speed.decode_limit == "disk"
    cpu_s = 1 / streaming(spec, memory_gb=64, calibration=measured).speed.decode_tps_empty_context
    disk_s = result.speed.disk_read_bytes_per_token / 1.8e9
    assert 1 / result.speed.decode_tps_empty_context == pytest.approx(disk_s + cpu_s, rel=0.01)
    assert "page faults read ~1.8 GB/s, measured" in decode_reason(result)
    # not measured: a share of the cold read, and the reason says so
    cold_only = streaming(spec, memory_gb=4, calibration={"disk_read_bytes_per_s": 0.8e9})
    assert cold_only.speed.decode_tps < result.speed.decode_tps
    assert f"page faults reach about {MMAP_STREAMING_EFFICIENCY:.0%}" in decode_reason(cold_only)


def test_a_moe_keeps_its_always_used_tensors_and_reads_only_missing_active_experts() -> None:
    spec = catalog_spec("qwen3-30b-a3b")  # 128 experts, 8 used
    result = streaming(spec, memory_gb=14)
    assert result.streams_from_disk
    speed = result.speed
    routed = spec.routed_expert_bytes
    always_used = spec.size_bytes - routed - spec.embeddings.bytes
    room = room_for_weights(result)
    assert always_used < speed.resident_weights_bytes == room
    kept_share = (room - always_used) / routed
    active = routed * spec.n_expert_used / spec.n_expert
    # each ~1 MiB expert slice comes with a little of its neighbours: the fault window of the
    # assumed 128 KiB read-ahead (tests/autotune/test_streaming.py: larger read-aheads)
    missing = active * (1 - kept_share)
    assert missing < speed.disk_read_bytes_per_token < 1.25 * missing
    # reading every active weight's missing share, as a dense model would, reads far more
    assert speed.disk_read_bytes_per_token < 0.5 * active
    why = next(r.why for r in result.reasons if r.setting == "use_mmap")
    assert "stay in RAM" in why and "attention, shared experts, dense layers" in why
    assert f"about {speed.disk_read_bytes_per_token / MIB:.0f} MiB, are read from disk" in why


# --- a model smaller than the calibration's probes ------------------------------------------


def with_cache(figures: dict[str, float], speedup: float) -> dict[str, float]:
    """The figures of a calibration whose half-size (64 MiB) cache probe decoded `speedup`
    times faster per byte than its 128 MiB probes, as on the Sapphire Rapids VM (~2x)."""
    return {
        **figures,
        "decode_cache_speedup": speedup,
        "decode_cache_bytes": 64 * MIB,
        "decode_probe_bytes": 128 * MIB,
    }


def test_a_model_smaller_than_the_probes_decodes_as_much_faster_as_the_cache_probe_did(
    chat_model_file: Path,
) -> None:
    figures = sapphire_rapids_calibration()
    info = validate_gguf(chat_model_file)  # SmolLM2 135M Q4_1: 96 MB a token
    spec, pieces = spec_from_gguf(chat_model_file), pieces_from_gguf(info)

    def decode(calibration: dict[str, float]) -> float:
        result = plan(spec, sapphire_rapids(), calibration=calibration, pieces=pieces)
        return result.speed.decode_tps_empty_context

    plain, cached = decode(figures), decode(with_cache(figures, 2.0))
    # its 96 MB lie between the two probes: its weights' time shrinks by 0.28 of the way
    # to half (1.4x); its layers' fixed costs do not shrink
    assert 1.25 < cached / plain < 1.45
    assert decode(with_cache(figures, 1.0)) == pytest.approx(plain)
    # a model larger than the probes (Gemma, 250 MB) is predicted as before
    gemma = plan(gemma_q4_0(), sapphire_rapids(), calibration=with_cache(figures, 2.0))
    before = plan(gemma_q4_0(), sapphire_rapids(), calibration=figures)
    assert gemma.speed.decode_tps_empty_context == pytest.approx(
        before.speed.decode_tps_empty_context
    )


def test_a_moe_token_touches_all_its_routed_experts_over_many_tokens() -> None:
    spec = catalog_spec("qwen3-30b-a3b")  # 8 of 128 experts a token
    config = EngineConfig(spec.name, n_ctx=2048)
    work = token_work(spec, config, (), pieces_from_spec(spec))
    read = sum(work.read_bytes[CPU].values())
    # what a cache would have to hold is every expert, not one token's share of them
    assert work.touched_bytes[CPU] > 5 * read
