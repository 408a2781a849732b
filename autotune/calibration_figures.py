"""The planner's figures from a calibration report: the bandwidth, compute and disk speed it
measured, and the share of them llama.cpp's kernels reach, fitted from its engine runs.

Pure, like the planner that reads them: a report comes in, a dict of figures goes out. A
report from before the engine runs recorded their work names only the model file; `work_of`
reads that work back (`calibration.planner_figures` passes a reader of the file), and without
it such a run is left out of the fit. Where reports are kept and which one applies to this
machine is `calibration.py`'s part (the store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hearthside.autotune.cpu_costs import KernelCosts, kernel_costs, last_token_seconds
from hearthside.autotune.memory import repacked_types
from hearthside.core.units import GB
from hearthside.kernels.engine_run import (
    CACHE_PROBE,
    CACHE_PROBE_TYPE,
    LAST_TOKEN_BYTES,
    LAST_TOKEN_ROWS,
    OVERHEAD_PROBE,
    PREFILL_ROWS,
    PREFILL_WEIGHTS,
    PROBE_WIDTHS,
    READ_BYTES,
    READ_ROWS,
    WORK_KEYS,
    work_by_type,
)
from hearthside.kernels.measurement import FASTEST_PARAM, Measurement
from hearthside.kernels.results import CalibrationReport

F32_BYTES = 4
# A probe whose bytes (or weights) went this much slower than the shipped model's was starved
# of CPU (see `_plausible`); K-quants measured ~0.8x of Q8_0 here.
MIN_RELATIVE_EFFICIENCY = 1 / 3
# The planner's figures learned from the tuner's measured runs start with this
# (`calibration.learned_figures`).
LEARNED = "learned_"
# What a token of an engine run's model costs, by its model path ({} when unknown).
WorkOf = Callable[[object], dict[str, Any]]


def no_work(_model_path: object) -> dict[str, Any]:
    return {}


def planner_figures(report: CalibrationReport, work_of: WorkOf = no_work) -> dict[str, float]:
    """cpu_read_bytes_per_s (all threads, at the fastest repetition: `ram_read_rate`),
    cpu_flops (the best fp32 GEMM), disk_read_bytes_per_s (cold) and
    disk_fault_read_bytes_per_s (cold, by page faults), the engine's costs against them
    (`engine_efficiency`) and how its speed follows the thread count (`thread_figures`), from
    whatever the report measured successfully."""
    figures: dict[str, float] = {}
    reads = report.measured("memory_read", "cpu")
    if reads:
        figures["cpu_read_bytes_per_s"] = max(ram_read_rate(read) for read in reads) * GB
    gemm = report.best("matmul", "cpu", dtype="fp32", m=512) or report.best("matmul", "cpu")
    if gemm is not None:
        figures["cpu_flops"] = gemm.value * GB
    disk = next((m for m in report.measurements if m.ok and m.kind == "disk_read"), None)
    if disk is not None:
        figures["disk_read_bytes_per_s"] = disk.value * GB
        if disk.params.get("fault_read_gb_s"):
            figures["disk_fault_read_bytes_per_s"] = float(disk.params["fault_read_gb_s"]) * GB
    figures.update(engine_efficiency(report, figures, work_of))
    figures.update(thread_figures(report))
    return figures


def ram_read_rate(read: Measurement) -> float:
    """A RAM read's GB/s for the planner: its fastest kept repetition, as STREAM reports its
    best rate. Another program only ever slows a pass down, so the fastest is the nearest to
    what RAM delivers a decode: a calibration disturbed by a few minutes of other work read a
    median 24.7 GB/s where quiet ones read 29.5-34.5, and its 8B prediction fell to 0.75x
    llama-bench. A report from before the fastest was kept gives its median."""
    return float(read.params.get(FASTEST_PARAM) or read.value)


def thread_figures(report: CalibrationReport) -> dict[str, float]:
    """How the CPU's speed follows the thread count: "<kind>_threads", the threads the
    shipped model's run (and the probes', fitted above) used for decode or prefill;
    "<kind>_thread_scale:<n>", the shipped model's tok/s at n threads (`measure_cpu`'s thread
    variants) over its tok/s at those; and "cpu_read_bytes_per_s:<n>", the RAM read
    bandwidth with n threads."""
    figures: dict[str, float] = {}
    for read in report.measured("memory_read", "cpu"):
        if threads := read.params.get("threads"):
            key = f"cpu_read_bytes_per_s:{threads}"
            figures[key] = max(figures.get(key, 0.0), ram_read_rate(read) * GB)
    for kind in ("decode", "prefill"):
        runs = [m for m in report.measured(f"engine_{kind}", "cpu") if "probe" not in m.params]
        shipped = next((m for m in runs if not m.params.get("thread_variant")), None)
        if shipped is None or not shipped.params.get("threads") or not shipped.value:
            continue
        reference = int(shipped.params["threads"])
        figures[f"{kind}_threads"] = reference
        for variant in runs:
            threads = int(variant.params.get("threads") or 0)
            same_model = variant.params.get("model_path") == shipped.params.get("model_path")
            if variant.params.get("thread_variant") and same_model and threads != reference:
                figures[f"{kind}_thread_scale:{threads}"] = variant.value / shipped.value
    return figures


def engine_efficiency(
    report: CalibrationReport, figures: dict[str, float], work_of: WorkOf = no_work
) -> dict[str, float]:
    """How llama.cpp's CPU speed relates to the raw bandwidth and compute, fitted from the
    calibration's engine runs (see `kernels/engine_run.py` and `autotune/cpu_costs.py`):

    - decode_efficiency / prefill_efficiency: the shipped model's whole run against the RAM
      bandwidth (decode) or the best fp32 GEMM (prefill), the fallback for GPUs and for a
      calibration without probes;
    - <kind>_efficiency:<type> and <kind>_row_s:<type>: per probed weight type, the share of
      bandwidth or compute its kernels reach per byte or weight, and the seconds each matrix
      row costs on top, fitted over the probes (narrow and wide matrices) by least squares;
    - <kind>_overhead_s_per_layer: the fixed cost per layer and token, mostly from the tiny
      probe; and <kind>_overhead_s_per_layer:<architecture>: the shipped model's own, from
      what its run leaves after its weights' costs (gemma3's extra norms cost ~4x llama's).

    Prefill is fitted per prompt token: what a run's batch cost once (`last_token_seconds`,
    at the decode costs fitted first) is taken off its time before it is shared out.

    The half-size cache probe stays out of the fit: it gives `decode_cache_speedup` (see
    `_cache_figures`).
    """
    runs = _engine_runs(report, work_of)
    bandwidth, flops = figures.get("cpu_read_bytes_per_s"), figures.get("cpu_flops")
    repacked = repacked_types(
        report.machine.get("cpu_flags") or (), report.machine.get("cpu_arch") or ""
    )
    fitted: dict[str, float] = {}
    if bandwidth:
        kind = _Kind(
            "decode",
            READ_BYTES,
            READ_ROWS,
            1 / bandwidth,
            _decode_seconds(bandwidth),
            fixed=("layer", "token"),
        )
        fitted.update(_fit(runs, kind, repacked))
        fitted.update(_cache_figures(runs, fitted, kind, repacked))
    if flops:
        decode = kernel_costs(fitted, "decode", 1 / bandwidth, repacked) if bandwidth else None
        seconds = _prefill_seconds(decode, fitted)
        kind = _Kind("prefill", PREFILL_WEIGHTS, PREFILL_ROWS, 2 / flops, seconds)
        fitted.update(_fit(runs, kind, repacked))
    return fitted


@dataclass(frozen=True)
class _EngineRun:
    probe: str | None  # None for the shipped model
    work: dict[str, Any]  # n_layers, n_vocab, architecture, and {type: amount} for each of
    # kernels.engine_run.WORK_KEYS (per_token_work)
    decode_tps: float | None
    prefill_tps: float | None
    n_prompt: int = 0  # the prefill run's batch


def _engine_runs(report: CalibrationReport, work_of: WorkOf) -> list[_EngineRun]:
    """The CPU engine runs, one per model, each with what a token of it reads and computes."""
    by_model: dict[str, dict[str, Any]] = {}
    for measurement in report.measured("engine_decode", "cpu") + report.measured(
        "engine_prefill", "cpu"
    ):
        if measurement.params.get("thread_variant"):  # other threads: `thread_figures`
            continue
        key = str(measurement.params.get("probe") or measurement.params.get("model_path"))
        entry = by_model.setdefault(key, {"params": measurement.params})
        entry[measurement.kind] = measurement.value
        if measurement.kind == "engine_prefill":
            entry["n_prompt"] = int(measurement.params.get("n_prompt") or 0)
    runs = []
    for entry in by_model.values():
        params = entry["params"]
        if "n_layers" not in params:  # a report from before the work was recorded
            params = {**params, **work_of(params.get("model_path"))}
        if "n_layers" not in params:
            continue
        work: dict[str, Any] = {
            "n_layers": params["n_layers"],
            "n_vocab": params.get("n_vocab", 0),
            "architecture": params.get("architecture", ""),
        }
        work |= {key: work_by_type(params, key) for key in WORK_KEYS}
        runs.append(
            _EngineRun(
                params.get("probe"),
                work,
                entry.get("engine_decode"),
                entry.get("engine_prefill"),
                entry.get("n_prompt", 0),
            )
        )
    return runs


def logits_seconds(n_vocab: int, bandwidth: float) -> float:
    """Each token's logits are written by llama.cpp and copied once by llama-cpp-python."""
    return 2 * n_vocab * F32_BYTES / bandwidth


