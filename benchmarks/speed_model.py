"""Predicted against measured speed, after calibrating this machine: three sets, reported
apart, by how much each one shaped the speed model.

1. Calibrate (the kernels, the shipped model and the speed probes on the engine).
2. (a) The fitted set: what the calibration's fit used or probed: the shipped Gemma 3 270M
   Q4_K_M, its Q8_0 and Q4_0 re-quantizations and synthetic llama models of ~0.5B and ~1.5B
   in Q4_0 (probed types, the probes' architecture).
   (b) The design set: never in the fit, but looked at while the model was designed, so its
   misses shaped it (the cache probe was sized after SmolLM2 was predicted at 0.72-0.77):
   SmolLM2 135M Instruct Q4_1 (the default chat model), Gemma 3 270M re-quantized to IQ4_XS,
   Q5_1 and Q2_K (its 640-wide rows fall back to Q4_0/Q5_0/Q3_K, so a uniform synthetic Q2_K
   model of ~0.5B stands for the type), and synthetic qwen3moe (Q8_0) and gpt-oss (MXFP4).
   (c) The unseen set (`--unseen`), never predicted before this benchmark existed: the models
   people run, in real shapes with random weights: Llama 3.1 8B Q4_K_M (~4.9 GB), Qwen3 30B-A3B
   Q2_K (~11 GB, 128 experts, 8 active) and a DeepSeek-V2-Lite-sized latent-attention MoE
   (28 layers: llama.cpp reads 27 as V2-Lite without query compression)
   (deepseek2, an architecture the model had never predicted) in Q4_0. They are GBs each, so
   each is loaded alone and measured in its own rounds.
3. Each model's types that the calibration did not measure are first predicted "estimated
   from <type>"; then measured on demand (`autotune/type_costs.py`, what
   `hearthside plan --measure-types` runs) and predicted again.
4. Every model is measured llama-bench style (tg64, pp128); sets (a) and (b) in interleaved
   rounds, and each prediction compared with the median round.

    .venv/bin/python benchmarks/speed_model.py [--json] [--rounds N] [--save RUN.json]
        [--probe-mib N] [--no-measure-types] [--use-my-data] [--unseen | --only-unseen]

Runs on a fresh data folder (the calibration stored nowhere of yours) unless `--use-my-data`.
Target: every prediction within ±20% of the measurement, per set, for decode and prefill: the
worst |predicted / measured - 1| at most 0.20; exit status 1 on a miss.
Decode is compared at an empty context (`decode_tps_empty_context`), which is what tgN
measures, and prefill at the 128-token prompt measured (`SpeedEstimate.prefill_tps_at`)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from _setup import add_data_option, data_home, print_settings
from _targets import Target
from _targets import report as report_targets

from hearthside.autotune.calibration import calibration_for, planner_figures, store_calibration
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.planner import (
    Plan,
    describe_machine,
    plan,
    token_work,
    weight_cost_sources,
)
from hearthside.autotune.type_costs import (
    describe_type_cost,
    measure_type_costs,
    model_weight_types,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.errors import HearthsideError
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.calibrate import run_calibration
from hearthside.kernels.memory import MemoryArrays, array_bytes_for, measure_memory
from hearthside.kernels.results import CalibrationReport
from hearthside.kernels.synthetic_model import (
    SHAPES,
    SyntheticShape,
    write_synthetic_gguf,
    write_uniform_gguf,
)

FITTED_VARIANTS = {"Q8_0": 7, "Q4_0": 2}  # llama_ftype values
# IQ4_XS needs no importance matrix (llama.cpp asks one for IQ2_*, IQ1_* and Q2_K_S only)
DESIGN_VARIANTS = {"IQ4_XS": 30, "Q5_1": 9, "Q2_K": 10}
# gpt-oss as it ships, in miniature: MXFP4 weights, alternating window, sinks, 32 experts
GPT_OSS = SyntheticShape(
    "gpt-oss",
    12,
    1024,
    16,
    4,
    1024,
    n_vocab=32000,
    head_dim=64,
    n_expert=32,
    n_expert_used=4,
    n_ff_expert=1024,
    sliding_window=128,
)
MEASURE_TYPES_BUDGET_S = 240.0
CONTEXT = 2048
TOLERANCE = 0.20
SHIPPED = "gemma-270m Q4_K_M"
N_PROMPT, N_GEN = 128, 64
SETS = {
    "fitted": "(a) fitted set: the shipped model, models of the probed types",
    "design": "(b) design set: never fitted, but its misses shaped the model",
    "unseen": "(c) unseen set: real shapes never predicted before (each measured alone)",
}


def quantized(source: Path, folder: Path, name: str, ftype: int) -> Path:
    target = folder / f"{source.stem}-{name}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    return target


def fitted_models(shipped: Path, folder: Path) -> dict[str, Path]:
    found = {SHIPPED: shipped}
    for name, ftype in FITTED_VARIANTS.items():
        found[f"gemma-270m {name}"] = quantized(shipped, folder, name, ftype)
    for shape in ("dense-0.5b", "dense-1.5b"):
        found[f"synthetic {shape} Q4_0"] = write_synthetic_gguf(
            folder / f"{shape}.gguf", shape, "Q4_0"
        )
    return found


def design_models(shipped: Path, chat_model: Path, folder: Path) -> dict[str, Path]:
    found = {"smollm2-135m Q4_1": chat_model}
    for name, ftype in DESIGN_VARIANTS.items():
        found[f"gemma-270m {name}"] = quantized(shipped, folder, name, ftype)
    # Gemma's 640-wide rows do not fill Q2_K's 256-weight blocks: its "Q2_K" holds Q4_0,
    # Q5_0 and Q3_K only, so a uniform Q2_K model stands for the type itself
    found["synthetic dense-0.5b Q2_K"] = write_uniform_gguf(
        folder / "dense-0.5b-q2_k.gguf", SHAPES["dense-0.5b"], "Q2_K"
    )
    found["synthetic qwen3moe-1b Q8_0"] = write_uniform_gguf(
        folder / "qwen3moe.gguf", SHAPES["moe-1b"], "Q8_0"
    )
    found["synthetic gpt-oss MXFP4"] = write_uniform_gguf(folder / "gpt-oss.gguf", GPT_OSS, "MXFP4")
    return found


UNSEEN = {  # name: (shape, quant)
    "llama-3.1-8b Q4_K_M": ("llama-3.1-8b", "Q4_K_M"),
    "qwen3-30b-a3b Q2_K": ("qwen3-30b-a3b", "Q2_K"),
    "deepseek2-16b Q4_0": ("deepseek2-16b", "Q4_0"),
}


def unseen_model(name: str, folder: Path) -> Path:
    shape, quant = UNSEEN[name]
    _say(f"writing {name} (random weights in its real shape) …")
    return write_synthetic_gguf(folder / f"{shape}-{quant}.gguf", shape, quant)


def measured_type_figures(
    report: CalibrationReport,
    profile: HardwareProfile,
    paths: Iterable[Path],
    folder: Path,
    probe_mib: int | None,
) -> dict[str, float]:
    """The calibration's figures with the design models' unmeasured types measured on
    demand, as `hearthside plan --measure-types` would (in a private autotune DB)."""
    types = sorted({t for path in paths for t in model_weight_types(_pieces(path))})
    with WisdomDB(folder / "wisdom.db") as wisdom:
        store_calibration(report, profile, wisdom)
        for cost in measure_type_costs(
            types,
            profile,
            wisdom,
            budget_s=MEASURE_TYPES_BUDGET_S,
            max_probe_bytes=probe_mib << 20 if probe_mib else None,
        ):
            _say(describe_type_cost(cost))
        return calibration_for(profile, wisdom)


def _named(found: dict[str, Path], parts: list[str]) -> dict[str, Path]:
    return {name: path for name, path in found.items() if any(p in name for p in parts)}


def planned(path: Path, profile: HardwareProfile, figures: dict[str, float]) -> Plan:
    return plan(
        spec_from_gguf(path), profile, n_ctx=CONTEXT, calibration=figures, pieces=_pieces(path)
    )


def cost_sources(path: Path, profile: HardwareProfile, result: Plan, figures: dict) -> str:
    """Where each weight type's cost came from: "Q4_1 estimated from Q5_0, Q8_0 measured"."""
    machine = describe_machine(profile, figures)
    work = token_work(spec_from_gguf(path), result.config, machine.gpus, _pieces(path))
    sources = weight_cost_sources(machine, work)
    return ", ".join(f"{t} {source}" for t, source in sources.items()) or "not calibrated"


