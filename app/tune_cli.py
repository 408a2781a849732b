"""`hearthside tune MODEL`: measure settings on this machine and keep the fastest.

Each candidate is loaded and measured with the real engine (llama-bench style); every result
is stored in the autotune DB, and the winner becomes the model's default here, unless other
programs were busy (their CPU time while measuring, or the measurements' repetitions
disagreeing): then it says so, stores no default and exits 0 (`autotune/busy.py`). Each run's
quality (mean KL divergence, top-1 agreement and perplexity against the file with an f16 KV
cache) is shown beside its speed, and the goal chooses by both (`autotune/goals.py`). Compared
with llama.cpp's own defaults and llama-cpp-python's, measured the same way, in the same run.
The verdict is the wizard's (`optimize.verdict`): a candidate the budget cut off is "not
measured", never failed, and "the defaults are already the best here" only when every
candidate predicted to beat them was measured.
The model's installed quant variants are measured too, at the best settings found for the file
(f16 KV), with their quality against it; when one wins, it is named as the pick.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Sequence
from dataclasses import asdict
from typing import get_args

from hearthside.app.progress import ProgressLine
from hearthside.autotune.busy import busy_text
from hearthside.autotune.goals import source_text
from hearthside.autotune.optimize import (
    MeasureRequest,
    MeasureUpdate,
    TuneEvent,
    TuneResult,
    VariantRun,
    coverage_text,
    measure,
    tune_costs,
    untested_rivals,
    variant_pick_text,
    variant_text,
    verdict,
    wait_text,
)
from hearthside.autotune.planner import Goal
from hearthside.autotune.records import RunRecord
from hearthside.autotune.speculative import SpeculationDecision, describe
from hearthside.core.models.store import ModelStore, resolve_model_path
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.runner import probe_hardware


def add_tune_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "tune", help="measure settings for a model on this machine and keep the fastest"
    )
    parser.add_argument("model", nargs="?", default="default", help="installed id or .gguf path")
    parser.add_argument(
        "--goal",
        choices=get_args(Goal),
        default="fastest",
        help="fastest (within the quality budget), balanced, quality, or longest-context "
        "(the longest context that fits; chat then loads with it)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=60.0,
        help="the whole run's time: it ends within about this many seconds, what did not "
        "fit said in its notes (default 60)",
    )
    parser.add_argument(
        "--thorough", action="store_true", help="longer measurements (pp512/tg128, 5 repetitions)"
    )
    parser.add_argument("--json", action="store_true", help="print only the result as JSON")
    parser.set_defaults(handler=_run_tune)


# the budgets `tune` names when the one asked for is too short: whole quarter-minutes, to an hour
WAIT_STEP_S, WAIT_MAX_S = 15.0, 3600.0


def _run_tune(args: argparse.Namespace) -> int:
    with ModelStore(data_dir()) as store:
        model_path = resolve_model_path(store, args.model)
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    request = MeasureRequest(
        model_path,
        profile,
        args.goal,
        args.budget_s,
        calibrate=False,
        rigor="thorough" if args.thorough else "quick",
        save_default=True,
    )
    if not args.json:  # the wait and what it measures, before it starts
        costs = tune_costs(
            model_path, profile, args.goal, calibrate_first=False, rigor=request.rigor
        )
        print(wait_text(args.budget_s, costs, step_s=WAIT_STEP_S, max_s=WAIT_MAX_S).text)
    with ProgressLine("Tuning") as line:
        result = measure(request, threading.Event(), lambda update: _show(line, update))
    if result is None:  # only a request without a model or a cancelled one ends so
        return 1
    if args.json:
        sys.stdout.write(json.dumps(result_as_dict(result), indent=1) + "\n")
    else:
        print(describe_result(result))
    # a busy machine is a finding, not a failure: said, and nothing stored
    return 0 if result.best is not None or result.busy is not None else 1


def _show(line: ProgressLine, update: MeasureUpdate) -> None:
    if update.event is not None:
        line.show(_event_text(update.event))


def _event_text(event: TuneEvent) -> str:
    config = event.config
    what = (
        f"{config.get('n_threads')} threads, flash {'on' if config.get('flash_attn') else 'off'}, "
        f"ubatch {config.get('n_ubatch')}, KV {config.get('type_k')}"
    )
    if event.kind == "quality":
        return f"quality: {event.message}"
    if event.kind == "unmeasured":
        return f"[{event.index}/{event.total}] not measured: {what}"
    if event.kind == "confirm":
        return f"measuring again back to back, to confirm the gain: {what}"
    if event.variant:
        what = f"{event.variant} (variant), {what}"
    measured = f" → {event.decode_tps:.1f} tok/s" if event.decode_tps else ""
    note = f" ({event.message})" if event.kind == "measured" and event.message else ""
    return f"[{event.index}/{event.total}] {event.kind}: {what}{measured}{note}"


def result_as_dict(result: TuneResult) -> dict[str, object]:
    return {
        "goal": result.goal,
        "key": result.key.to_dict(),
        "best": _run_dict(result.best, result),
        "baseline": _run_dict(result.baseline, result),
        "llama_cpp_python_defaults": _run_dict(result.python_defaults, result),
        "speedup_over_defaults": result.speedup,
        "speedup_confirmed": result.confirmation is not None,
        "differs_from_defaults_only_in_batch_sizes": result.decode_alike,
        "speedup_may_be_noise_because": result.unconfirmed or None,
        "speedup_over_llama_cpp_python_defaults": result.speedup_over_python_defaults,
        "quality_reference": result.quality.reference if result.quality else None,
        "kld_budget": result.kld_budget,
        "fastest": _run_dict(result.fastest, result),
        "budget_cost": result.budget_cost,
        "capacity_audit": result.audit.to_dict() if result.audit else None,
        "speculation": [decision.to_dict() for decision in result.speculation],
        "notes": [note.to_dict() for note in result.notes],
        "chosen_variant": _variant_dict(result.chosen_variant, result),
        "variants": [_variant_dict(variant, result) for variant in result.variants],
        "runs": [_run_dict(run, result) for run in result.runs],
        "busy": result.busy,  # why other programs seem busy: then nothing was stored
        "verdict": verdict(result)[0],
        # the candidates the budget cut off: neither measured nor failed
        "not_measured": [asdict(candidate) for candidate in result.not_measured],
        "candidates": result.candidates,
    }


def _variant_dict(variant: VariantRun | None, result: TuneResult) -> dict[str, object] | None:
    if variant is None:
        return None
    return {
        "label": variant.label,
        "model_id": variant.model_id,
        "path": variant.path,
        "quality": variant.quality.to_dict(),
        "verdict": variant_text(result, variant),
    }


def _run_dict(run: RunRecord | None, result: TuneResult) -> dict[str, object] | None:
    if run is None:
        return None
    data = asdict(run)
    data.pop("memory", None)
    variant = result.variant_of(run)
    data["variant"] = variant.label if variant is not None else None  # None: the tuned file
    data["model_path"] = variant.path if variant is not None else result.model_path or None
    data["quality"] = result.quality_of(run).to_dict() if run.outcome == "ok" else None
    return data


def describe_result(result: TuneResult) -> str:
    measured = sum(1 for run in result.runs if run.outcome == "ok")
    settings = "setting" if measured == 1 else "settings"
    lines = [f"Measured {measured} {settings} (goal {result.goal})."]
    if result.quality is not None:
        lines.append(
            f"Quality vs {result.quality.reference}: mean KL divergence (budget "
            f"{result.kld_budget}), top-1 agreement."
        )
    for run in sorted(result.runs, key=lambda r: r.decode_tps or 0, reverse=True):
        quality = _quality_text(result, run)
        lines.append(
            f"  {_file_text(run, result)}{_settings_text(run.config)}  {_outcome_text(run)}"
            f"{quality}{_mark(run, result)}"
        )
    lines.extend(_not_measured_lines(result))
    if result.variants:
        lines.append("Quant variants, at the best settings for the tuned file (f16 KV):")
        lines.extend(f"  {variant_text(result, variant)}" for variant in result.variants)
    if result.audit is not None:
        lines.append(f"Context check: {result.audit.message}")
    lines.extend(_speculation_lines(result.speculation))
    if result.notes:
        lines.append("Shortened or skipped (to keep the time budget, or why not):")
        lines.extend(f"  {note.phase}: {note.reason}" for note in result.notes)
    lines.extend(_comparison_lines(result))
    return "\n".join(lines)


def _not_measured_lines(result: TuneResult) -> list[str]:
    cut = result.not_measured
    if not cut:
        return []
    rivals = len(untested_rivals(result))
    some = "1 candidate" if len(cut) == 1 else f"{len(cut)} candidates"
    return [
        f"Not measured (cut off by the time budget, or a stop): {some}, {rivals} of them "
        "predicted about as fast as llama.cpp's defaults or faster."
    ]


def _comparison_lines(result: TuneResult) -> list[str]:
    headline = verdict(result)[0]
    coverage = coverage_text(result)
    lines = [f"{headline}."] + ([f"{coverage}."] if coverage and coverage != headline else [])
    if result.speedup is not None:
        lines.append(f"Chosen settings decode {result.speedup:.2f}x llama.cpp's defaults.")
    if result.decode_alike:
        lines.append(
            "  (they differ only in batch sizes, set for reading a prompt: one run of each "
            "cannot tell their decode speeds apart here, so no gain is claimed)"
        )
    elif result.confirmation is not None:
        lines.append(
            "  (both measured again back to back to confirm it: the smaller gain of the two)"
        )
    elif result.unconfirmed:
        lines.append(
            f"  (measured once each, minutes apart: {result.unconfirmed}, so it may be noise; "
            "a longer budget measures both again back to back)"
        )
    if result.speedup_over_python_defaults is not None:
        lines.append(
            f"  and {result.speedup_over_python_defaults:.2f}x llama-cpp-python's `Llama()` "
            "constructor defaults."
        )
    cost = result.budget_cost
    if cost is not None and cost > 1.0:
        fastest = result.variant_of(result.fastest) if result.fastest else None
        what = f"the {fastest.label} variant" if fastest else "the fastest run's KV cache"
        lines.append(
            f"The quality budget cost {cost - 1:.0%} of decode speed: {what} moved the "
            f"answers more than a mean KLD of {result.kld_budget} (or was not measured)."
        )
    if result.busy is not None:
        lines.append(f"Nothing was stored as a default. {busy_text(result.busy)}")
    elif result.chosen_variant is not None:
        lines.append(variant_pick_text(result))
    elif result.best is not None:
        lines.append("They are now this model's default on this machine.")
    return lines


def _quality_text(result: TuneResult, run: RunRecord) -> str:
    if run.outcome != "ok":
        return ""
    quality = result.quality_of(run)
    if quality.source == "prior":
        return f", KLD ~{quality.mean_kld:.3f} (not measured)"
    if quality.source == "unmeasured":
        return ", quality not measured (counts as over the budget)"
    if quality.source == "family":
        return f", KLD ~{quality.mean_kld:.3f} ({source_text(quality)})"
    agreement = f", top-1 {quality.top1_agreement:.0%}" if quality.top1_agreement else ""
    return f", KLD {quality.mean_kld:.4f}{agreement}"


def _speculation_lines(decisions: Sequence[SpeculationDecision]) -> list[str]:
    if not decisions:
        return []
    lines = ["Speculative decoding, measured per kind of prompt:"]
    for decision in decisions:
        verdict = _speculation_verdict(decision)
        lines.append(f"  {decision.workload:10} {verdict} — {decision.reason}")
    return lines


def _speculation_verdict(decision: SpeculationDecision) -> str:
    if not decision.enabled:
        return "off"
    parts = [describe(decision.chosen)]
    if decision.gain is not None:
        parts.append(f"{decision.gain:.2f}x")
    if decision.acceptance_rate is not None:
        parts.append(f"{decision.acceptance_rate:.0%} accepted")
    return "on (" + ", ".join(parts) + ")"


def _file_text(run: RunRecord, result: TuneResult) -> str:
    variant = result.variant_of(run)
    return f"{variant.label} (variant): " if variant is not None else ""


def _settings_text(config: dict[str, object]) -> str:
    flash = "on " if config.get("flash_attn") else "off"
    return (
        f"threads {config.get('n_threads')}, flash {flash}, ubatch {config.get('n_ubatch')!s:>3},"
        f" KV {config.get('type_k')!s:5}"
    )


def _outcome_text(run: RunRecord) -> str:
    if run.outcome == "timeout":  # cut off by the budget: no failure
        return f"not measured: {run.error}"
    if run.outcome != "ok":
        return f"{run.outcome}: {run.error}"
    return f"{run.decode_tps or 0:6.1f} tok/s decode, {run.prefill_tps or 0:6.0f} tok/s prefill"


def _mark(run: RunRecord, result: TuneResult) -> str:
    chosen = " <- chosen" if run is result.best else ""
    if run is result.baseline:
        return f"{chosen} (llama.cpp defaults)"
    return f"{chosen} (llama-cpp-python defaults)" if run is result.python_defaults else chosen
