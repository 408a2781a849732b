"""benchmarks/model_thrash.py's verdicts on recorded rounds (issue 36, item 2): a single 500
among the 90 replies misses, as does a 503 without Retry-After, a third on-demand worker beside
`--max-models 2`, or a memory peak that keeps growing round after round; the figures of the
quiet run pass."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmarks.test_targets import benchmark, status

pytestmark = pytest.mark.beside

MODELS = ["smol", "smol-q8", "smol-q4", "gemma", "gemma-q8", "gemma-q4"]


def thrash_of(
    statuses: list[list[int]],
    peaks_mib: list[float],
    workers: int = 3,
    retry_after: bool = True,
) -> Any:
    module = benchmark("model_thrash")
    rounds = [
        module.Round(
            [
                module.Reply(MODELS[i % 6], code, 5.0, code == 503 and retry_after)
                for i, code in enumerate(codes)
            ],
            peak,
            workers,
            1.0,
        )
        for codes, peak in zip(statuses, peaks_mib, strict=True)
    ]
    return module.Thrash(MODELS, 2, rounds)


def verdicts(thrash: Any) -> dict[str, bool]:
    return {target.name: target.met for target in benchmark("model_thrash").targets(thrash)}


ALL_ANSWERED = [[200] * 30] * 3


def test_thirty_answers_a_round_with_bounded_memory_pass() -> None:
    thrash = thrash_of([[200] * 25 + [503] * 5, *ALL_ANSWERED[1:]], [900, 940, 910])
    assert all(verdicts(thrash).values())
    assert status(benchmark("model_thrash").targets(thrash)) == 0


def test_one_500_among_ninety_replies_misses() -> None:
    thrash = thrash_of([[200] * 29 + [500], *ALL_ANSWERED[1:]], [900, 900, 900])
    assert not verdicts(thrash)["answers other than 200 or 503"]
    assert status(benchmark("model_thrash").targets(thrash)) == 1


def test_a_request_that_got_no_answer_at_all_misses() -> None:
    thrash = thrash_of([[200] * 29 + [0], *ALL_ANSWERED[1:]], [900, 900, 900])
    assert not verdicts(thrash)["answers other than 200 or 503"]


def test_a_503_without_retry_after_misses() -> None:
    thrash = thrash_of([[200] * 29 + [503], *ALL_ANSWERED[1:]], [900] * 3, retry_after=False)
    assert not verdicts(thrash)["503s without Retry-After"]


def test_more_workers_than_max_models_beside_the_served_one_misses() -> None:
    thrash = thrash_of(ALL_ANSWERED, [900] * 3, workers=4)
    assert not verdicts(thrash)["engine workers alive at once"]


def test_memory_that_grows_round_after_round_misses() -> None:
    thrash = thrash_of(ALL_ANSWERED, [900, 1000, 1100])
    assert not verdicts(thrash)["memory peak, last round / first"]
