"""Calibration figures for the planner: what the kernels measured on this machine.

`hearthside calibrate` stores its report in the autotune DB under the machine's fingerprint
(and as `calibration.json`); the planner reads the latest one back as the few numbers its
speed model needs. A report measured on other hardware never applies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearthside.autotune.fingerprint import machine_fingerprint, machine_identity
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.engine_run import (
    OVERHEAD_PROBE,
    PREFILL_WEIGHTS,
    READ_BYTES,
    per_token_work,
    work_by_type,
)
from hearthside.kernels.results import CalibrationReport

GB = 1e9
F32_BYTES = 4
# A residual that would need the kernels to beat the measured bandwidth or GEMM by this much
# is noise in the measurements, not a property of a weight type.
MAX_PLAUSIBLE_EFFICIENCY = 1.0
# No quant type's kernels are several times slower per byte than the shipped model's mix
# (K-quants measured ~0.8x of Q8_0 here); a probe that slow was starved of CPU by other
# programs (llama.cpp's spinning threads collapse when a core is taken), so it is dropped and
# its type falls back to the nearest measured one.
MIN_RELATIVE_EFFICIENCY = 1 / 3


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
    return planner_figures(CalibrationReport.from_dict(stored))


def planner_figures(report: CalibrationReport) -> dict[str, float]:
    """cpu_read_bytes_per_s (all threads), cpu_flops (the best fp32 GEMM),
    disk_read_bytes_per_s (cold) and the engine's costs against them (`engine_efficiency`),
    from whatever the report measured successfully."""
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
    figures.update(engine_efficiency(report, figures))
    return figures


def engine_efficiency(report: CalibrationReport, figures: dict[str, float]) -> dict[str, float]:
    """How llama.cpp's CPU speed relates to the raw bandwidth and compute, fitted from the
    calibration's engine runs (see `kernels/engine_run.py`):

    - decode_overhead_s_per_layer: the tiny probe's time per token and layer, less what its
      logits cost to write and copy (it reads almost no weights);
    - decode_efficiency:<type> / prefill_efficiency:<type>: the share of the RAM bandwidth
      (decode) or of the best fp32 GEMM (prefill) the kernels for that weight type reach,
      from the one-type probes; the shipped model's own types that no probe covered share the
      factor that explains the rest of its measured time;
    - decode_efficiency / prefill_efficiency: the shipped model's whole run, the fallback for
      types no run covered.
    """
    runs = _engine_runs(report)
    bandwidth, flops = figures.get("cpu_read_bytes_per_s"), figures.get("cpu_flops")
    fitted: dict[str, float] = {}
    if bandwidth:
        fitted.update(_fit_decode(runs, bandwidth))
    if flops:
        fitted.update(_fit_prefill(runs, flops))
    return fitted


@dataclass(frozen=True)
class _EngineRun:
    probe: str | None  # None for the shipped model
    work: dict[str, Any]  # n_layers, n_vocab, and {type: amount} for READ_BYTES and
    # PREFILL_WEIGHTS (kernels.engine_run.per_token_work)
    decode_tps: float | None
    prefill_tps: float | None


def _engine_runs(report: CalibrationReport) -> list[_EngineRun]:
    """The CPU engine runs, one per model, each with what a token of it reads and computes."""
    by_model: dict[str, dict[str, Any]] = {}
    for measurement in report.measured("engine_decode", "cpu") + report.measured(
        "engine_prefill", "cpu"
    ):
        key = str(measurement.params.get("probe") or measurement.params.get("model_path"))
        entry = by_model.setdefault(key, {"params": measurement.params})
        entry[measurement.kind] = measurement.value
    runs = []
    for entry in by_model.values():
        params = entry["params"]
        if "n_layers" not in params:  # a report from before the work was recorded
            params = {**params, **_work_from_file(params.get("model_path"))}
        if "n_layers" not in params:
            continue
        work = {
            "n_layers": params["n_layers"],
            "n_vocab": params.get("n_vocab", 0),
            READ_BYTES: work_by_type(params, READ_BYTES),
            PREFILL_WEIGHTS: work_by_type(params, PREFILL_WEIGHTS),
        }
        runs.append(
            _EngineRun(
                params.get("probe"), work, entry.get("engine_decode"), entry.get("engine_prefill")
            )
        )
    return runs


def _work_from_file(model_path: object) -> dict[str, int]:
    """What a token of the model costs, read from its file if it is still there."""
    path = Path(str(model_path or ""))
    return per_token_work(validate_gguf(path)) if path.is_file() else {}


def logits_seconds(n_vocab: int, bandwidth: float) -> float:
    """Each token's logits are written by llama.cpp and copied once by llama-cpp-python."""
    return 2 * n_vocab * F32_BYTES / bandwidth


