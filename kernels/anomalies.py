"""Spec-sheet values beside the measurements, and plain-language flags where the two disagree
or the machine behaved oddly.

Both work on a stored report's data (the measurements and the `machine` summary), never on
the live machine, so an old report can be re-read and re-judged. A spec figure is shown only
where one is really known: GPU memory bandwidth and tensor FLOP/s from the probe and the GPU
catalog, PCIe link speed from the link's generation and width, CPU memory bandwidth when the
profile carries one. Nothing is guessed from memory type names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hearthside.core.probe.cpu_use import OTHERS_BUSY_CORES
from hearthside.kernels.measurement import Measurement

# Usable GB/s per lane per direction, after line encoding (PCI-SIG: 8b/10b up to gen 2,
# 128b/130b for gen 3-5, FLIT mode for gen 6).
PCIE_LANE_GB_S = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
GPU_BANDWIDTH_FLOOR = 0.6  # torch's sum reaches 80-90% of HBM/GDDR peak on a healthy card
PCIE_FLOOR = 0.5  # pinned copies reach 70-90% of the link
CPU_BANDWIDTH_FLOOR = 0.5  # numpy threads reach well over half of the DIMMs' peak
MORE_THREADS_FLOOR = 0.9
NOISY_SPREAD = 0.15
GPU_PREFIXES = ("cuda:", "rocm:", "mps")
SPEC_TFLOPS_KEYS = {"fp16": "fp16_tflops", "bf16": "bf16_tflops"}


def pcie_gb_s(generation: int | None, width: int | None) -> float | None:
    if generation is None or width is None or generation not in PCIE_LANE_GB_S:
        return None
    return PCIE_LANE_GB_S[generation] * width


def is_gpu(device: str) -> bool:
    return device.startswith(GPU_PREFIXES)


def gpu_entry(measurement: Measurement, machine: dict[str, Any]) -> dict[str, Any] | None:
    """The machine summary's GPU a measurement ran on: by name, else by device label."""
    gpus: list[dict[str, Any]] = machine.get("gpus") or []
    name = measurement.params.get("gpu")
    by_name = [gpu for gpu in gpus if name and gpu.get("name") == name]
    by_device = [gpu for gpu in by_name or gpus if gpu.get("device") == measurement.device]
    if by_device:
        return by_device[0]
    return by_name[0] if by_name else None


def spec_value(measurement: Measurement, machine: dict[str, Any]) -> float | None:
    """The spec-sheet figure for this measurement, in its unit, when one is known."""
    kind = measurement.kind
    if kind in ("h2d", "d2h"):
        return _pcie_spec(measurement, machine)
    if not is_gpu(measurement.device):
        cpu_spec = machine.get("memory_bandwidth_gb_s")
        return cpu_spec if kind.startswith("memory_") and measurement.device == "cpu" else None
    gpu = gpu_entry(measurement, machine)
    if gpu is None:
        return None
    if kind.startswith("memory_"):
        return gpu.get("memory_bandwidth_gb_s")
    if kind == "matmul" and measurement.params.get("m", 1) > 1:
        key = SPEC_TFLOPS_KEYS.get(str(measurement.params.get("dtype")))
        tflops = gpu.get(key) if key else None
        return tflops * 1000.0 if tflops else None
    return None


def _pcie_spec(measurement: Measurement, machine: dict[str, Any]) -> float | None:
    params = measurement.params
    measured = pcie_gb_s(params.get("pcie_generation_max"), params.get("pcie_width_max"))
    if measured is not None:
        return measured
    gpu = gpu_entry(measurement, machine)
    return gpu.get("pcie_gb_s") if gpu else None


def find_anomalies(
    measurements: Sequence[Measurement],
    machine: dict[str, Any],
    others_cores: float = 0.0,
    counted_cores: int = 1,
) -> tuple[str, ...]:
    """Plain-language flags, most serious first; `others_cores`: how many of the
    `counted_cores` other programs kept busy on average meanwhile (`core/probe/cpu_use.py`)."""
    flags: list[str] = []
    flags += _others_busy(others_cores, counted_cores)
    flags += _below_spec(measurements, machine)
    flags += _narrow_pcie_links(measurements, machine)
    flags += _threads_slow_memory_down(measurements)
    flags += _disk_served_from_memory(measurements)
    flags += _noisy(measurements)
    return tuple(flags)