@dataclass(frozen=True)
class _Kind:
    """Decode or prefill: which work it counts, its ideal seconds per unit (a byte at the RAM
    bandwidth, a weight's two FLOPs at the best GEMM) and a run's seconds per token."""

    name: str
    units: str
    rows: str
    ideal_per_unit: float
    seconds: Callable[[_EngineRun], float | None]
    # the fixed costs fitted: per layer, and for decode per token (one llama_decode call:
    # the graph, the Python binding; ~0.7 ms here, 15% of a 60 MB probe's token)
    fixed: tuple[str, ...] = ("layer",)


def _decode_seconds(bandwidth: float) -> Callable[[_EngineRun], float | None]:
    def seconds(run: _EngineRun) -> float | None:
        if not run.decode_tps:
            return None
        return 1 / run.decode_tps - logits_seconds(run.work["n_vocab"], bandwidth)

    return seconds


def _prefill_seconds(
    decode: KernelCosts | None, figures: dict[str, float]
) -> Callable[[_EngineRun], float | None]:
    def seconds(run: _EngineRun) -> float | None:
        if not run.prefill_tps:
            return None
        if decode is None or not run.n_prompt:  # a report from before batches were costed
            return 1 / run.prefill_tps
        once = last_token_seconds(
            decode, figures, run.work[LAST_TOKEN_BYTES], run.work[LAST_TOKEN_ROWS]
        )
        per_token = 1 / run.prefill_tps - once / run.n_prompt
        return per_token if per_token > 0 else 1 / run.prefill_tps

    return seconds


