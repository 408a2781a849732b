"""The speed-of-light meter against llama.cpp itself (issue 34's acceptance).

The meter says what share of this machine's limit a decode reached: tok/s over the bytes a
token reads at the calibrated RAM bandwidth (autotune/speed_limit.py). Its figure is right
when it matches what llama.cpp's own `llama-bench` measures over the same limit. So:

1. A bandwidth-bound synthetic model is written (by default `dense-1.5b` at Q4_0, ~0.9 GB:
   far more than any L3 cache, and much cheaper than an 8B shape; `--shape llama-3.1-8b`
   for the 8B one).
2. The machine is calibrated (`hearthside calibrate`, ~1 min) in the data folder, unless it
   already has a calibration there (`--use-my-data`) or `--calibration FILE` gives a recorded
   report of this machine (e.g. tests/fixtures/calibration/epyc-2core-speed-model.json on
   the 2-core EPYC VM): a calibration taken while the machine is busy makes every limit low.
3. Rounds, each: `hearthside bench --json` on the model (its `speed_of_light`), then native
   `llama-bench` with the same threads, batch sizes, KV types and flash attention.
4. The meter's share (median over rounds) against llama-bench's median tgN over the same
   limit: within 15%, and the limit must be the bandwidth one.
5. The memory-bandwidth check: llama-bench's tgN over that limit, i.e. the bandwidth
   llama.cpp's own decode implies (bytes a token reads × tok/s) over the RAM bandwidth the
   planner uses, within 0.70-1.10.

    .venv/bin/python benchmarks/speed_of_light.py [--shape dense-1.5b] [--quant Q4_0]
        [--rounds 3] [--repetitions 3] [--n-gen 64] [--threads N] [--llama-bench PATH]
        [--calibration FILE] [--use-my-data] [--json]

llama-bench is the one `../shared/tools/build-native-llama.sh` builds from the llama.cpp that
llama-cpp-python vendors (default ~/.cache/hearthside-native/<version>/build/bin). Both sides
share the machine with whatever else runs on it: the load average is printed with the
figures, and a machine that is busy throughout slows both sides alike. Never in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _setup import DataHome, add_data_option, data_home  # noqa: E402
from _targets import Target, report  # noqa: E402
from native_anchor import default_llama_bench, native_flags  # noqa: E402

from hearthside.core.engine.config import physical_core_count  # noqa: E402

AGREE_WITHIN = 0.15  # the meter's share / llama-bench's share
# llama.cpp's own decode of a bandwidth-bound model, over the limit the planner's calibrated
# RAM bandwidth sets: below 0.70 the planner promises speed llama.cpp never reaches here (the
# 14.9 vs 10.0 GB/s gap it once had); above 1.10 the planner's bandwidth is too low.
NATIVE_SHARE_BOUNDS = (0.70, 1.10)


@dataclass(frozen=True)
class Round:
    meter_share: float  # `hearthside bench`'s speed_of_light share
    hearthside_tps: float
    native_tps: float
    limit_tps: float  # the limit at the tgN's average context, as the meter used it

    @property
    def native_share(self) -> float:
        return self.native_tps / self.limit_tps


def targets(rounds: Sequence[Round], bound: str | None) -> list[Target]:
    """The verdicts, a pure function of the rounds and the bound the meter named."""
    meter = statistics.median(r.meter_share for r in rounds) if rounds else None
    native = statistics.median(r.native_share for r in rounds) if rounds else None
    ratio = meter / native if meter is not None and native else None
    name = "meter's share / llama-bench tg over the same limit"
    bandwidth = "llama-bench tg / the planner's bandwidth limit"
    low, high = NATIVE_SHARE_BOUNDS
    return [
        Target.holds("the model is bound by memory bandwidth", bound == "memory bandwidth"),
        Target(name, ratio, 1 - AGREE_WITHIN),
        Target(name + " ", ratio, 1 + AGREE_WITHIN, "at most"),
        Target(bandwidth, native, low),
        Target(bandwidth + " ", native, high, "at most"),
    ]


def hearthside_bench(model: Path, n_gen: int, threads: int, repetitions: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "hearthside.app.cli", "bench", "--model", str(model)]
    command += ["--json", "-p", "0", "-n", str(n_gen), "-r", str(repetitions)]
    command += ["--threads", str(threads), "--batch-threads", str(threads), "--ctx", "512"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"hearthside bench failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def native_tg(binary: Path, model: Path, config: Mapping[str, Any], n_gen: int, reps: int) -> float:
    command = [str(binary), "-m", str(model), "-p", "0", "-n", str(n_gen), "-r", str(reps)]
    command += ["-o", "json", *native_flags(config)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"llama-bench failed ({' '.join(command)}):\n{done.stderr[-2000:]}")
    row = next(row for row in json.loads(done.stdout) if row["n_prompt"] == 0)
    return float(statistics.median(row.get("samples_ts") or [row["avg_ts"]]))


def calibrate_if_needed(home: DataHome, recorded: Path | None) -> None:
    from hearthside.autotune.calibration import latest_report, store_calibration
    from hearthside.autotune.wisdom import WisdomDB
    from hearthside.core.paths import models_dir
    from hearthside.core.probe.base import ProbeContext
    from hearthside.core.probe.runner import probe_hardware
    from hearthside.kernels.results import CalibrationReport

    profile = probe_hardware(ProbeContext(models_dir=models_dir(home.path)))
    with WisdomDB() as wisdom:
        if recorded is not None:
            data = json.loads(recorded.read_text())
            report_data = data.get("calibration", data)  # speed_model.py's --save, or a report
            store_calibration(CalibrationReport.from_dict(report_data), profile, wisdom)
            print(f"calibration: recorded, from {recorded}", flush=True)
            return
        if latest_report(profile, wisdom) is not None:
            print("calibration: the data folder's own", flush=True)
            return
    model = home.default_chat_model()
    print("calibration: hearthside calibrate …", flush=True)
    command = [sys.executable, "-m", "hearthside.app.cli", "calibrate", "--json"]
    done = subprocess.run(
        [*command, "--model", str(model)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"hearthside calibrate failed:\n{done.stderr[-2000:]}")
    from hearthside.kernels.results import CalibrationReport

    print(calibration_summary(CalibrationReport.from_json(done.stdout)), flush=True)


def calibration_summary(report: Any) -> str:
    """The calibration's RAM bandwidth and whether its own repeats agreed: every prediction
    stands on it, and one run on the EPYC predicted decode 0.64x of what it measured after a
    calibration that read the machine slow."""
    from hearthside.autotune.busy import unsteady_calibration
    from hearthside.autotune.calibration_figures import ram_read_rate

    reads = report.measured("memory_read", "cpu")
    read = max(reads, key=ram_read_rate, default=None)
    bandwidth = (
        f"RAM read {ram_read_rate(read):.1f} GB/s (fastest repetition; median {read.value:.1f})"
        if read is not None
        else "no RAM figure"
    )
    unsteady = unsteady_calibration(report)
    if unsteady is None:
        return f"calibration: {bandwidth}; its repeats agreed"
    return f"calibration: {bandwidth}; UNSTEADY, {unsteady}: every prediction below may read low"


def write_model(shape: str, quant: str, scratch: Path) -> Path:
    from hearthside.kernels.synthetic_model import write_synthetic_gguf

    print(f"writing a synthetic {shape} {quant} model …", flush=True)
    target = scratch / f"{shape}-{quant}.gguf"
    return write_synthetic_gguf(target, shape, quant, name=f"{shape} synthetic")


def measure(args: argparse.Namespace, binary: Path, model: Path) -> tuple[list[Round], dict]:
    rounds, last = [], {}
    for index in range(args.rounds):
        ours = hearthside_bench(model, args.n_gen, args.threads, args.repetitions)
        light = ours["speed_of_light"]
        if light is None:
            raise SystemExit("hearthside bench found no limit: the calibration is missing.")
        native = native_tg(binary, model, ours["config"], args.n_gen, args.repetitions)
        rounds.append(Round(light["share"], light["measured_tps"], native, light["limit_tps"]))
        last = ours
        print(
            f"round {index + 1}: hearthside {light['measured_tps']:.2f} tok/s "
            f"({light['share']:.1%}), llama-bench {native:.2f} tok/s "
            f"({rounds[-1].native_share:.1%}), load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return rounds, last


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="dense-1.5b", help="a synthetic shape (SHAPES)")
    parser.add_argument("--quant", default="Q4_0", help="the synthetic model's quant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repetitions", type=int, default=3, help="runs per side per round")
    parser.add_argument("--n-gen", type=int, default=64, help="tokens per decode run (tgN)")
    parser.add_argument("--threads", type=int, default=physical_core_count())
    parser.add_argument("--llama-bench", type=Path, default=None)
    parser.add_argument("--calibration", type=Path, default=None, help="a recorded report")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    add_data_option(parser)
    args = parser.parse_args(argv)
    binary = args.llama_bench or default_llama_bench()
    if not os.access(binary, os.X_OK):
        raise SystemExit(
            f"llama-bench is not built ({binary}). Build it with "
            "`bash ../shared/tools/build-native-llama.sh` or pass --llama-bench PATH."
        )
    print(f"load average before: {os.getloadavg()}", flush=True)
    with data_home(args.use_my_data) as home, tempfile.TemporaryDirectory() as scratch:
        print(home.describe(), flush=True)
        calibrate_if_needed(home, args.calibration)
        model = write_model(args.shape, args.quant, Path(scratch))
        rounds, last = measure(args, binary, model)
    light = last["speed_of_light"]
    print(f"limit: {light['explanation']}")
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        figures = {"rounds": [asdict(r) for r in rounds], "speed_of_light": light}
        print(json.dumps(figures | {"load_average": os.getloadavg()}, indent=2))
    return report(targets(rounds, light["limit"]["bound"]))


if __name__ == "__main__":
    raise SystemExit(main())
