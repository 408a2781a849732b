"""Realistic calibration data for tests that judge or store reports without measuring: the
figures are this machine's (2-core EPYC VM) and an H200's from its datasheet."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.calibrate import summarize_machine
from hearthside.kernels.measurement import NO_GPU_NOTE, Measurement
from hearthside.kernels.results import SCHEMA_VERSION, CalibrationReport


def measured(
    kind: str, device: str, value: float, unit: str = "GB/s", spread: float = 0.03, **params: Any
) -> Measurement:
    return Measurement(
        kind=kind,
        device=device,
        value=value,
        unit=unit,
        median=value,
        spread=spread,
        repetitions=5,
        method="test data",
        params=params,
    )


def h200_machine(**gpu_changes: Any) -> dict[str, Any]:
    profile = expand_spec(
        {"gpus": [{"model": "h200"}], "memory_gb": 128, "cpu": {"cores": 16, "threads": 16}}
    )
    gpu = replace(profile.gpus[0], pcie_generation=5, pcie_width=16, **gpu_changes)
    return summarize_machine(replace(profile, gpus=(gpu,)), torch_version="2.13.0")


def cpu_measurements() -> list[Measurement]:
    return [
        measured("memory_read", "cpu", 9.6, threads=1, array_bytes=268435456),
        measured("memory_read", "cpu", 14.9, threads=2, array_bytes=268435456),
        measured("memory_copy", "cpu", 18.4, threads=1, array_bytes=268435456),
        measured("memory_copy", "cpu", 19.0, threads=2, array_bytes=268435456),
        measured(
            "matmul",
            "cpu",
            9.7,
            "GFLOP/s",
            library="numpy",
            dtype="fp32",
            m=1,
            n=4096,
            k=4096,
            threads=2,
            weights_gb_s=19.4,
        ),
        measured(
            "matmul",
            "cpu",
            124.0,
            "GFLOP/s",
            library="numpy",
            dtype="fp32",
            m=512,
            n=1024,
            k=1024,
            threads=2,
        ),
        measured(
            "matmul",
            "cpu",
            10.0,
            "GFLOP/s",
            library="torch",
            dtype="bf16",
            m=512,
            n=1024,
            k=1024,
            threads=2,
        ),
        measured(
            "disk_read",
            "disk:/dev/vda",
            1.5,
            file_bytes=268435456,
            cache_bypass="posix_fadvise(DONTNEED)",
            cached_fraction_before=0.0,
        ),
        measured(
            "engine_prefill",
            "cpu",
            700.0,
            "tok/s",
            model="gemma-3-270m-q4_k_m",
            n_prompt=128,
            threads=2,
        ),
        measured(
            "engine_decode", "cpu", 70.0, "tok/s", model="gemma-3-270m-q4_k_m", n_gen=32, threads=2
        ),
        Measurement.failed("h2d", "gpu", "GB/s", NO_GPU_NOTE),
    ]


def report_with(measurements: list[Measurement], machine: dict[str, Any]) -> CalibrationReport:
    return CalibrationReport(
        schema=SCHEMA_VERSION,
        created_at="2026-11-29T19:00:00+00:00",
        hearthside_version="0.1.0",
        machine=machine,
        measurements=tuple(measurements),
        anomalies=(),
        duration_s=21.5,
    )
