"""Decode beside a busy program: threads that make way vs threads that stay (issue 32).

A desktop is rarely idle. On a 2-core VM with another program busy, native llama-bench decoded
SmolLM2 Q8_0 at 6 tok/s with 2 threads and 35 with 1: one of llama.cpp's threads on a core
another program holds stalls the others at every layer. The engine's `ThreadGovernor`
(`core/engine/thread_governor.py`) sets a reply's threads to the cores other programs leave.

Two engines load the same file with one thread per usable core: one governed (as every chat
and API reply is), one with the governor off (the threads the settings name, always). Each
round, in an order reversed every other round, both write the same greedy reply twice: beside
busy programs started by the benchmark (one busy loop per core but one), and with those
stopped. The decode rate is the engine's own (tokens after the first / their time).

    .venv/bin/python benchmarks/busy_threads.py [--rounds 5] [--tokens 96] [--model FILE]

Targets: beside the busy programs the governed engine decodes >= 1.3x the fixed one; on the
quiet machine >= 0.97x (it must cost nothing when nobody is busy). Exit status 1 on a miss.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _targets import Target, report  # noqa: E402

from hearthside.core.engine.config import EngineConfig, SamplingParams  # noqa: E402
from hearthside.core.engine.engine import ChatMessage, Engine  # noqa: E402
from hearthside.core.engine.thread_governor import usable_cores  # noqa: E402
from hearthside.core.models.default_model import cached_default_model_file  # noqa: E402

BUSY_OVER_FIXED = 1.3
QUIET_OVER_FIXED = 0.97
SETTLE_S = 1.0  # the busy programs' start, before a reply is timed
QUESTION = [ChatMessage("user", "Count from one to forty in words.")]


@dataclass(frozen=True)
class Round:
    busy_governed: float
    busy_fixed: float
    quiet_governed: float
    quiet_fixed: float
    busy_threads: int  # the governed engine's decode threads at the end of its busy reply


def targets(rounds: Sequence[Round]) -> list[Target]:
    busy = statistics.median(r.busy_governed / r.busy_fixed for r in rounds)
    quiet = statistics.median(r.quiet_governed / r.quiet_fixed for r in rounds)
    return [
        Target("beside busy programs: governed / fixed decode", busy, BUSY_OVER_FIXED),
        Target("quiet machine: governed / fixed decode", quiet, QUIET_OVER_FIXED),
    ]


@contextmanager
def busy_programs(count: int) -> Iterator[None]:
    started = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        time.sleep(SETTLE_S)
        yield
    finally:
        for process in started:
            process.kill()
            process.wait()


def decode_rate(engine: Engine, tokens: int) -> float:
    engine.clear_cache()
    result = engine.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=tokens))
    return result.metrics.decode_tok_s or 0.0


def one_round(governed: Engine, fixed: Engine, tokens: int, flip: bool) -> Round:
    order = (fixed, governed) if flip else (governed, fixed)
    rates: dict[tuple[str, int], float] = {}
    with busy_programs(usable_cores() - 1):
        for engine in order:
            rates["busy", id(engine)] = decode_rate(engine, tokens)
        busy_threads = governed.threads.current[0]
    time.sleep(SETTLE_S)
    for engine in order:
        rates["quiet", id(engine)] = decode_rate(engine, tokens)
    return Round(
        rates["busy", id(governed)],
        rates["busy", id(fixed)],
        rates["quiet", id(governed)],
        rates["quiet", id(fixed)],
        busy_threads,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args(argv)
    cores = usable_cores()
    if cores < 2:
        print("one usable core: there is no core to make way with")
        return 0
    path = args.model or cached_default_model_file()
    config = EngineConfig(str(path), n_ctx=1024, n_threads=cores, n_threads_batch=cores)
    print(f"model {path.name}; {cores} usable cores; {cores - 1} busy loop(s) in busy phases")
    print(f"both engines: {config.decode_threads} decode / {config.batch_threads} prompt threads")
    governed, fixed = Engine(config), Engine(config)
    fixed.threads.enabled = False
    rounds = []
    try:
        for index in range(args.rounds):
            round_ = one_round(governed, fixed, args.tokens, flip=index % 2 == 1)
            rounds.append(round_)
            print(
                f"round {index + 1}: busy governed {round_.busy_governed:.1f} "
                f"({round_.busy_threads} thread(s)) vs fixed {round_.busy_fixed:.1f} tok/s; "
                f"quiet governed {round_.quiet_governed:.1f} vs fixed {round_.quiet_fixed:.1f}"
            )
    finally:
        governed.close()
        fixed.close()
    return report(targets(rounds))


if __name__ == "__main__":
    sys.exit(main())