def _pieces(path: Path) -> list:
    return pieces_from_gguf(validate_gguf(path))


def ram_read_gb_s(profile: HardwareProfile) -> float:
    """RAM read bandwidth on every core now, as the calibration measures it (a few seconds):
    on a shared machine, a neighbour using the memory bus slows every model alike."""
    threads = profile.cpu.logical_cores or 1
    size = array_bytes_for(profile.cpu.l3_cache_bytes, profile.memory.available_bytes, quick=False)
    arrays = MemoryArrays.allocate(size)
    with ThreadPoolExecutor(max_workers=threads) as pool:
        measured = measure_memory("memory_read", arrays, threads, pool, budget_s=2, warmup_s=0.2)
    return measured.value


def measure_interleaved(engines: dict[str, Engine], rounds: int) -> dict[str, tuple[float, float]]:
    """Median tg64 and pp128 tok/s of each model (timed as `hearthside bench` times them), over
    `rounds` rounds in which every model runs once, after one warm-up round: other programs
    on a shared machine come and go within seconds, so each model meets the same ones."""
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 256, size=N_PROMPT + 1)]
    decode: dict[str, list[float]] = {name: [] for name in engines}
    prefill: dict[str, list[float]] = {name: [] for name in engines}
    for done in range(rounds + 1):
        for name, engine in engines.items():
            tg = N_GEN / engine.time_decode(tokens[: N_GEN + 1])
            pp = N_PROMPT / engine.time_prefill(tokens[:N_PROMPT])
            if done:
                decode[name].append(tg)
                prefill[name].append(pp)
        _say(f"round {done} of {rounds} done" if done else "warm-up round done")
    return {
        name: (statistics.median(decode[name]), statistics.median(prefill[name]))
        for name in engines
    }


