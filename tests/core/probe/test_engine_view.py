"""The engine view: the pure parser on recorded builds, and the live call on this CPU build."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import llama_cpp
import pytest

from hearthside.core.probe import engine as engine_probe
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.engine import (
    MissingSymbolError,
    built_backend,
    cuda_archs_compiled,
    engine_info_from,
    parse_system_info,
)
from hearthside.core.probe.profile import EngineInfo

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "engine"


def recorded(name: str) -> EngineInfo:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return engine_info_from(
        data["devices"],
        data["backends"],
        data["system_info"],
        data["version"],
        gpu_offload=data["gpu_offload"],
    )


def test_cuda_build_on_two_gpus() -> None:
    info = recorded("cuda-2x-rtx-3090.json")
    assert info.backends == ("CUDA", "CPU")
    assert [(d.name, d.kind) for d in info.devices] == [
        ("CUDA0", "gpu"),
        ("CUDA1", "gpu"),
        ("CPU", "cpu"),
    ]
    assert info.devices[0].description == "NVIDIA GeForce RTX 3090"
    assert info.devices[1].memory_total_bytes == 25438126080
    assert info.gpu_offload is True
    assert built_backend(info) == "cuda"
    assert cuda_archs_compiled(info.system_info or "") == ("sm_86",)


def test_metal_build_lists_the_accelerate_device_as_accel() -> None:
    info = recorded("metal-m3-ultra.json")
    assert built_backend(info) == "metal"
    kinds = {d.name: d.kind for d in info.devices}
    assert kinds == {"MTL0": "gpu", "BLAS": "accel", "CPU": "cpu"}
    blas = info.devices[1]
    assert blas.memory_total_bytes is None and blas.memory_free_bytes is None  # 0 = unknown


def test_rocm_build() -> None:
    info = recorded("rocm-mi50-7900xtx.json")
    assert built_backend(info) == "hip"
    assert [d.description for d in info.devices if d.kind == "gpu"] == [
        "AMD Instinct MI50/MI60",
        "Radeon RX 7900 XTX",
    ]
    assert parse_system_info(info.system_info or "")["ROCm"] == {"NO_VMM": "1"}


def test_system_info_parser_splits_backends_and_features() -> None:
    text = "CUDA : ARCHS = 860,890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | "
    assert parse_system_info(text) == {
        "CUDA": {"ARCHS": "860,890", "USE_GRAPHS": "1"},
        "CPU": {"SSE3": "1", "AVX2": "1"},
    }
    assert cuda_archs_compiled(text) == ("sm_86", "sm_89")
    assert parse_system_info("") == {}


def test_meta_and_unknown_device_types_are_not_listed() -> None:
    devices = [
        {"name": "CUDA0", "description": "x", "type": 1, "memory_free": 1, "memory_total": 2},
        {"name": "META", "description": "tensor parallel", "type": 4},
        {"name": "FUTURE", "description": "?", "type": 9},
    ]
    info = engine_info_from(devices, ["CUDA", "CPU"], None, "9.9")
    assert [d.name for d in info.devices] == ["CUDA0"]
    assert info.gpu_offload is True  # inferred from the GPU device when not given


def test_live_engine_reports_what_this_build_of_llama_cpp_reports() -> None:
    """Whatever the build (CPU here, CUDA or Metal elsewhere): the probe's view agrees with
    what llama_cpp itself says in this process, and the CPU backend is always there."""
    started = time.perf_counter()
    result = engine_probe.probe(ProbeContext())
    elapsed_s = time.perf_counter() - started
    assert result.errors == ()
    info = result.engine
    assert info is not None
    assert info.package_version == llama_cpp.__version__
    assert "CPU" in info.backends and "cpu" in [d.kind for d in info.devices]
    system_info = llama_cpp.llama_print_system_info().decode("utf-8", errors="replace").strip()
    assert info.system_info == system_info
    # llama.cpp prints one section per registered backend that lists features
    assert set(parse_system_info(system_info)) <= set(info.backends), info.backends
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    assert info.gpu_offload is offload
    gpus = [d for d in info.devices if d.kind in ("gpu", "igpu")]
    assert not gpus or offload  # (offload without a GPU device: an RPC-only build)
    if gpus:  # a GPU build names its backend first among the non-CPU ones
        assert built_backend(info) != "cpu", info.backends
    assert elapsed_s < 1.0


def test_a_missing_symbol_becomes_a_probe_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(lib: object) -> list[str]:
        raise MissingSymbolError("ggml_backend_reg_count")

    monkeypatch.setattr(engine_probe, "_read_backends", missing)
    result = engine_probe.probe(ProbeContext())
    assert result.engine is not None
    assert result.engine.devices  # what could be read is still there
    assert result.engine.backends == ()
    assert len(result.errors) == 1
    assert "ggml_backend_reg_count" in result.errors[0].message


def test_a_real_missing_symbol_is_detected() -> None:
    lib = engine_probe._ggml_library()
    with pytest.raises(MissingSymbolError):
        engine_probe._function(lib, "ggml_backend_no_such_function", [], None)
