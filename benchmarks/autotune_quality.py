"""How good is the tuner's pick? Against an exhaustive sweep and against both sets of defaults.

1. Sweep: every combination of the tuner's grid on this machine — decode threads, flash
   attention, physical batch, KV type — on the shipped default model (Q4_K_M), measured with the
   real engine; with `--variants`, also on its Q4_0 and Q8_0 re-quantizations (made locally),
   reported apart: a faster quant is a quality trade, not a tuning win.
2. Tuner: `hearthside tune` on the shipped file (fresh autotune DB, the given budget), which
   chooses within the KLD budget (`autotune/goals.py`).
3. Final: the tuner's pick, the sweep's best, llama.cpp's own defaults (`llama-server -m FILE`:
   physical-core threads, flash attention auto, f16 KV) and llama-cpp-python's `Llama()`
   defaults, all on the shipped file, measured again in alternating rounds, so machine noise
   hits them alike.

    .venv/bin/python benchmarks/autotune_quality.py [--budget-s 60] [--rounds 3] [--variants]
        [--use-my-data]

Decode tok/s is `hearthside bench`'s tgN for every configuration (the same timing for all).
Runs on a fresh data folder (Gemma registered there, a private autotune DB) unless
`--use-my-data`. Targets: tuner pick / sweep best >= 0.95 (decode); tuner pick / llama.cpp
defaults >= 1.0. Exit status 1 on any miss.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import llama_cpp
from _setup import add_data_option, data_home, print_settings
from _targets import Target, report

from hearthside.autotune.goals import KLD_BUDGET, prior_quality
from hearthside.autotune.tuner import QUICK, llama_cpp_defaults, llama_cpp_python_defaults, tune
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.bench import run_bench
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware

VARIANTS = {"Q4_0": 2, "Q8_0": 7}  # llama_ftype values for the locally made variants


def make_variants(shipped: Path, folder: Path) -> dict[str, Path]:
    paths = {"Q4_K_M": shipped}
    for name, ftype in VARIANTS.items():
        target = folder / f"{shipped.stem}-{name}.gguf"
        if not target.exists():
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = ftype
            params.allow_requantize = True
            llama_cpp.llama_model_quantize(str(shipped).encode(), str(target).encode(), params)
        paths[name] = target
    return paths


def sweep_grid(path: Path, profile: HardwareProfile) -> list[EngineConfig]:
    cores = profile.cpu.physical_cores or 1
    logical = profile.cpu.logical_cores or cores
    threads = sorted({1, max(1, cores // 2), cores, logical})
    grid = []
    for count, ubatch, (flash, kv) in itertools.product(
        threads, (128, 256, 512), ((False, "f16"), (True, "f16"), (True, "q8_0"), (True, "q4_0"))
    ):
        grid.append(
            EngineConfig(
                str(path),
                n_ctx=2048,
                n_threads=count,
                n_ubatch=ubatch,
                flash_attn=flash,
                type_k=kv,
                type_v=kv,
            )
        )
    return grid


def decode_speed(config: EngineConfig) -> float:
    engine = Engine(config)
    try:
        report = run_bench(
            engine,
            n_prompt=QUICK.n_prompt,
            n_gen=QUICK.n_gen,
            repetitions=QUICK.repetitions,
            warmup_s=QUICK.warmup_s,
        )
    finally:
        engine.close()
    return report.stat(f"tg{QUICK.n_gen}").median_tok_s


TARGET_OVER_SWEEP_BEST = 0.95
TARGET_OVER_LLAMA_CPP = 1.0


def targets_of(summary: dict[str, Any]) -> list[Target]:
    return [
        Target("decode, tuner pick / sweep best", summary["tuner_over_sweep_best"],
               TARGET_OVER_SWEEP_BEST),
        Target("decode, tuner pick / llama.cpp defaults", summary["tuner_over_llama_cpp_defaults"],
               TARGET_OVER_LLAMA_CPP),
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=60.0, help="tuner budget per variant")
    parser.add_argument("--rounds", type=int, default=3, help="alternating final rounds")
    parser.add_argument("--model", type=Path, default=None, help="the shipped model's GGUF")
    parser.add_argument("--variants", action="store_true", help="sweep Q4_0 and Q8_0 too")
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    with data_home(args.use_my_data) as home:
        print(home.describe(), file=sys.stderr)
        return run(args, args.model or home.gemma_model())


def run(args: argparse.Namespace, shipped: Path) -> int:
    folder = Path(tempfile.mkdtemp(prefix="hearthside-autotune-"))
    print_settings(
        "runs",
        {
            "model": str(shipped),
            "tuner budget s": args.budget_s,
            "final rounds": args.rounds,
            "variants": "Q4_0, Q8_0" if args.variants else "none",
            "decode timing": f"bench tg{QUICK.n_gen}, median of {QUICK.repetitions}, after "
            f"{QUICK.warmup_s} s warm-up",
        },
    )
    variants = make_variants(shipped, folder) if args.variants else {"Q4_K_M": shipped}
    profile = probe_hardware()

    sweep = []
    for name, path in variants.items():
        for config in sweep_grid(path, profile):
            sweep.append((decode_speed(config), name, config))
            _say(f"sweep {name} {_short(config)}: {sweep[-1][0]:.1f} tok/s")
    # like for like: the shipped file, and a KV cache the tuner may choose (within the budget)
    comparable = [
        item
        for item in sweep
        if item[1] == "Q4_K_M" and prior_quality(item[2].type_k).mean_kld <= KLD_BUDGET
    ]
    sweep_best = max(comparable, key=lambda item: item[0])
    variant_best = {
        name: max(speed for speed, variant, _config in sweep if variant == name)
        for name in variants
    }

    with WisdomDB(folder / "wisdom.db") as wisdom:
        result = tune(shipped, profile, budget_s=args.budget_s, wisdom=wisdom)
    if result.best is None:
        _say("the tuner measured nothing within its budget: raise --budget-s")
        return report([Target("the tuner measured a pick", None, 1.0)])
    tuner_pick = EngineConfig.from_dict({**result.best.config, "model_path": str(shipped)})
    _say(f"tuner: {_short(tuner_pick)} at {result.best.decode_tps or 0:.1f} tok/s")

    # the same settings twice would only measure the machine's noise: their ratio is 1
    same = tuner_pick.to_dict() == sweep_best[2].to_dict()
    finalists = {
        "tuner": tuner_pick,
        "llama.cpp": llama_cpp_defaults(str(shipped), profile, tuner_pick.n_ctx),
        "Llama()": llama_cpp_python_defaults(str(shipped)),
    }
    if not same:
        finalists["sweep_best"] = sweep_best[2]
    speeds: dict[str, list[float]] = {name: [] for name in finalists}
    for round_index in range(args.rounds):
        order = list(finalists) if round_index % 2 == 0 else list(reversed(finalists))
        for name in order:
            speeds[name].append(decode_speed(finalists[name]))
    medians = {name: statistics.median(values) for name, values in speeds.items()}
    if same:
        medians["sweep_best"] = medians["tuner"]
        _say("the tuner picked exactly the sweep's best settings")
    quality = result.quality_of(result.best)
    summary = {
        "tuner_pick": {"config": _short(tuner_pick), "quality": quality.to_dict()},
        "sweep_best": {"config": _short(sweep_best[2])},
        "decode_tok_s": medians,
        "tuner_over_sweep_best": medians["tuner"] / medians["sweep_best"],
        "tuner_over_llama_cpp_defaults": medians["tuner"] / medians["llama.cpp"],
        "tuner_over_llama_cpp_python_defaults": medians["tuner"] / medians["Llama()"],
        "best_per_variant_tok_s": variant_best,
        "sweep_size": len(sweep),
    }
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"sweep: {len(sweep)} settings; best on Q4_K_M {_short(sweep_best[2])}")
        print(f"tuner: {_short(tuner_pick)}, mean KLD {quality.mean_kld:.4f} ({quality.source})")
        for name, value in medians.items():
            print(f"  {name:10} {value:6.1f} tok/s decode (median of {args.rounds})")
        print(f"tuner / sweep best         = {summary['tuner_over_sweep_best']:.3f}")
        print(f"tuner / llama.cpp defaults = {summary['tuner_over_llama_cpp_defaults']:.3f}")
        print(f"tuner / Llama() defaults   = {summary['tuner_over_llama_cpp_python_defaults']:.3f}")
        if len(variant_best) > 1:
            print("best decode per quant (a quality trade, measure it with `hearthside quality`):")
            for name, value in variant_best.items():
                print(f"  {name:7} {value:6.1f} tok/s")
    return report(targets_of(summary), sys.stderr if args.json else sys.stdout)


def _short(config: EngineConfig) -> str:
    return (
        f"threads={config.n_threads} ubatch={config.n_ubatch} "
        f"flash={'on' if config.flash_attn else 'off'} kv={config.type_k}"
    )


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
