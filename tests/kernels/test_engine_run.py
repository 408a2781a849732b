"""The engine micro-run on the real default model, and how backends are named."""

from __future__ import annotations

import resource
import signal
from pathlib import Path

import pytest

from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.planner import token_work
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import EngineDevice
from hearthside.kernels.engine_run import (
    CACHE_PROBE,
    LAST_TOKEN_BYTES,
    LAST_TOKEN_ROWS,
    MAX_PROBE_BYTES,
    MIN_PROBE_BYTES,
    MIN_ROUNDS,
    N_GEN,
    N_PROMPT,
    OVERHEAD_PROBE,
    PREFILL_ROWS,
    PREFILL_WEIGHTS,
    PROBE_TYPES,
    PROBE_WIDTHS,
    READ_BYTES,
    READ_ROWS,
    SHORT_OVERHEAD_PROBE,
    THREAD_ROUNDS,
    EngineBackend,
    SpeedProbe,
    backend_label,
    backends_for,
    candidate_thread_counts,
    engine_weight,
    measure_cpu,
    measure_engine,
    per_token_work,
    scanned_thread_counts,
    speed_probes,
    type_bits,
    work_by_type,
)
from hearthside.kernels.measurement import Budget
from hearthside.kernels.synthetic_model import SyntheticShape, write_uniform_gguf


def test_ggml_device_names_become_measurement_devices() -> None:
    assert backend_label("CUDA0") == "cuda:0"
    assert backend_label("CUDA1") == "cuda:1"
    assert backend_label("ROCm0") == "rocm:0"
    assert backend_label("MTL0") == "mps"  # the Apple GPU, as torch calls it
    assert backend_label("Vulkan2") == "vulkan:2"


def test_every_gpu_the_engine_sees_gets_a_run_of_its_own() -> None:
    devices = (
        EngineDevice("CPU", "AMD EPYC", "cpu"),
        EngineDevice("CUDA0", "NVIDIA H200", "gpu", 150 * 2**30),
        EngineDevice("CUDA1", "NVIDIA H200", "gpu", 150 * 2**30),
    )
    assert backends_for(devices) == [
        EngineBackend("cpu", n_gpu_layers=0),
        EngineBackend("cuda:0", n_gpu_layers=-1, main_gpu=0),
        EngineBackend("cuda:1", n_gpu_layers=-1, main_gpu=1),
    ]
    assert backends_for(devices[:1]) == [EngineBackend("cpu", n_gpu_layers=0)]


def test_prefill_and_decode_of_the_default_model_on_the_cpu(default_model_file: Path) -> None:
    backends = backends_for(())
    budget = Budget(6.0, engine_weight(backends))
    prefill, decode = measure_engine(
        default_model_file, backends, quick=False, budget=budget, warmup_s=0.2
    )
    assert prefill.kind == "engine_prefill" and decode.kind == "engine_decode"
    assert prefill.ok and decode.ok
    assert prefill.device == decode.device == "cpu"
    assert prefill.unit == decode.unit == "tok/s"
    # Plausible, not fast: on a machine shared with other jobs llama.cpp's spinning threads
    # slow down many times over, so no speed relation is asserted here.
    assert 0.5 < prefill.value < 100_000 and 0.5 < decode.value < 100_000
    assert prefill.params["model"] == default_model_file.stem
    assert 8 <= prefill.params["n_prompt"] <= N_PROMPT
    assert 2 <= decode.params["n_gen"] <= N_GEN
    assert decode.params["n_gpu_layers"] == 0


def test_without_a_model_the_run_says_how_to_get_one() -> None:
    measurements = measure_cpu(None, [], quick=True, budget=Budget(1.0, 1))
    assert [m.kind for m in measurements] == ["engine_prefill", "engine_decode"]
    assert not any(m.ok for m in measurements)
    assert "hearthside models install-default" in measurements[0].note