def _below_spec(measurements: Sequence[Measurement], machine: dict[str, Any]) -> list[str]:
    flags = []
    for m in _ok(measurements):
        spec = spec_value(m, machine)
        if not spec:
            continue
        if m.kind == "memory_read" and is_gpu(m.device) and m.value < GPU_BANDWIDTH_FLOOR * spec:
            flags.append(
                f"{m.device} reads its memory at {m.value:.0f} GB/s, {m.value / spec:.0%} of "
                f"the {spec:.0f} GB/s spec: check its clocks, power limit and other jobs on it."
            )
        elif m.kind == "h2d" and m.params.get("pinned") and m.value < PCIE_FLOOR * spec:
            flags.append(
                f"{m.device} receives pinned host memory at {m.value:.1f} GB/s, "
                f"{m.value / spec:.0%} of its PCIe link's {spec:.1f} GB/s: partial offload "
                "will be slow; check the slot, riser and BIOS link settings."
            )
    flags += _cpu_below_spec(measurements, machine)
    return flags


def _cpu_below_spec(measurements: Sequence[Measurement], machine: dict[str, Any]) -> list[str]:
    spec = machine.get("memory_bandwidth_gb_s")
    reads = [m.value for m in _ok(measurements) if m.kind == "memory_read" and m.device == "cpu"]
    if not spec or not reads or max(reads) >= CPU_BANDWIDTH_FLOOR * spec:
        return []
    return [
        f"The CPU reads memory at {max(reads):.1f} GB/s at best, {max(reads) / spec:.0%} of "
        f"the {spec:.0f} GB/s its memory is rated for: check that every memory channel is "
        "populated and the DIMMs run at their rated speed."
    ]


def _narrow_pcie_links(measurements: Sequence[Measurement], machine: dict[str, Any]) -> list[str]:
    flags = []
    seen = set()
    for m in _ok(measurements):
        now = m.params.get("pcie_width_now")
        if m.kind not in ("h2d", "d2h") or now is None or m.device in seen:
            continue
        gpu = gpu_entry(m, machine) or {}
        most = m.params.get("pcie_width_max") or gpu.get("pcie_width")
        if most and now < most:
            seen.add(m.device)
            flags.append(
                f"{m.device} runs its PCIe link at x{now} although it supports x{most}: "
                "host transfers get a fraction of their speed; check the slot it sits in."
            )
    return flags


def _threads_slow_memory_down(measurements: Sequence[Measurement]) -> list[str]:
    flags = []
    for kind in ("memory_read", "memory_copy", "memory_triad"):
        by_threads = {
            int(m.params["threads"]): m.value
            for m in _ok(measurements)
            if m.kind == kind and m.device == "cpu" and "threads" in m.params
        }
        if len(by_threads) < 2:
            continue
        most = max(by_threads)
        if by_threads[most] < MORE_THREADS_FLOOR * by_threads[1]:
            flags.append(
                f"CPU {kind.removeprefix('memory_')} bandwidth fell from "
                f"{by_threads[1]:.1f} GB/s on 1 thread to {by_threads[most]:.1f} GB/s on "
                f"{most}: the cores share a saturated memory path, or other programs were "
                "busy; more decode threads may not help here."
            )
    return flags


def _disk_served_from_memory(measurements: Sequence[Measurement]) -> list[str]:
    return [
        f"The disk read on {m.device} came from memory, not the drive ({m.note})."
        for m in _ok(measurements)
        if m.kind == "disk_read" and m.params.get("cached_fraction_before", 0.0) > 0.5
    ]


def _others_busy(others_cores: float, cores: int) -> list[str]:
    if others_cores <= OTHERS_BUSY_CORES:
        return []
    return [
        f"Other programs kept {min(others_cores, cores):.1f} of {cores} cores busy while "
        "measuring: the figures may be low; measure again when the computer is idle."
    ]


def _noisy(measurements: Sequence[Measurement]) -> list[str]:
    noisy = [m for m in _ok(measurements) if m.spread > NOISY_SPREAD]
    if not noisy:
        return []
    names = ", ".join(dict.fromkeys(f"{m.kind} ({m.device})" for m in noisy))
    return [
        f"{len(noisy)} of {len(list(_ok(measurements)))} measurements varied by more than "
        f"{NOISY_SPREAD:.0%} between repetitions ({names}): predictions from them are less "
        "certain; measuring again may give steadier figures."
    ]


def _ok(measurements: Iterable[Measurement]) -> list[Measurement]:
    return [m for m in measurements if m.ok]
