"""A llama-bench-style measurement: prompt processing (ppN) and token generation (tgN).

Like llama-bench, it times llama_decode on random tokens (no tokenizing, no sampling), warms
up first, repeats, and reports the median with the spread, plus the exact config that ran.
Warm-up is by time, not by count, so a cold page cache or a clocking-up CPU settles first.
`hearthside bench` adds the tgN median's share of this machine's limit for the model as loaded
(`speed_of_light`, from autotune/speed_limit.py; None where the machine's bandwidth is unknown).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from hearthside.core.engine.config import SamplingParams, SpeculativeConfig
from hearthside.core.engine.engine import Engine, GenerationResult, engine_version
from hearthside.core.engine.speculative import SpeculationStats, merge_stats
from hearthside.core.engine.worker_engine import LocalEngine
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
    # the decode median against this machine's limit: `SpeedOfLight.to_dict()` with "test"
    # and "limit" (`SpeedLimit.to_dict()`); None when no limit is known
    speed_of_light: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def stat(self, test: str) -> BenchStat:
        return next(result for result in self.results if result.test == test)

    @property
    def decode(self) -> BenchStat | None:
        """The token-generation test (tgN), if one ran."""
        return next((result for result in self.results if result.test.startswith("tg")), None)


def run_bench(
    engine: LocalEngine,
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


def _config_as_run(engine: LocalEngine) -> dict[str, Any]:
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


# ---- speculative decoding: the same prompts with and without drafts ------------------------


@dataclass(frozen=True)
class SpeculationComparison:
    """One speculative setting against plain decoding, measured in the same session.

    Rates are medians over every (prompt, repetition) run; `speedup` is the median of the
    ratios of back-to-back pairs, so a machine that slows down for a while (other work on a
    shared CPU) hits both sides of a pair alike; `stats` sums the drafts of all
    speculative runs; `identical` says whether every speculative reply had exactly the plain
    reply's tokens (expected with greedy sampling, see speculative.py).
    """

    speculative: dict[str, Any]
    plain_decode_tok_s: float
    speculative_decode_tok_s: float
    speedup: float
    plain_ttft_s: float | None
    speculative_ttft_s: float | None
    stats: SpeculationStats | None
    identical: bool
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_speculation(
    engine: LocalEngine,
    prompts: Sequence[Sequence[int]],
    speculative: SpeculativeConfig,
    sampling: SamplingParams,
    *,
    repetitions: int = 3,
    fresh_cache: bool = True,
) -> SpeculationComparison:
    """Generate each prompt with and without `speculative`, alternating, and compare.

    With `fresh_cache` every run evaluates its whole prompt (so TTFT compares too); the
    engine's own speculative setting is restored afterwards.
    """
    before = engine.config.speculative
    plain: list[GenerationResult] = []
    drafted: list[GenerationResult] = []
    engine.set_speculative(speculative)
    try:
        for _ in range(repetitions):
            for prompt in prompts:
                with engine.speculation_paused():
                    plain.append(_timed_run(engine, prompt, sampling, fresh_cache))
                drafted.append(_timed_run(engine, prompt, sampling, fresh_cache))
    finally:
        engine.set_speculative(before)
    plain_tps = _median_of(result.metrics.decode_tok_s for result in plain)
    drafted_tps = _median_of(result.metrics.decode_tok_s for result in drafted)
    return SpeculationComparison(
        speculative=asdict(speculative),
        plain_decode_tok_s=plain_tps,
        speculative_decode_tok_s=drafted_tps,
        speedup=_median_pair_ratio(drafted, plain),
        plain_ttft_s=_median_or_none(result.metrics.ttft_s for result in plain),
        speculative_ttft_s=_median_or_none(result.metrics.ttft_s for result in drafted),
        stats=merge_stats([r.metrics.speculative for r in drafted if r.metrics.speculative]),
        identical=all(a.tokens == b.tokens for a, b in zip(plain, drafted, strict=True)),
        runs=len(drafted),
    )


def _timed_run(
    engine: LocalEngine, prompt: Sequence[int], sampling: SamplingParams, fresh_cache: bool
) -> GenerationResult:
    if fresh_cache:
        engine.clear_cache()
    return engine.generate(prompt, sampling)


def measure_verify_cost(
    engine: Engine,
    sizes: Sequence[int] = (1, 2, 4, 8, 16),
    *,
    context_tokens: int = 64,
    repetitions: int = 3,
) -> tuple[tuple[int, float], ...]:
    """Seconds to evaluate a batch of n tokens with logits at every position (a verify
    step of n − 1 drafts), median of `repetitions`, after `context_tokens` of context."""
    rng = np.random.default_rng(1)
    needed = context_tokens + max(sizes)
    tokens = [int(t) for t in rng.integers(0, engine.n_vocab, size=needed)]
    llama = engine.llama
    llama.reset()
    llama.evaluate(tokens[:context_tokens], logits_for_last=1)
    timings = []
    for size in sizes:
        samples = []
        for _ in range(repetitions):
            llama.n_tokens = context_tokens  # evaluate() drops the cache past this point
            start = time.perf_counter()
            llama.evaluate(tokens[context_tokens : context_tokens + size], logits_for_last=size)
            samples.append(time.perf_counter() - start)
        timings.append((size, statistics.median(samples)))
    llama.reset()
    return tuple(timings)


def _median_pair_ratio(drafted: list[GenerationResult], plain: list[GenerationResult]) -> float:
    ratios = [
        a.metrics.decode_tok_s / b.metrics.decode_tok_s
        for a, b in zip(drafted, plain, strict=True)
        if a.metrics.decode_tok_s and b.metrics.decode_tok_s
    ]
    return statistics.median(ratios) if ratios else 0.0


def _median_of(values: Iterable[float | None]) -> float:
    known = [value for value in values if value]
    return statistics.median(known) if known else 0.0


def _median_or_none(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None