def targets_of(rows: list[dict[str, Any]]) -> list[Target]:
    """Per set and phase, the worst prediction's distance from its measurement (a set that
    `--only` left empty has no target)."""
    groups = [group for group in SETS if any(r["set"] == group for r in rows)]
    return [
        Target(f"{group} set: worst {kind} |predicted / measured - 1|",
               max(abs(row[f"{kind}_ratio"] - 1) for row in rows if row["set"] == group),
               TOLERANCE, "at most", unit="")
        for group in groups
        for kind in ("decode", "prefill")
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the shipped model's GGUF")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds to time")
    parser.add_argument(
        "--save", type=Path, default=None, help="write the calibration report and rows as JSON"
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        default=None,
        metavar="REPORT.json",
        help="reuse this calibration report if it exists, else calibrate and write it there",
    )
    parser.add_argument(
        "--probe-mib",
        type=int,
        default=None,
        help="the on-demand type probes' weights at most, MiB (default: the calibration's "
        "probe size, as `hearthside plan --measure-types` uses; 64 MiB probes gave Q4_1 costs "
        "1.3x apart in runs minutes apart on a VM whose cache held part of them)",
    )
    parser.add_argument(
        "--only",
        default="",
        metavar="TEXT,...",
        help="run only the models whose names hold one of these (e.g. moe,gpt-oss)",
    )
    parser.add_argument(
        "--no-measure-types",
        action="store_true",
        help="predict the design and unseen models' unmeasured types from the measured ones only",
    )
    parser.add_argument(
        "--unseen",
        action="store_true",
        help="also the unseen set: an 8B, a 30B-A3B MoE and a latent-attention MoE in real "
        "shapes (~25 GB written to a temporary folder, each measured alone; tens of minutes)",
    )
    parser.add_argument(
        "--only-unseen", action="store_true", help="the unseen set alone (after calibrating)"
    )
    add_data_option(parser)
    args = parser.parse_args(argv)
    with data_home(args.use_my_data) as home:
        print(home.describe(), file=sys.stderr)
        return run(args, args.model or home.gemma_model(), home.default_chat_model())


def run(args: argparse.Namespace, shipped: Path, chat_model: Path) -> int:
    print_settings(
        "runs",
        {
            "shipped model": str(shipped),
            "context": CONTEXT,
            "timing": f"tg{N_GEN} and pp{N_PROMPT} ({N_GEN} / Engine.time_decode's seconds, "
            f"{N_PROMPT} / Engine.time_prefill's), median of {args.rounds} interleaved rounds",
            "calibration": str(args.calibration) if args.calibration else "run now",
            "measure types": not args.no_measure_types,
            "only": args.only or "all models",
        },
    )
    folder = Path(tempfile.mkdtemp(prefix="hearthside-speed-"))
    profile = probe_hardware()
    report = _calibration(args.calibration, shipped, profile)
    figures = planner_figures(report)
    _say(f"calibration took {report.duration_s:.1f} s: {figures}")
    fitted, design = {}, {}
    if not args.only_unseen:
        fitted = fitted_models(shipped, folder)
        design = design_models(shipped, chat_model, folder)
    if args.only:
        fitted, design = (_named(found, args.only.split(",")) for found in (fitted, design))
    unseen = list(UNSEEN) if args.unseen or args.only_unseen else []
    rows: list[dict[str, Any]] = []
    engines: dict[str, Engine] = {}
    measured: dict[str, tuple[float, float]] = {}
    try:
        if fitted or design:
            typed = figures
            if not args.no_measure_types:
                typed = measured_type_figures(
                    report, profile, design.values(), folder, args.probe_mib
                )
            for group, found in (("fitted", fitted), ("design", design)):
                for name, path in found.items():
                    rows.append(predicted_row(name, group, path, profile, figures, typed))
                    engines[name] = Engine(measuring_config(path, profile, typed))
        ram_before = ram_read_gb_s(profile)
        if engines:
            measured = measure_interleaved(engines, args.rounds)
    finally:
        for engine in engines.values():
            engine.close()
    unmeasured: list[str] = []
    for name in unseen:
        try:
            rows.append(measure_alone(name, folder, report, profile, figures, args))
        except HearthsideError as exc:  # a GB-sized file that llama.cpp refuses: say, go on
            _say(f"{name}: not measured: {exc.message}")
            unmeasured.append(name)
            continue
        measured[name] = (rows[-1].pop("decode_alone"), rows[-1].pop("prefill_alone"))
        _say(f"{name}: {measured[name][0]:.2f} tok/s decode, {measured[name][1]:.1f} prefill")
    ram_after = ram_read_gb_s(profile)
    for row in rows:
        _compare(row, *measured[row["model"]])
        _say(str(row))
    within = {
        group: all(
            abs(row[key] - 1) <= TOLERANCE
            for row in rows
            if row["set"] == group
            for key in ("decode_ratio", "prefill_ratio")
        )
        for group in SETS
        if any(row["set"] == group for row in rows)
    }
    ram = {
        "calibration": round(figures.get("cpu_read_bytes_per_s", 0) / 1e9, 1),
        "before_rounds": round(ram_before, 1),
        "after_rounds": round(ram_after, 1),
    }
    if args.save is not None:
        saved = {"calibration": report.to_dict(), "rows": rows, "ram_read_gb_s": ram}
        args.save.write_text(json.dumps(saved))
    if args.json:
        document = {
            "calibration": figures,
            "rows": rows,
            "ram_read_gb_s": ram,
            "within_20_percent": within,
        }
        print(json.dumps(document))
    else:
        _print_tables(report, rows, ram, within)
    missed = [Target.holds(f"{name} measured", False) for name in unmeasured]
    return report_targets(targets_of(rows) + missed, sys.stderr if args.json else sys.stdout)


def predicted_row(
    name: str,
    group: str,
    path: Path,
    profile: HardwareProfile,
    figures: dict[str, float],
    typed: dict[str, float],
) -> dict[str, Any]:
    estimated = planned(path, profile, figures)
    result = planned(path, profile, typed)
    return {
        "model": name,
        "set": group,
        "costs": cost_sources(path, profile, result, typed),
        "estimated_costs": cost_sources(path, profile, estimated, figures),
        "decode_predicted": result.speed.decode_tps_empty_context,
        "prefill_predicted": result.speed.prefill_tps_at(N_PROMPT),
        "decode_estimated": estimated.speed.decode_tps_empty_context,
        "prefill_estimated": estimated.speed.prefill_tps_at(N_PROMPT),
    }


def measuring_config(path: Path, profile: HardwareProfile, typed: dict[str, float]) -> EngineConfig:
    result = planned(path, profile, typed)
    return EngineConfig(
        str(path),
        n_ctx=CONTEXT,
        n_threads=result.config.n_threads,
        flash_attn=result.config.flash_attn,
    )


def measure_alone(
    name: str,
    folder: Path,
    report: CalibrationReport,
    profile: HardwareProfile,
    figures: dict[str, float],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """An unseen model: written, its types measured if the calibration lacks them, predicted,
    then loaded alone and measured in its own rounds, and deleted (they are GBs each)."""
    path = unseen_model(name, folder)
    try:
        typed = figures
        if not args.no_measure_types:
            typed = measured_type_figures(report, profile, [path], folder, args.probe_mib)
        row = predicted_row(name, "unseen", path, profile, figures, typed)
        engine = Engine(measuring_config(path, profile, typed))
        try:
            decode, prefill = measure_interleaved({name: engine}, args.rounds)[name]
        finally:
            engine.close()
    finally:
        path.unlink(missing_ok=True)
    return {**row, "decode_alone": decode, "prefill_alone": prefill}


def _compare(row: dict[str, Any], decode: float, prefill: float) -> None:
    row["decode_measured"], row["prefill_measured"] = round(decode, 1), round(prefill, 1)
    for kind, measured in (("decode", decode), ("prefill", prefill)):
        row[f"{kind}_ratio"] = round(row[f"{kind}_predicted"] / measured, 3)
        row[f"{kind}_estimated_ratio"] = round(row[f"{kind}_estimated"] / measured, 3)
        row[f"{kind}_predicted"] = round(row[f"{kind}_predicted"], 1)
        row[f"{kind}_estimated"] = round(row[f"{kind}_estimated"], 1)


def _print_tables(
    report: CalibrationReport,
    rows: list[dict[str, Any]],
    ram: dict[str, float],
    within: dict[str, bool],
) -> None:
    print(f"calibration: {report.duration_s:.1f} s")
    print(
        f"RAM read GB/s: {ram['calibration']} in the calibration, {ram['before_rounds']} "
        f"before and {ram['after_rounds']} after the measured rounds (a shared machine's "
        "neighbours change it; every ratio below carries that change)"
    )
    titles = {group: title for group, title in SETS.items() if group in within}
    for group, title in titles.items():
        print(f"\n{title}")
        print(
            f"{'model':28} {'decode pred/meas':>19} {'ratio':>6} {'prefill pred/meas':>19} "
            f"{'ratio':>6}  {'(before measuring types)':>24}  costs"
        )
        for row in (r for r in rows if r["set"] == group):
            before = (
                f"{row['decode_estimated_ratio']:>6} {row['prefill_estimated_ratio']:>6}"
                if row["estimated_costs"] != row["costs"]
                else ""
            )
            print(
                f"{row['model']:28} {row['decode_predicted']:>8}/{row['decode_measured']:<10}"
                f"{row['decode_ratio']:>6} {row['prefill_predicted']:>8}/"
                f"{row['prefill_measured']:<10}{row['prefill_ratio']:>6}  {before:>24}  "
                f"{row['costs']}" + (f" (before: {row['estimated_costs']})" if before else "")
            )
        print(f"all within ±20%: {'yes' if within[group] else 'NO'}")


def _calibration(saved: Path | None, shipped: Path, profile: HardwareProfile) -> CalibrationReport:
    if saved is not None and saved.is_file():
        return CalibrationReport.from_json(saved.read_text())
    report = run_calibration(model_path=shipped, profile=profile)
    if saved is not None:
        saved.write_text(report.to_json())
    return report


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