def _fit(runs: list[_EngineRun], kind: _Kind, repacked: frozenset[str]) -> dict[str, float]:
    shipped = next((r for r in runs if r.probe is None and kind.seconds(r)), None)
    fitted: dict[str, float] = {}
    overall = None
    if shipped is not None:
        overall = _ideal(shipped, kind) / _seconds(shipped, kind)
        fitted[f"{kind.name}_efficiency"] = overall
    probes = [r for r in runs if r.probe not in (None, CACHE_PROBE) and kind.seconds(r)]
    probes = [r for r in probes if _plausible(r, kind, overall)]
    costs, fixed = _least_squares(probes, kind, repacked)
    if not costs.per_unit:
        if shipped is not None:  # no probes: the shipped model's figure for all its types
            for type_name in shipped.work[kind.units]:
                fitted[f"{kind.name}_efficiency:{type_name}"] = overall or 0.0
        return fitted
    for name in kind.fixed:
        fitted[f"{kind.name}_overhead_s_per_{name}"] = fixed.get(name, 0.0)
    for type_name, per_unit in costs.per_unit.items():
        fitted[f"{kind.name}_efficiency:{type_name}"] = kind.ideal_per_unit / per_unit
        fitted[f"{kind.name}_row_s:{type_name}"] = costs.per_row.get(type_name, 0.0)
    if shipped is not None and shipped.work["architecture"]:
        weights = costs.seconds(shipped.work[kind.units], shipped.work[kind.rows])
        left = _seconds(shipped, kind) - weights - fixed.get("token", 0.0)
        key = f"{kind.name}_overhead_s_per_layer:{shipped.work['architecture']}"
        fitted[key] = max(0.0, left / max(1, shipped.work["n_layers"]))
    return fitted


def _cache_figures(
    runs: list[_EngineRun], fitted: dict[str, float], kind: _Kind, repacked: frozenset[str]
) -> dict[str, float]:
    """How much faster decode's weights ran in the half-size cache probe than the costs
    fitted on the full-size probes say ("decode_cache_speedup", 1 where the cache holds
    neither), and the bytes a token of each read ("decode_cache_bytes", "decode_probe_bytes"):
    the planner scales a smaller model's weights' time between the two (`cache_time_share`)."""
    by_name = {run.probe: run for run in runs if kind.seconds(run)}
    small = by_name.get(CACHE_PROBE)
    full = by_name.get(f"{CACHE_PROBE_TYPE}@{PROBE_WIDTHS[0]}")
    costs = kernel_costs(fitted, kind.name, kind.ideal_per_unit, repacked)
    if small is None or full is None or costs.nearest(CACHE_PROBE_TYPE) != CACHE_PROBE_TYPE:
        return {}
    fixed = small.work["n_layers"] * fitted.get(f"{kind.name}_overhead_s_per_layer", 0.0)
    weights_s = _seconds(small, kind) - fixed - fitted.get(f"{kind.name}_overhead_s_per_token", 0.0)
    if weights_s <= 0:
        return {}
    predicted = costs.seconds(small.work[kind.units], small.work[kind.rows])
    return {
        f"{kind.name}_cache_speedup": max(1.0, predicted / weights_s),
        f"{kind.name}_cache_bytes": sum(small.work[kind.units].values()),
        f"{kind.name}_probe_bytes": sum(full.work[kind.units].values()),
    }


