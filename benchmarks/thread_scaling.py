"""Predicted against measured speed per thread count: does the plan follow the threads?

1. Time the shipped Gemma 3 270M at the tuner's thread counts as calibration does
   (`measure_cpu`'s thread variants) and RAM reads per thread count; with the data folder's
   stored calibration (if any: a fresh data folder has none, `--use-my-data` uses yours)
   these are the planner's figures (`thread_figures`).
2. Measure models at each thread count (decode and prefill threads alike), all in
   interleaved rounds (tg32, pp128, median round): the shipped model (the ratio the scale
   was taken from) and SmolLM2 135M Instruct Q4_1, which the scale was not taken from.
3. Print, per model and thread count, predicted and measured tok/s and the speed at that
   count over the speed at the machine's default count, predicted and measured.

    .venv/bin/python benchmarks/thread_scaling.py [--rounds N] [--budget-s S] [--json]
        [--use-my-data]

No target: it reports figures to read (exit status 0 unless it fails to run).

On a machine other programs share, fewer threads can measure faster than more (llama.cpp's
spinning threads collapse when a core is taken): read the figures with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
from _setup import add_data_option, data_home, print_settings
from _targets import report

from hearthside.autotune.calibration import calibration_for, thread_figures
from hearthside.autotune.planner import evaluate_config
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig, logical_core_count, physical_core_count
from hearthside.core.engine.engine import Engine
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.engine_run import measure_cpu, scanned_thread_counts
from hearthside.kernels.measurement import Budget
from hearthside.kernels.memory import measure_cpu_memory
from hearthside.kernels.results import CalibrationReport

N_PROMPT, N_GEN, CONTEXT = 128, 32, 2048
MEMORY_ARRAY_BYTES = 256 << 20


def thread_report(shipped: Path, counts: tuple[int, ...], budget_s: float) -> CalibrationReport:
    measurements = measure_cpu_memory(
        array_bytes=MEMORY_ARRAY_BYTES, threads=counts, budget=Budget(4.0, 10), warmup_s=0.2
    )
    measurements += measure_cpu(
        shipped, [], quick=False, budget=Budget(budget_s, 1), thread_counts=counts
    )
    return CalibrationReport(1, "", "", {}, tuple(measurements), (), 0.0)


def measure(models: dict[str, Path], counts: tuple[int, ...], rounds: int) -> dict[Any, Any]:
    """Median tg and pp tok/s of every (model, threads), in interleaved rounds."""
    engines = {
        (name, n): Engine(EngineConfig(str(path), n_ctx=CONTEXT, n_threads=n, n_threads_batch=n))
        for name, path in models.items()
        for n in counts
    }
    tokens = [int(t) for t in np.random.default_rng(0).integers(0, 256, N_PROMPT + 1)]
    speeds: dict[Any, dict[str, list[float]]] = {key: {"tg": [], "pp": []} for key in engines}
    try:
        for engine in engines.values():  # warm-up
            engine.time_decode(tokens[:4])
        for _ in range(rounds):
            for key, engine in engines.items():
                speeds[key]["tg"].append(N_GEN / engine.time_decode(tokens[: N_GEN + 1]))
                speeds[key]["pp"].append(N_PROMPT / engine.time_prefill(tokens[:N_PROMPT]))
    finally:
        for engine in engines.values():
            engine.close()
    return {key: {k: statistics.median(v) for k, v in runs.items()} for key, runs in speeds.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=12.0)
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    with data_home(args.use_my_data) as home:
        print(home.describe(), file=sys.stderr)
        run(args, home.gemma_model(), home.default_chat_model())
    return report([], sys.stderr if args.json else sys.stdout)


def run(args: argparse.Namespace, shipped: Path, chat: Path) -> None:
    profile = probe_hardware()
    counts = scanned_thread_counts(physical_core_count(), logical_core_count())
    default = physical_core_count()
    with WisdomDB() as db:
        figures = calibration_for(profile, db)
    print_settings(
        "runs",
        {
            "thread counts": counts,
            "default count": default,
            "context": CONTEXT,
            "timing": f"tg{N_GEN} and pp{N_PROMPT}, median of {args.rounds} interleaved rounds",
            "stored calibration figures": len(figures) or "none",
        },
    )
    figures |= thread_figures(thread_report(shipped, counts, args.budget_s))
    models = {
        "gemma-270m Q4_K_M (scaled from)": shipped,
        "smollm2-135m Q4_1 (held out)": chat,
    }
    measured = measure(models, counts, args.rounds)
    rows = []
    for name, path in models.items():
        spec = spec_from_gguf(path)
        predicted = {
            n: evaluate_config(
                spec,
                profile,
                EngineConfig(str(path), n_ctx=CONTEXT, n_threads=n, n_threads_batch=n),
                figures,
            ).speed
            for n in counts
        }
        for n in counts:
            rows.append(
                {
                    "model": name,
                    "threads": n,
                    "decode_predicted": round(predicted[n].decode_tps_empty_context, 1),
                    "decode_measured": round(measured[(name, n)]["tg"], 1),
                    "decode_vs_default_predicted": round(
                        predicted[n].decode_tps_empty_context
                        / predicted[default].decode_tps_empty_context,
                        3,
                    ),
                    "decode_vs_default_measured": round(
                        measured[(name, n)]["tg"] / measured[(name, default)]["tg"], 3
                    ),
                    "prefill_predicted": round(predicted[n].prefill_tps, 1),
                    "prefill_measured": round(measured[(name, n)]["pp"], 1),
                    "prefill_vs_default_predicted": round(
                        predicted[n].prefill_tps / predicted[default].prefill_tps, 3
                    ),
                    "prefill_vs_default_measured": round(
                        measured[(name, n)]["pp"] / measured[(name, default)]["pp"], 3
                    ),
                }
            )
    scales = {k: round(v, 3) for k, v in figures.items() if "_thread" in k}
    if args.json:
        print(json.dumps({"figures": scales, "rows": rows, "load": os.getloadavg()}, indent=2))
        return
    print(f"thread figures: {scales}; load average {os.getloadavg()[0]:.1f}")
    for row in rows:
        print(
            f"{row['model']:<34} {row['threads']:>2} threads  decode {row['decode_predicted']:>6} "
            f"/ {row['decode_measured']:>6} (x{row['decode_vs_default_predicted']} / "
            f"x{row['decode_vs_default_measured']})  prefill {row['prefill_predicted']:>7} / "
            f"{row['prefill_measured']:>7} (x{row['prefill_vs_default_predicted']} / "
            f"x{row['prefill_vs_default_measured']})"
        )


if __name__ == "__main__":
    sys.exit(main())
