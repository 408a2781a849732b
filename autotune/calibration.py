"""Calibration figures for the planner: what the kernels measured on this machine.

`hearthside calibrate` stores its report in the autotune DB under the machine's fingerprint
(and as `calibration.json`); the planner reads the latest one back as the few numbers its
speed model needs. A report measured on other hardware never applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hearthside.autotune.fingerprint import machine_fingerprint, machine_identity
from hearthside.autotune.memory import CPU, estimate_memory, pieces_from_gguf, repacked_types
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.results import CalibrationReport

GB = 1e9


def store_calibration(report: CalibrationReport, profile: HardwareProfile, db: WisdomDB) -> str:
    """Keep `report` under this machine's fingerprint; returns the fingerprint."""
    fingerprint = machine_fingerprint(profile)
    db.note_machine(fingerprint, machine_identity(profile))
    db.save_calibration(fingerprint, report.to_dict())
    return fingerprint


def calibration_for(profile: HardwareProfile, db: WisdomDB) -> dict[str, float]:
    """The planner's calibration figures for this machine ({} when it was never calibrated)."""
    stored = db.latest_calibration(machine_fingerprint(profile))
    if stored is None:
        return {}
    return planner_figures(CalibrationReport.from_dict(stored), profile)


def planner_figures(
    report: CalibrationReport, profile: HardwareProfile | None = None
) -> dict[str, float]:
    """cpu_read_bytes_per_s (all threads), cpu_flops (the best fp32 GEMM),
    disk_read_bytes_per_s (cold) and the engine's efficiency against them, from whatever the
    report measured successfully. `profile` tells which weights this CPU repacks."""
    repacked = repacked_types(profile.cpu.flags, profile.cpu.arch) if profile else frozenset()
    figures: dict[str, float] = {}
    read = report.best("memory_read", "cpu")
    if read is not None:
        figures["cpu_read_bytes_per_s"] = read.value * GB
    gemm = report.best("matmul", "cpu", dtype="fp32", m=512) or report.best("matmul", "cpu")
    if gemm is not None:
        figures["cpu_flops"] = gemm.value * GB
    disk = next((m for m in report.measurements if m.ok and m.kind == "disk_read"), None)
    if disk is not None:
        figures["disk_read_bytes_per_s"] = disk.value * GB
    figures.update(engine_efficiency(report, figures, repacked))
    return figures


def engine_efficiency(
    report: CalibrationReport, figures: dict[str, float], repacked: frozenset[str]
) -> dict[str, float]:
    """How much of the raw bandwidth and compute llama.cpp reached in the calibration's engine
    run: measured tok/s × (bytes read or FLOPs per token) / the kernel's figure."""
    decode = report.best("engine_decode", "cpu")
    prefill = report.best("engine_prefill", "cpu")
    run = decode if decode is not None else prefill
    if run is None:
        return {}
    path = Path(str(run.params.get("model_path", "")))
    if not path.is_file():
        return {}
    spec = spec_from_gguf(path)
    config = EngineConfig(str(path), n_ctx=512)
    pieces = pieces_from_gguf(validate_gguf(path))
    cpu = estimate_memory(spec, config, pieces=pieces, repacked=repacked).device(CPU)
    efficiency: dict[str, float] = {}
    if decode is not None and "cpu_read_bytes_per_s" in figures:
        bytes_per_token = cpu.weights_bytes - cpu.lookup_bytes - cpu.unread_bytes
        efficiency["decode_efficiency"] = (
            decode.value * bytes_per_token / figures["cpu_read_bytes_per_s"]
        )
    if prefill is not None and "cpu_flops" in figures:
        flops_per_token = 2 * (spec.active_params or spec.total_params or 0)
        efficiency["prefill_efficiency"] = prefill.value * flops_per_token / figures["cpu_flops"]
    return efficiency


def describe_figures(figures: dict[str, Any]) -> str:
    parts = []
    if "cpu_read_bytes_per_s" in figures:
        parts.append(f"RAM {figures['cpu_read_bytes_per_s'] / GB:.1f} GB/s")
    if "cpu_flops" in figures:
        parts.append(f"CPU {figures['cpu_flops'] / GB:.0f} GFLOP/s")
    if "disk_read_bytes_per_s" in figures:
        parts.append(f"disk {figures['disk_read_bytes_per_s'] / GB:.1f} GB/s")
    return ", ".join(parts) or "not calibrated"
