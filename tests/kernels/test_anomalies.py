"""Spec values beside measurements, and the anomaly flags, on realistic H200 / EPYC data."""

from __future__ import annotations

import pytest

from hearthside.kernels.anomalies import find_anomalies, pcie_gb_s, spec_value
from tests.kernels.reports import cpu_measurements, h200_machine, measured

pytestmark = pytest.mark.beside


def healthy_h200() -> list:
    return [
        measured("memory_read", "cuda:0", 4150.0, gpu="NVIDIA H200", array_bytes=2**30),
        measured(
            "matmul",
            "cuda:0",
            640_000.0,
            "GFLOP/s",
            gpu="NVIDIA H200",
            library="torch",
            dtype="bf16",
            m=512,
            n=8192,
            k=8192,
        ),
        measured(
            "matmul",
            "cuda:0",
            1_900.0,
            "GFLOP/s",
            gpu="NVIDIA H200",
            library="torch",
            dtype="bf16",
            m=1,
            n=8192,
            k=8192,
        ),
        measured(
            "h2d",
            "cuda:0",
            53.0,
            gpu="NVIDIA H200",
            pinned=True,
            pcie_width_now=16,
            pcie_width_max=16,
            pcie_generation_max=5,
            pcie_generation_now=5,
        ),
    ]


def test_spec_values_come_from_the_catalog_the_probe_and_the_link() -> None:
    machine = h200_machine()
    read, gemm, gemv, h2d = healthy_h200()
    assert spec_value(read, machine) == pytest.approx(4800.0)
    assert spec_value(gemm, machine) == pytest.approx(989_400.0)  # bf16 dense tensor peak
    assert spec_value(gemv, machine) is None  # a GEMV is memory-bound: no FLOP spec applies
    assert spec_value(h2d, machine) == pytest.approx(pcie_gb_s(5, 16)) == pytest.approx(63.0, 0.01)
    cpu_read = cpu_measurements()[0]
    assert spec_value(cpu_read, machine) is None  # no DIMM figure known: none invented


def test_a_healthy_machine_raises_no_flags() -> None:
    assert find_anomalies(healthy_h200() + cpu_measurements(), h200_machine()) == ()


def test_gpu_memory_far_under_spec_is_flagged() -> None:
    slow = [measured("memory_read", "cuda:0", 2000.0, gpu="NVIDIA H200")]
    (flag,) = find_anomalies(slow, h200_machine())
    assert "cuda:0 reads its memory at 2000 GB/s, 42% of the 4800 GB/s spec" in flag


def test_a_narrow_pcie_link_and_slow_pinned_copies_are_flagged() -> None:
    narrow = measured(
        "h2d",
        "cuda:0",
        13.1,
        gpu="NVIDIA H200",
        pinned=True,
        pcie_width_now=4,
        pcie_width_max=16,
        pcie_generation_max=5,
        pcie_generation_now=5,
    )
    flags = find_anomalies([narrow], h200_machine())
    assert any("PCIe link at x4 although it supports x16" in flag for flag in flags)
    assert any("13.1 GB/s, 21% of its PCIe link's 63.0 GB/s" in flag for flag in flags)


def test_cpu_bandwidth_under_a_known_memory_spec_is_flagged() -> None:
    machine = {**h200_machine(), "memory_bandwidth_gb_s": 204.8}  # 8 channels DDR5-3200
    flags = find_anomalies(cpu_measurements(), machine)
    assert any("The CPU reads memory at 14.9 GB/s at best, 7% of the 205 GB/s" in f for f in flags)


def test_bandwidth_that_falls_with_more_threads_and_noisy_runs_are_flagged() -> None:
    measurements = [
        measured("memory_copy", "cpu", 19.5, threads=1),
        measured("memory_copy", "cpu", 10.8, threads=2, spread=0.4),
    ]
    first, second = find_anomalies(measurements, h200_machine())
    assert first.startswith("CPU copy bandwidth fell from 19.5 GB/s on 1 thread to 10.8 GB/s")
    assert second.startswith("1 of 2 measurements varied by more than 15%")


def test_a_disk_read_served_from_memory_is_flagged() -> None:
    tmpfs = measured("disk_read", "disk:tmpfs", 9.0, cached_fraction_before=1.0)
    (flag,) = find_anomalies([tmpfs], h200_machine())
    assert flag.startswith("The disk read on disk:tmpfs came from memory")


def test_other_programs_are_named_only_when_they_used_the_cpus() -> None:
    quiet = find_anomalies([], {}, others_cores=0.007, counted_cores=2)
    assert not any("Other programs" in flag for flag in quiet)
    (flag,) = find_anomalies([], {}, others_cores=1.009, counted_cores=2)
    assert flag == (
        "Other programs kept 1.0 of 2 cores busy while measuring: the figures may be low; "
        "measure again when the computer is idle."
    )
