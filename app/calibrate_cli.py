"""`hearthside calibrate [--json] [--quick] [--budget-s N] [--model M] [--export FILE]`: measure
what this machine really delivers (memory bandwidth, matmul, host↔GPU transfers, disk, the
engine) through the Optimize flow's `calibrate` (`autotune/optimize.py`), which stores it in the
autotune DB; show it beside the spec-sheet values with any anomalies, and write it to FILE only
when asked."""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

from hearthside.app.progress import ProgressLine
from hearthside.autotune.optimize import (
    CalibrationRequest,
    MeasureUpdate,
    calibrate,
    wisdom_path,
)
from hearthside.core.errors import HearthsideError
from hearthside.core.models.store import DEFAULT_REF, ModelStore, resolve_model_path
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.units import MIB
from hearthside.kernels.anomalies import spec_value
from hearthside.kernels.calibrate import DEFAULT_BUDGET_S, QUICK_BUDGET_S
from hearthside.kernels.measurement import Measurement
from hearthside.kernels.results import CalibrationReport, export_calibration

MIN_BUDGET_S = 1.0


def add_calibrate_parser(subparsers: argparse._SubParsersAction) -> None:
    calibrate = subparsers.add_parser(
        "calibrate", help="measure memory, matmul, disk and engine speed on this machine"
    )
    calibrate.add_argument("--json", action="store_true", help="print only the report as JSON")
    calibrate.add_argument(
        "--quick", action="store_true", help=f"a shorter run (about {QUICK_BUDGET_S:g} s)"
    )
    calibrate.add_argument(
        "--budget-s",
        type=float,
        default=None,
        metavar="N",
        help=f"time limit in seconds (default {DEFAULT_BUDGET_S:g}, {QUICK_BUDGET_S:g} with "
        "--quick)",
    )
    calibrate.add_argument(
        "--model",
        default=DEFAULT_REF,
        help="model for the engine micro-run: an id, a GGUF path, or 'default'",
    )
    calibrate.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the report to FILE as JSON (it is always kept in the autotune database)",
    )
    calibrate.set_defaults(handler=_run_calibrate)


def _run_calibrate(args: argparse.Namespace) -> int:
    if args.budget_s is not None and args.budget_s <= 0:
        raise HearthsideError(
            "The time budget must be more than 0 seconds.", hint="Pass e.g. --budget-s 30."
        )
    export = _export_path(args.export) if args.export is not None else None
    model_path = _model_path(args.model)
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    request = CalibrationRequest(
        profile, model_path, _budget_left_s(args.budget_s, args.quick), quick=args.quick
    )
    with ProgressLine("Calibrating") as line:
        report = calibrate(request, lambda update: _show_progress(line, update))
    if args.json:
        sys.stdout.write(report.to_json() + "\n")
    else:
        print(describe(report))
    print(f"Stored in the autotune database ({wisdom_path()})", file=sys.stderr)
    if export is not None:
        print(f"Exported to {_export(report, export)}", file=sys.stderr)
    return 0


def _export_path(path: Path) -> Path:
    """Checked before measuring, so a typo does not cost a whole calibration."""
    path = path.expanduser()
    if not path.parent.is_dir():
        raise HearthsideError(
            f"There is no folder {path.parent} to export the calibration to.",
            hint="Create it, or pass another --export FILE.",
        )
    if path.is_dir():
        raise HearthsideError(f"{path} is a folder.", hint="Pass a file name, e.g. calib.json.")
    return path


def _export(report: CalibrationReport, path: Path) -> Path:
    try:
        return export_calibration(report, path)
    except OSError as error:
        raise HearthsideError(
            f"The calibration was stored but could not be written to {path} ({error.strerror}).",
            hint="Run `hearthside wisdom export FILE` to share it instead.",
        ) from error


def _show_progress(line: ProgressLine, update: MeasureUpdate) -> None:
    if update.kind == "calibrating":
        line.show(f"{update.fraction or 0:4.0%} {update.text}")
    elif update.kind == "calibrated":
        line.show("100% stored")


def _budget_left_s(budget_s: float | None, quick: bool) -> float:
    """The budget covers the whole command, so what starting Python and finding the model
    took is already spent (a second or two)."""
    total_s = budget_s if budget_s is not None else QUICK_BUDGET_S if quick else DEFAULT_BUDGET_S
    spent_s = max(0.0, time.time() - psutil.Process().create_time())
    return max(MIN_BUDGET_S, total_s - spent_s)


def _model_path(ref: str) -> Path | None:
    """None for "default": the calibration then uses the store's default model if there is
    one, and reports the engine run as not measured otherwise (it installs nothing)."""
    if ref == DEFAULT_REF:
        return None
    with ModelStore(data_dir()) as store:
        return resolve_model_path(store, ref)


def describe(report: CalibrationReport) -> str:
    """The report as a table a person reads at a glance."""
    machine = report.machine
    rows: list[tuple[str, ...]] = [("kind", "device", "params", "value", "spread", "spec")]
    rows += [_row(m, machine) for m in report.measurements if m.ok]
    lines = [f"Calibrated in {report.duration_s:.1f} s ({report.created_at})", ""]
    lines += _table(rows)
    missing = _not_measured(report.measurements)
    if missing:
        lines += ["", "Not measured:"] + [f"  {line}" for line in missing]
    if report.anomalies:
        lines += ["", "Anomalies:"] + [f"  - {flag}" for flag in report.anomalies]
    return "\n".join(lines)


def _row(m: Measurement, machine: dict[str, object]) -> tuple[str, ...]:
    spec = spec_value(m, machine)
    return (
        m.kind,
        m.device,
        describe_params(m),
        f"{m.value:,.1f} {m.unit}",
        f"{m.spread:.0%}",
        f"{spec:,.1f} {m.unit}" if spec else "",
    )


def describe_params(m: Measurement) -> str:
    """The parameters that tell two measurements of one kind apart, in a few words."""
    p = m.params
    if m.kind.startswith("memory_") and "threads" in p:
        return f"{p['threads']} thread{'s' if p['threads'] != 1 else ''}"
    if m.kind == "matmul":
        text = f"{p.get('library', '')} {p.get('dtype', '')} {p.get('m')}x{p.get('n')}x{p.get('k')}"
        if "weights_gb_s" in p:
            text += f", weights {p['weights_gb_s']:.1f} GB/s"
        return text.strip()
    if m.kind in ("h2d", "d2h"):
        return "pinned" if p.get("pinned") else "pageable"
    if m.kind == "disk_read":
        return f"{p.get('file_bytes', 0) // MIB} MiB file, cache dropped"
    # the shipped model's runs at the tuner's other thread counts say their threads
    at = f", {p.get('threads')} thread(s)" if p.get("thread_variant") else ""
    if m.kind == "engine_prefill":
        return f"{p.get('model', '')} pp{p.get('n_prompt', '')}{at}"
    if m.kind == "engine_decode":
        return f"{p.get('model', '')} tg{p.get('n_gen', '')}{at}"
    return ", ".join(f"{name}={value}" for name, value in p.items())


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    right_aligned = {3, 4, 5}
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if column in right_aligned else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _not_measured(measurements: tuple[Measurement, ...]) -> list[str]:
    """One line per reason: "gpu: memory_read, matmul, h2d — no GPU"."""
    by_reason: dict[tuple[str, str], list[str]] = defaultdict(list)
    for m in measurements:
        if not m.ok:
            by_reason[(m.device, m.note)].append(m.kind)
    return [
        f"{device}: {', '.join(dict.fromkeys(kinds))} — {note}"
        for (device, note), kinds in by_reason.items()
    ]
