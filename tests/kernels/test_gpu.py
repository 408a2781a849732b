"""GPU kernels: without torch or without a GPU they report why, never crash; on a machine with
a GPU (the `gpu` marker; the device machine) they measure it for real."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from hearthside.kernels import gpu as gpu_kernels
from hearthside.kernels.matmul import MatmulShape
from hearthside.kernels.measurement import NO_GPU_NOTE, NOT_MEASURED_NOTE, Budget
from hearthside.kernels.results import CalibrationReport
from hearthside.kernels.torch_support import cpu_device, gpu_devices, import_torch
from tests.kernels.stability import two_agreeing_runs

WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` now raises ImportError, as if not installed
from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.calibrate import run_calibration

profile = expand_spec(
    {"gpus": [{"model": "h200"}], "memory_gb": 16, "cpu": {"cores": 2, "threads": 2}}
)
report = run_calibration(budget_s=3.0, profile=profile)
assert "torch" not in sys.modules or sys.modules["torch"] is None
print(report.to_json())
"""


def test_without_torch_gpu_and_torch_kernels_say_not_measured() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr
    report = CalibrationReport.from_dict(json.loads(completed.stdout))
    notes_by_kind = defaultdict(set)
    for m in report.measurements:
        if m.device == "cuda:0":
            notes_by_kind[m.kind].add(m.note)
    assert set(notes_by_kind) == set(gpu_kernels.GPU_KINDS)
    assert all(notes == {NOT_MEASURED_NOTE} for notes in notes_by_kind.values())
    torch_matmuls = [m for m in report.measurements if m.params.get("library") == "torch"]
    assert torch_matmuls and all(m.note == NOT_MEASURED_NOTE for m in torch_matmuls)
    assert report.machine["torch_version"] is None
    assert report.machine["gpus"][0]["name"] == "NVIDIA H200"


def test_with_torch_but_no_gpu_the_reason_is_no_gpu() -> None:
    torch = import_torch()
    assert torch is not None
    if gpu_devices(torch):
        pytest.skip("this machine has a GPU")
    assert gpu_kernels.unavailable_reason(torch, profiled_gpus=0) == NO_GPU_NOTE
    # a GPU the probe found but this torch build cannot drive (a CPU-only wheel)
    assert "cannot use this machine's GPU" in gpu_kernels.unavailable_reason(torch, 1)
    unmeasured = gpu_kernels.unmeasured(NO_GPU_NOTE)
    assert [m.kind for m in unmeasured] == list(gpu_kernels.GPU_KINDS)
    assert {m.unit for m in unmeasured if m.kind == "matmul"} == {"GFLOP/s"}


def test_the_gpu_code_path_runs_end_to_end_on_torchs_cpu_device() -> None:
    # The same kernels a GPU runs (events aside), driven through torch's CPU device so every
    # line but the CUDA timer runs in CI; pinning needs an accelerator and must say so.
    torch = import_torch()
    assert torch is not None
    shapes = (MatmulShape(1, 1024, 1024), MatmulShape(64, 256, 256))  # small: a CPU runs them
    measurements = gpu_kernels.measure_gpu(
        torch,
        cpu_device(),
        quick=True,
        budget=Budget(2.0, gpu_kernels.gpu_weight(shapes)),
        warmup_s=0.02,
        shapes=shapes,
    )
    kinds = [m.kind for m in measurements]
    assert kinds[:3] == list(gpu_kernels.MEMORY_KINDS)
    assert kinds.count("matmul") == 8  # fp32, fp16, bf16, int8 (no TF32 off CUDA) x GEMV/GEMM
    failed = {(m.kind, m.params.get("pinned")) for m in measurements if not m.ok}
    assert failed == {("h2d", True), ("d2h", True)}
    assert all("did not run on cpu" in m.note for m in measurements if not m.ok)
    assert all(m.value > 0 for m in measurements if m.ok)


@pytest.mark.gpu
def test_gpu_kernels_measure_a_real_gpu() -> None:
    torch = import_torch()
    devices = gpu_devices(torch) if torch is not None else []
    if not devices:
        pytest.skip("no GPU that torch can drive")
    device = devices[0]
    weight = gpu_kernels.gpu_weight()
    measurements = gpu_kernels.measure_gpu(
        torch, device, quick=True, budget=Budget(40.0, weight), warmup_s=0.1
    )
    by_key = {
        (m.kind, m.params.get("dtype"), m.params.get("m"), m.params.get("pinned")): m
        for m in measurements
    }
    for kind in ("memory_read", "memory_copy", "memory_triad"):
        assert by_key[(kind, None, None, None)].ok
        assert by_key[(kind, None, None, None)].value > 50.0  # GB/s: any discrete GPU
    gemm = by_key[("matmul", "fp16", 512, None)]
    assert gemm.ok and gemm.value > 1000.0  # GFLOP/s
    assert by_key[("h2d", None, None, True)].ok and by_key[("h2d", None, None, True)].value > 1
    assert by_key[("d2h", None, None, True)].ok

    def read() -> float:
        return gpu_kernels.measure_gpu_memory(
            torch, device, "memory_read", quick=True, budget_s=1.0, warmup_s=0.1
        ).value

    two_agreeing_runs(read)
