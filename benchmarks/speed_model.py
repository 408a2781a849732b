"""Predicted against measured speed, after calibrating this machine.

1. Calibrate (the kernels, the shipped model and the speed probes on the engine).
2. For the shipped model's variants (Q4_K_M as shipped; Q8_0, Q4_0, Q2_K made locally) and
   synthetic dense models of ~0.5B and ~1.5B parameters, ask the planner (calibrated) for its
   decode and prefill prediction, then measure the same settings llama-bench style (tg64,
   pp128), all models in interleaved rounds, and compare with the median round.

    .venv/bin/python benchmarks/speed_model.py [--json] [--rounds N] [--save RUN.json]

Target: every prediction within ±20% of the measurement. Decode is compared at an empty
context (`decode_tps_empty_context`), which is what tgN measures. The shipped model is
"in sample" (calibration measures it on every machine); every other row is predicted from
that fit and the calibration's synthetic probes, which are other models.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import llama_cpp
import numpy as np

from hearthside.autotune.calibration import planner_figures
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.planner import plan
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.calibrate import run_calibration
from hearthside.kernels.memory import MemoryArrays, array_bytes_for, measure_memory
from hearthside.kernels.synthetic_model import write_synthetic_gguf

VARIANTS = {"Q8_0": 7, "Q4_0": 2, "Q2_K": 10}  # llama_ftype values
CONTEXT = 2048
TOLERANCE = 0.20
SHIPPED = "gemma-270m Q4_K_M"
N_PROMPT, N_GEN = 128, 64


def quantized(source: Path, folder: Path, name: str, ftype: int) -> Path:
    target = folder / f"{source.stem}-{name}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    llama_cpp.llama_model_quantize(str(source).encode(), str(target).encode(), params)
    return target


def models(shipped: Path, folder: Path) -> dict[str, Path]:
    found = {SHIPPED: shipped}
    for name, ftype in VARIANTS.items():
        found[f"gemma-270m {name}"] = quantized(shipped, folder, name, ftype)
    for shape in ("dense-0.5b", "dense-1.5b"):
        found[f"synthetic {shape} Q4_0"] = write_synthetic_gguf(
            folder / f"{shape}.gguf", shape, "Q4_0"
        )
    return found


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="the shipped model's GGUF")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds to time")
    parser.add_argument(
        "--save", type=Path, default=None, help="write the calibration report and rows as JSON"
    )
    args = parser.parse_args()
    shipped = args.model or _default_model()
    folder = Path(tempfile.mkdtemp(prefix="hearthside-speed-"))
    profile = probe_hardware()
    report = run_calibration(model_path=shipped, profile=profile)
    figures = planner_figures(report)
    _say(f"calibration took {report.duration_s:.1f} s: {figures}")
    predictions, engines = {}, {}
    try:
        for name, path in models(shipped, folder).items():
            pieces = pieces_from_gguf(validate_gguf(path))
            predictions[name] = plan(
                spec_from_gguf(path), profile, n_ctx=CONTEXT, calibration=figures, pieces=pieces
            )
            config = EngineConfig(
                str(path),
                n_ctx=CONTEXT,
                n_threads=predictions[name].config.n_threads,
                flash_attn=predictions[name].config.flash_attn,
            )
            engines[name] = Engine(config)
        ram_before = ram_read_gb_s(profile)
        measured = measure_interleaved(engines, args.rounds)
        ram_after = ram_read_gb_s(profile)
    finally:
        for engine in engines.values():
            engine.close()
    rows = []
    for name, predicted in predictions.items():
        decode, prefill = measured[name]
        rows.append(
            {
                "model": name,
                # the calibration measured the shipped model itself (as on every machine); the
                # others are predicted from its fit and the synthetic probes: out of sample
                "sample": "in" if name == SHIPPED else "out",
                "decode_predicted": round(predicted.speed.decode_tps_empty_context, 1),
                "decode_measured": round(decode, 1),
                "decode_ratio": round(predicted.speed.decode_tps_empty_context / decode, 3),
                "prefill_predicted": round(predicted.speed.prefill_tps, 1),
                "prefill_measured": round(prefill, 1),
                "prefill_ratio": round(predicted.speed.prefill_tps / prefill, 3),
            }
        )
        _say(str(rows[-1]))
    within = all(
        abs(row[key] - 1) <= TOLERANCE for row in rows for key in ("decode_ratio", "prefill_ratio")
    )
    ram = {
        "calibration": round(figures.get("cpu_read_bytes_per_s", 0) / 1e9, 1),
        "before_rounds": round(ram_before, 1),
        "after_rounds": round(ram_after, 1),
    }
    if args.save is not None:
        saved = {"calibration": report.to_dict(), "rows": rows, "ram_read_gb_s": ram}
        args.save.write_text(json.dumps(saved))
    if args.json:
        print(
            json.dumps(
                {
                    "calibration": figures,
                    "rows": rows,
                    "ram_read_gb_s": ram,
                    "within_20_percent": within,
                }
            )
        )
    else:
        print(f"calibration: {report.duration_s:.1f} s")
        print(
            f"RAM read GB/s: {ram['calibration']} in the calibration, {ram['before_rounds']} "
            f"before and {ram['after_rounds']} after the measured rounds (a shared machine's "
            "neighbours change it; every ratio below carries that change)"
        )
        print(
            f"{'model':28} {'sample':>6} {'decode pred/meas':>22} {'ratio':>6} "
            f"{'prefill pred/meas':>22} {'ratio':>6}"
        )
        for row in rows:
            print(
                f"{row['model']:28} {row['sample']:>6} "
                f"{row['decode_predicted']:>10}/{row['decode_measured']:<10} "
                f"{row['decode_ratio']:>6} {row['prefill_predicted']:>10}/"
                f"{row['prefill_measured']:<10} {row['prefill_ratio']:>6}"
            )
        print(f"all within ±20%: {'yes' if within else 'NO'}")
    return 0 if within else 1


def _default_model() -> Path:
    from hearthside.core.models.default_model import ensure_gemma_model
    from hearthside.core.models.store import ModelStore
    from hearthside.core.paths import data_dir

    with ModelStore(data_dir()) as store:
        return ensure_gemma_model(store).path


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
