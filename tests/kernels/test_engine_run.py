"""The engine micro-run on the real default model, and how backends are named."""

from __future__ import annotations

from pathlib import Path

from hearthside.core.probe.profile import EngineDevice
from hearthside.kernels.engine_run import (
    N_GEN,
    N_PROMPT,
    EngineBackend,
    backend_label,
    backends_for,
    engine_weight,
    measure_engine,
)
from hearthside.kernels.measurement import Budget


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
    measurements = measure_engine(
        None, backends_for(()), quick=True, budget=Budget(1.0, 3), warmup_s=0.1
    )
    assert [m.kind for m in measurements] == ["engine_prefill", "engine_decode"]
    assert not any(m.ok for m in measurements)
    assert "hearthside models install-default" in measurements[0].note


def test_a_file_the_engine_cannot_load_is_reported_not_raised(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    measurements = measure_engine(
        broken, backends_for(()), quick=True, budget=Budget(1.0, 3), warmup_s=0.1
    )
    assert len(measurements) == 2 and not any(m.ok for m in measurements)
    assert measurements[0].note.startswith("not measured: ")