def _fit_decode(runs: list[_EngineRun], bandwidth: float) -> dict[str, float]:
    fitted: dict[str, float] = {}
    overhead = next((r for r in runs if r.probe == OVERHEAD_PROBE and r.decode_tps), None)
    per_layer = 0.0
    if overhead is not None and overhead.decode_tps:
        work = overhead.work
        spare = 1 / overhead.decode_tps - logits_seconds(work["n_vocab"], bandwidth)
        per_layer = max(0.0, spare / max(1, work["n_layers"]))
        fitted["decode_overhead_s_per_layer"] = per_layer

    def weight_seconds(run: _EngineRun) -> float:
        assert run.decode_tps
        fixed = per_layer * run.work["n_layers"] + logits_seconds(run.work["n_vocab"], bandwidth)
        return max(1 / run.decode_tps - fixed, 0.1 / run.decode_tps)

    return fitted | _fit_by_type(
        runs, "decode", READ_BYTES, weight_seconds, lambda amount: amount / bandwidth
    )


def _fit_prefill(runs: list[_EngineRun], flops: float) -> dict[str, float]:
    def seconds(run: _EngineRun) -> float:
        assert run.prefill_tps
        return 1 / run.prefill_tps

    return _fit_by_type(
        runs, "prefill", PREFILL_WEIGHTS, seconds, lambda weights: 2 * weights / flops
    )


def _fit_by_type(
    runs: list[_EngineRun],
    kind: str,
    work_key: str,
    seconds_of: Callable[[_EngineRun], float],
    ideal_seconds: Callable[[float], float],
) -> dict[str, float]:
    """efficiency = ideal seconds / measured seconds, per weight type: first from the runs of
    one type, then one shared factor for the types the shipped model alone has."""
    speed = f"{kind}_tps"
    usable = [
        r for r in runs if r.probe != OVERHEAD_PROBE and getattr(r, speed) and r.work[work_key]
    ]
    shipped = next((r for r in usable if r.probe is None), None)
    overall = None
    if shipped is not None:
        overall = ideal_seconds(sum(shipped.work[work_key].values())) / seconds_of(shipped)
    fitted: dict[str, float] = {}
    for run in usable:
        amounts = run.work[work_key]
        if len(amounts) == 1:
            ((type_name, amount),) = amounts.items()
            efficiency = ideal_seconds(amount) / seconds_of(run)
            if overall is None or efficiency >= overall * MIN_RELATIVE_EFFICIENCY:
                fitted[f"{kind}_efficiency:{type_name}"] = efficiency
    if shipped is None or overall is None:
        return fitted
    amounts = shipped.work[work_key]
    total = seconds_of(shipped)
    fitted[f"{kind}_efficiency"] = overall
    known = {t: fitted.get(f"{kind}_efficiency:{t}") for t in amounts}
    left = total - sum(ideal_seconds(amounts[t]) / e for t, e in known.items() if e)
    unknown = [t for t, e in known.items() if not e]
    if not unknown or left <= 0:
        return fitted
    share = ideal_seconds(sum(amounts[t] for t in unknown)) / left
    if share <= MAX_PLAUSIBLE_EFFICIENCY:  # faster than the hardware: noise, not a cost
        for type_name in unknown:
            fitted[f"{kind}_efficiency:{type_name}"] = share
    return fitted


def describe_figures(figures: dict[str, Any]) -> str:
    parts = []
    if "cpu_read_bytes_per_s" in figures:
        parts.append(f"RAM {figures['cpu_read_bytes_per_s'] / GB:.1f} GB/s")
    if "cpu_flops" in figures:
        parts.append(f"CPU {figures['cpu_flops'] / GB:.0f} GFLOP/s")
    if "disk_read_bytes_per_s" in figures:
        parts.append(f"disk {figures['disk_read_bytes_per_s'] / GB:.1f} GB/s")
    return ", ".join(parts) or "not calibrated"
