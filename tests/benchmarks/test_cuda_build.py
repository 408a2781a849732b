"""benchmarks/cuda_build.py's verdict on recorded outcomes (the compile itself takes hours on
two cores and never runs in tests): a wheel counts only when cuobjdump finds an ELF for every
architecture the ladder asked for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# `cuobjdump --list-elf` as CUDA 12.4's printed it for a program built with -arch=sm_70 here
SM70_LINES = ["ELF file    1: t70.1.sm_70.cubin", "ELF file    2: t70.2.sm_70.cubin"]


def cuda_build():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(BENCHMARKS))
    import cuda_build as module

    return module


def test_cuobjdump_lines_name_the_architectures() -> None:
    module = cuda_build()
    assert module.archs_in(SM70_LINES) == ["70"]
    assert module.archs_in(["ELF file    1: libggml-cuda.1.sm_90a.cubin"]) == ["90"]
    assert module.archs_in(["cuobjdump failed: no such file"]) == []


def test_a_wheel_without_code_for_the_gpu_is_a_miss() -> None:
    module = cuda_build()
    held = {"archs": ["70"], "archs_found": ["70"], "wheel": "x.whl", "error": ""}
    assert all(target.met for target in module.targets_of(held))
    other = {**held, "archs_found": ["90"]}
    assert [t.met for t in module.targets_of(other)] == [True, False]
    failed = {"archs": ["90"], "archs_found": [], "wheel": "", "error": "pip wheel failed"}
    assert not any(target.met for target in module.targets_of(failed))


def test_the_flags_are_the_ladders_for_the_recorded_gpus() -> None:
    module = cuda_build()
    h200 = module.ladder_build(module.gpus_of_fixture("h200"))
    v100 = module.ladder_build(module.gpus_of_fixture("v100"))
    assert h200.env["CMAKE_ARGS"] == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90"
    assert v100.env["CMAKE_ARGS"] == "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=70"
