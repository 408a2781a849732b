"""The engine in its worker process against the same engine in this process, side by side.

Two `EngineService`s load the same file with the same settings: one the way the app runs it
(the model in a worker process, text streamed back over a pipe), one with the `Engine` in
this process as before the worker existed. Chat replies alternate between them (who goes
first flips each run), timed as `benchmarks/engine_overhead.py` times them, by the same rule
on both sides (benchmarks/_timing.py): prefill = prompt tokens / (one-token reply done -
request made); decode = (completion tokens - 1) / (last piece's arrival - first piece's),
tokens counted by the job's metrics, never by pieces.
Both are reported as the median ratio of back-to-back pairs. Then the two engines alternate
`--timed-calls` timed decodes (what `hearthside bench`, the tuner and the calibration run:
one request each), and the later half's median ratio is reported: a worker that ran each
request on the thread that took it slowed to ~0.2x from about its 30th call (two OpenMP
teams taking turns on two cores).

    .venv/bin/python benchmarks/worker_overhead.py [--repetitions 9] [--timed-calls 60]
        [--model GGUF] [--use-my-data] [--json]

Runs on a fresh data folder with the default chat model registered there unless
`--use-my-data`. Target: the worker >= 0.98x the in-process engine for decode (issue 18);
prefill and the timed decodes are shown. Exit status 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from _setup import add_data_option, data_home, print_settings
from _targets import Target, report
from _timing import DECODE_RULE, PREFILL_RULE, median_ratio, paired
from engine_overhead import STORY, HearthsideChat, Side, prefill_messages

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import WorkerEngine

TARGET_RATIO = 0.98


def measure(config: EngineConfig, repetitions: int) -> tuple[Side, Side]:
    worker, in_process = Side(), Side()
    with EngineService() as piped, EngineService(engine_factory=Engine) as local:
        piped.load(config).result()
        local.load(config).result()
        ours, theirs = HearthsideChat(piped), HearthsideChat(local)
        for repetition in range(repetitions):
            messages = prefill_messages(repetition)
            flip = repetition % 2 == 1
            paired(
                lambda m=messages: worker.prefill_tok_s.append(ours.prefill(m)),
                lambda m=messages: in_process.prefill_tok_s.append(theirs.prefill(m)),
                flip=flip,
            )
            paired(
                lambda: worker.decode_tok_s.append(ours.decode(STORY)),
                lambda: in_process.decode_tok_s.append(theirs.decode(STORY)),
                flip=flip,
            )
            print(
                f"  run {repetition + 1}/{repetitions}: decode {worker.decode_tok_s[-1]:5.1f} vs "
                f"{in_process.decode_tok_s[-1]:5.1f} tok/s, prefill "
                f"{worker.prefill_tok_s[-1]:6.1f} vs {in_process.prefill_tok_s[-1]:6.1f}",
                file=sys.stderr,
            )
    return worker, in_process


def measure_timed_calls(config: EngineConfig, calls: int) -> tuple[list[float], list[float]]:
    """tok/s of `calls` timed 32-token decodes on a worker and on an in-process engine,
    alternating."""
    tokens = list(range(1, 34))
    worker_tok_s: list[float] = []
    in_process_tok_s: list[float] = []
    worker, in_process = WorkerEngine(config), Engine(config)
    try:
        for call in range(calls):
            paired(
                lambda: worker_tok_s.append(32 / worker.time_decode(tokens)),
                lambda: in_process_tok_s.append(32 / in_process.time_decode(tokens)),
                flip=call % 2 == 1,
            )
    finally:
        worker.close()
        in_process.close()
    return worker_tok_s, in_process_tok_s


def summarise(worker: Side, in_process: Side) -> dict[str, float]:
    return {
        "decode_worker_tok_s": statistics.median(worker.decode_tok_s),
        "decode_in_process_tok_s": statistics.median(in_process.decode_tok_s),
        "decode_ratio": median_ratio(worker.decode_tok_s, in_process.decode_tok_s),
        "prefill_worker_tok_s": statistics.median(worker.prefill_tok_s),
        "prefill_in_process_tok_s": statistics.median(in_process.prefill_tok_s),
        "prefill_ratio": median_ratio(worker.prefill_tok_s, in_process.prefill_tok_s),
    }


def targets_of(summary: dict[str, float]) -> list[Target]:
    return [Target("decode tok/s, worker / in-process", summary["decode_ratio"], TARGET_RATIO)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--timed-calls", type=int, default=60)
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    with data_home(args.use_my_data) as home:
        model = args.model or home.default_chat_model()
        config = EngineConfig(model_path=str(model), n_ctx=2048)
        print(home.describe(), file=out)
        print_settings(
            "both engines (the same file and settings; one in a worker process)",
            {
                **config.to_dict(),
                "decode_threads": config.decode_threads,
                "batch_threads": config.batch_threads,
                "interleaved runs": args.repetitions,
                "timed decode calls": args.timed_calls,
                "prefill timing": PREFILL_RULE,
                "decode timing": DECODE_RULE,
                "timed decodes": "32 tokens / Engine.time_decode's seconds, on both",
                "load average": os.getloadavg(),
            },
            out,
        )
        summary = summarise(*measure(config, args.repetitions))
        if args.timed_calls:
            ours, theirs = measure_timed_calls(config, args.timed_calls)
            later = args.timed_calls // 2
            summary["timed_calls"] = args.timed_calls
            summary["timed_decode_worker_tok_s"] = statistics.median(ours[later:])
            summary["timed_decode_in_process_tok_s"] = statistics.median(theirs[later:])
            summary["timed_decode_ratio"] = median_ratio(ours[later:], theirs[later:])
    if args.json:
        print(json.dumps(summary, indent=2))
    for label in ("decode", "prefill"):
        print(
            f"{label:8} worker {summary[f'{label}_worker_tok_s']:7.1f} tok/s   in-process "
            f"{summary[f'{label}_in_process_tok_s']:7.1f} tok/s   ratio "
            f"{summary[f'{label}_ratio']:.3f}",
            file=out,
        )
    if args.timed_calls:
        print(
            f"timed decodes, calls {args.timed_calls // 2 + 1}-{args.timed_calls}: worker "
            f"{summary['timed_decode_worker_tok_s']:7.1f} tok/s   in-process "
            f"{summary['timed_decode_in_process_tok_s']:7.1f} tok/s   ratio "
            f"{summary['timed_decode_ratio']:.3f}",
            file=out,
        )
    return report(targets_of(summary), out)


if __name__ == "__main__":
    sys.exit(main())