def _seconds(run: _EngineRun, kind: _Kind) -> float:
    seconds = kind.seconds(run)
    assert seconds is not None
    return seconds


def _ideal(run: _EngineRun, kind: _Kind) -> float:
    return sum(run.work[kind.units].values()) * kind.ideal_per_unit


def _plausible(run: _EngineRun, kind: _Kind, overall: float | None) -> bool:
    """No quant type's kernels are several times slower per byte than the shipped model's
    mix; a probe that slow was starved of CPU by other programs (llama.cpp's spinning
    threads collapse when a core is taken), so it is left out and its type falls back to the
    nearest measured one."""
    if (run.probe or "").startswith(OVERHEAD_PROBE) or overall is None:
        return True
    return _ideal(run, kind) / _seconds(run, kind) >= overall * MIN_RELATIVE_EFFICIENCY


def _least_squares(
    probes: list[_EngineRun], kind: _Kind, repacked: frozenset[str]
) -> tuple[KernelCosts, dict[str, float]]:
    """Per-type seconds per unit and per row, and the fixed costs (`kind.fixed`), that best
    explain the probes' times. A cost the data make negative (noise, or a type measured at
    one width only) is dropped and the rest refitted; a type left without a per-unit cost is
    dropped."""
    types = sorted({t for run in probes for t in run.work[kind.units]})
    columns = [*kind.fixed] + [f"{what}:{t}" for t in types for what in ("unit", "row")]
    while True:
        kept = {c.split(":", 1)[1] for c in columns if c.startswith("unit:")}
        columns = [c for c in columns if c in kind.fixed or c.split(":", 1)[1] in kept]
        fitted = [run for run in probes if set(run.work[kind.units]) <= kept]
        if not fitted:
            return KernelCosts({}, {}, repacked), {}
        # a row cost needs rows of two lengths: one run of a type cannot tell it from bytes
        once = {t for t in kept if sum(t in run.work[kind.units] for run in fitted) < 2}
        columns = [c for c in columns if c.removeprefix("row:") not in once]
        # relative errors matter, so each probe's equation is scaled by its own time
        scale = np.array([1 / _seconds(run, kind) for run in fitted])
        matrix = np.array([[_column(run, kind, c) for c in columns] for run in fitted])
        solution, *_ = np.linalg.lstsq(matrix * scale[:, None], np.ones(len(fitted)), rcond=None)
        coefficients = dict(zip(columns, (float(x) for x in solution), strict=True))
        negative = {c for c, value in coefficients.items() if value < 0}
        if not negative:
            break
        columns = [c for c in columns if c not in negative]
    per_unit = {c.split(":", 1)[1]: v for c, v in coefficients.items() if c.startswith("unit:")}
    per_row = {c.split(":", 1)[1]: v for c, v in coefficients.items() if c.startswith("row:")}
    fixed = {c: v for c, v in coefficients.items() if c in kind.fixed}
    return KernelCosts(per_unit, per_row, repacked), fixed


def _column(run: _EngineRun, kind: _Kind, column: str) -> float:
    if column == "layer":
        return float(run.work["n_layers"])
    if column == "token":
        return 1.0
    what, type_name = column.split(":", 1)
    return float(run.work[kind.units if what == "unit" else kind.rows].get(type_name, 0))


def describe_figures(figures: dict[str, Any]) -> str:
    parts = []
    if "cpu_read_bytes_per_s" in figures:
        parts.append(f"RAM {figures['cpu_read_bytes_per_s'] / GB:.1f} GB/s")
    if "cpu_flops" in figures:
        parts.append(f"CPU {figures['cpu_flops'] / GB:.0f} GFLOP/s")
    if "disk_read_bytes_per_s" in figures:
        parts.append(f"disk {figures['disk_read_bytes_per_s'] / GB:.1f} GB/s")
    return ", ".join(parts) or "not calibrated"