def test_a_file_the_engine_cannot_load_is_reported_not_raised(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    for measurements in (
        measure_cpu(broken, [], quick=True, budget=Budget(1.0, 1)),
        measure_engine(broken, backends_for(()), quick=True, budget=Budget(1.0, 3), warmup_s=0.1),
    ):
        assert len(measurements) == 2 and not any(m.ok for m in measurements)
        assert measurements[0].note.startswith("not measured: ")


def test_per_token_work_of_the_default_model(default_model_file: Path) -> None:
    work = per_token_work(validate_gguf(default_model_file))
    assert (work["n_layers"], work["n_vocab"], work["architecture"]) == (18, 262144, "gemma3")
    read = work_by_type(work, READ_BYTES)
    # tied embeddings: the 262k x 640 Q8_0 matrix is the output layer, read for every token
    assert read["Q8_0"] > 170 * 2**20
    assert set(read) == {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    assert work_by_type(work, READ_ROWS)["Q8_0"] >= 262144  # one dot product per vocab entry
    multiplied = work_by_type(work, PREFILL_WEIGHTS)
    # the blocks only (~100M of the 268M), less the last block's FFN, which llama.cpp runs
    # for the one token whose logits are wanted
    last_ffn = 3 * 640 * 2048
    assert 95e6 < sum(multiplied.values()) + last_ffn < 105e6
    assert sum(work_by_type(work, PREFILL_ROWS).values()) < sum(
        work_by_type(work, READ_ROWS).values()
    )
    # what a prompt batch runs once, for its last token: the output layer and that FFN
    once = work_by_type(work, LAST_TOKEN_BYTES)
    assert once["Q8_0"] >= 170 * 2**20
    assert sum(work_by_type(work, LAST_TOKEN_ROWS).values()) == 262144 + 2048 + 2048 + 640
    every_matrix = sum(read.values())
    assert sum(once.values()) < every_matrix < sum(once.values()) + 100e6  # + the blocks'


def test_the_planner_counts_a_token_the_way_the_calibration_does(
    default_model_file: Path,
) -> None:
    info = validate_gguf(default_model_file)
    spec = spec_from_gguf(default_model_file)
    work = token_work(spec, EngineConfig(str(default_model_file)), (), pieces_from_gguf(info))
    recorded = per_token_work(info)
    assert work.read_bytes["CPU"] == pytest.approx(work_by_type(recorded, READ_BYTES))
    assert work.read_rows["CPU"] == pytest.approx(work_by_type(recorded, READ_ROWS))
    assert work.prefill_weights["CPU"] == pytest.approx(work_by_type(recorded, PREFILL_WEIGHTS))
    assert work.prefill_rows["CPU"] == pytest.approx(work_by_type(recorded, PREFILL_ROWS))
    assert work.last_token_bytes["CPU"] == pytest.approx(work_by_type(recorded, LAST_TOKEN_BYTES))
    assert work.last_token_rows["CPU"] == pytest.approx(work_by_type(recorded, LAST_TOKEN_ROWS))
    assert work.layers == {"CPU": 18}


def test_speed_probes_outgrow_the_cache_at_two_widths_and_fill_k_quant_blocks() -> None:
    probes = speed_probes(32 << 20)
    expected = [f"{t}@{w}" for t in PROBE_TYPES for w in PROBE_WIDTHS]
    names = [probe.name for probe in probes]
    assert names == [OVERHEAD_PROBE, SHORT_OVERHEAD_PROBE, *expected, CACHE_PROBE]
    assert [probe.shape.n_layers for probe in probes[:2]] == [16, 2]  # per layer, per token
    # the cache probe: a narrow Q4_0 probe at half the bytes of the full-size one
    narrow_q4_0, cache = probes[names.index(f"Q4_0@{PROBE_WIDTHS[0]}")], probes[-1]
    assert cache.type_name == "Q4_0" and cache.shape.n_embd == narrow_q4_0.shape.n_embd
    assert cache.shape.n_layers == pytest.approx(narrow_q4_0.shape.n_layers / 2, abs=1)
    for probe in probes[2:-1]:
        shape = probe.shape
        weights = shape.n_layers * 14.5 * shape.n_embd**2
        probe_bytes = weights * type_bits(probe.type_name) / 8
        assert MIN_PROBE_BYTES * 0.7 < probe_bytes < MAX_PROBE_BYTES * 1.3  # whole layers
        assert shape.n_embd % 256 == 0 and shape.n_ff % 256 == 0
        assert shape.n_embd == int(probe.name.split("@")[1])
    # capped: a server's cache is not read twice over, and all probes are loaded at once
    for probe in speed_probes(1 << 30)[2:-1]:
        shape = probe.shape
        layer_bytes = 14.5 * shape.n_embd**2 * type_bits(probe.type_name) / 8
        assert (shape.n_layers - 0.5) * layer_bytes <= MAX_PROBE_BYTES


def test_the_model_and_the_probes_are_timed_in_the_same_rounds(
    default_model_file: Path,
) -> None:
    tiny_q2_k = SpeedProbe("Q2_K", "Q2_K", SyntheticShape("llama", 2, 256, 4, 1, 512, n_vocab=512))
    measurements = measure_cpu(
        default_model_file, [tiny_q2_k], quick=True, budget=Budget(8.0, 1), thread_counts=()
    )
    assert [(m.kind, m.params.get("probe")) for m in measurements] == [
        ("engine_prefill", None),
        ("engine_decode", None),
        ("engine_prefill", "Q2_K"),
        ("engine_decode", "Q2_K"),
    ]
    assert all(m.ok for m in measurements), [m.note for m in measurements]
    # every model ran in every round: the same count of repetitions
    assert {m.repetitions for m in measurements} == {measurements[0].repetitions}
    assert measurements[0].repetitions >= MIN_ROUNDS
    assert "interleaved rounds" in measurements[1].method
    model_decode, probe_decode = measurements[1], measurements[3]
    assert model_decode.params["model"] == default_model_file.stem
    assert probe_decode.params["n_layers"] == 2 and probe_decode.params["architecture"] == "llama"
    assert set(work_by_type(probe_decode.params, READ_BYTES)) == {"Q2_K"}  # uniform, unlike a mix
    assert not Path(probe_decode.params["model_path"]).exists()  # the probe file is gone
    # the 268M-weight model is far slower per token than a 2-layer probe
    assert probe_decode.value > model_decode.value


def test_the_shipped_model_is_also_timed_at_the_tuners_other_thread_counts(
    tmp_path: Path,
) -> None:
    model = write_uniform_gguf(
        tmp_path / "tiny.gguf", SyntheticShape("llama", 2, 256, 4, 1, 512, n_vocab=512), "Q8_0"
    )
    own = EngineConfig(str(model))
    others = [n for n in (1, 2) if (n, n) != (own.decode_threads, own.batch_threads)]
    measurements = measure_cpu(
        model, [], quick=True, budget=Budget(3.0, 1), thread_counts=(1, 2, 1)
    )
    assert all(m.ok for m in measurements), [m.note for m in measurements]
    shipped = [m for m in measurements if not m.params.get("thread_variant")]
    variants = [m for m in measurements if m.params.get("thread_variant")]
    assert [(m.kind, m.params["threads"]) for m in shipped] == [
        ("engine_prefill", own.batch_threads),
        ("engine_decode", own.decode_threads),
    ]
    # each other count once, both phases at it, as llama.cpp reported after the switch
    assert [(m.kind, m.params["threads"]) for m in variants] == [
        (kind, n) for n in others for kind in ("engine_prefill", "engine_decode")
    ]
    for variant in variants:
        like = next(m for m in shipped if m.kind == variant.kind)
        assert variant.repetitions == THREAD_ROUNDS <= like.repetitions
        # the same token counts as the shipped run, so the speeds compare
        assert (variant.params.get("n_gen"), variant.params.get("n_prompt")) == (
            like.params.get("n_gen"),
            like.params.get("n_prompt"),
        )
        assert variant.params["model_path"] == like.params["model_path"]


def test_the_thread_counts_timed_are_the_tuners_and_llama_cpp_pythons_default() -> None:
    assert candidate_thread_counts(2, 2) == (2, 1)
    assert candidate_thread_counts(8, 16) == (16, 8, 4)
    assert scanned_thread_counts(8, 16) == (16, 8, 4)  # the default, 16 // 2, is among them
    assert scanned_thread_counts(6, 6) == (6, 3)
    assert scanned_thread_counts(4, 6) == (6, 4, 3, 2)  # a hybrid: 6 // 2 is not a candidate


def test_a_probe_that_cannot_be_written_is_reported_with_what_to_do() -> None:
    """A full disk (here: a file-size limit, which fails the write the same way) costs that
    probe's figures, not the calibration."""
    tiny = SpeedProbe("Q8_0", "Q8_0", SyntheticShape("llama", 2, 256, 4, 1, 512, n_vocab=512))
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails instead of a kill
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))
    try:
        measurements = measure_cpu(None, [tiny], quick=True, budget=Budget(2.0, 1))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    probe = [m for m in measurements if m.params.get("probe") == "Q8_0"]
    assert [m.kind for m in probe] == ["engine_prefill", "engine_decode"]
    assert not any(m.ok for m in probe)
    assert "could not be written" in probe[0].note and "free some disk space" in probe[0].note
