"""A llama-bench-style measurement: prompt processing (ppN) and token generation (tgN).

Like llama-bench, it times llama_decode on random tokens (no tokenizing, no sampling), warms
up first, repeats, and reports the median with the spread, plus the exact config that ran.
Warm-up is by time, not by count, so a cold page cache or a clocking-up CPU settles first.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hearthside.core.engine.engine import Engine, engine_version
from hearthside.core.errors import ContextOverflowError

ProgressCallback = Callable[[str, int, int], None]  # (test name, repetition done, of total)


@dataclass(frozen=True)
class BenchStat:
    test: str  # "pp512" or "tg128"
    n_tokens: int
    median_tok_s: float
    stdev_tok_s: float
    samples_tok_s: tuple[float, ...]


@dataclass(frozen=True)
class BenchReport:
    model: str
    engine_version: str
    repetitions: int
    warmup_s: float
    config: dict[str, Any]
    results: tuple[BenchStat, ...]
    schema: int = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stat(self, test: str) -> BenchStat:
        return next(result for result in self.results if result.test == test)


def run_bench(
    engine: Engine,
    *,
    n_prompt: int = 512,
    n_gen: int = 128,
    repetitions: int = 5,
    warmup_s: float = 1.0,
    progress: ProgressCallback | None = None,
) -> BenchReport:
    """Measure ppN and tgN on `engine`, `repetitions` times each after a timed warm-up."""
    needed = max(n_prompt, n_gen + 1)
    if needed > engine.n_ctx:
        raise ContextOverflowError(
            f"The benchmark needs {needed} tokens of context; "
            f"the model is loaded with {engine.n_ctx}.",
            hint="Pass a larger --ctx or smaller -p/-n.",
        )
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, engine.n_vocab, size=max(n_prompt, n_gen))]
    tests = []
    if n_prompt > 0:
        tests.append((f"pp{n_prompt}", n_prompt, lambda: engine.time_prefill(tokens[:n_prompt])))
    if n_gen > 0:
        # tgN times N decode steps after one start token, as llama-bench does.
        tests.append((f"tg{n_gen}", n_gen, lambda: engine.time_decode(tokens[: n_gen + 1])))
    results = []
    for name, count, measure in tests:
        _warm_up(measure, warmup_s)
        samples = []
        for repetition in range(repetitions):
            samples.append(count / measure())
            if progress is not None:
                progress(name, repetition + 1, repetitions)
        results.append(_summarise(name, count, samples))
    return BenchReport(
        model=engine.model_path.name,
        engine_version=".".join(map(str, engine_version())),
        repetitions=repetitions,
        warmup_s=warmup_s,
        config=_config_as_run(engine),
        results=tuple(results),
    )


def _config_as_run(engine: Engine) -> dict[str, Any]:
    """The engine settings with defaults resolved (thread counts, the padded context)."""
    config = engine.config.to_dict()
    config["n_threads"] = engine.config.decode_threads
    config["n_threads_batch"] = engine.config.batch_threads
    config["n_ctx"] = engine.n_ctx
    return config


def _warm_up(measure: Callable[[], float], budget_s: float) -> None:
    deadline = time.perf_counter() + budget_s
    measure()
    while time.perf_counter() < deadline:
        measure()


def _summarise(name: str, count: int, samples: list[float]) -> BenchStat:
    return BenchStat(
        test=name,
        n_tokens=count,
        median_tok_s=statistics.median(samples),
        stdev_tok_s=statistics.stdev(samples) if len(samples) > 1 else 0.0,
        samples_tok_s=tuple(samples),
    )
