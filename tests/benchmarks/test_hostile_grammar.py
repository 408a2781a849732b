"""benchmarks/hostile_grammar.py's verdicts on recorded numbers (issue 36 1c): a victim slowed
more than 2x by the hostile-schema client misses, within 2x passes, and a round whose attacker
was not generating throughout measured nothing and misses too."""

from __future__ import annotations

from typing import Any

import pytest

from tests.benchmarks.test_targets import benchmark, status


def victim(tokens: int, first: float, last: float) -> dict[str, Any]:
    return {
        "sent": first - 0.1,
        "stamps": [first, last],
        "done": last,
        "usage": {"completion_tokens": tokens},
    }


def attacker(ended: str = "signal", pieces: int = 40) -> dict[str, Any]:
    return {"pieces": pieces, "last_piece": 1.0, "ended": ended, "error": None}


def rounds(attacked_s: list[float], seen: dict[str, Any] | None = None) -> list[Any]:
    """Rounds whose victim wrote 101 tokens in 1 s alone (100 tok/s) and in `attacked_s` when
    attacked."""
    Round = benchmark("hostile_grammar").Round
    return [
        Round(victim(101, 5.0, 6.0), victim(101, 10.0, 10.0 + took), seen or attacker())
        for took in attacked_s
    ]


def test_a_victim_slowed_past_2x_misses() -> None:
    targets = benchmark("hostile_grammar").targets_of(rounds([2.5, 3.0, 1.5]))
    assert targets[0].measured == pytest.approx(2.5)  # the median of the rounds' ratios
    assert status(targets) == 1


def test_a_victim_within_2x_passes() -> None:
    targets = benchmark("hostile_grammar").targets_of(rounds([1.2, 1.9, 3.5]))
    assert targets[0].measured == pytest.approx(1.9)
    assert status(targets) == 0


def test_an_attacker_that_ended_before_the_victim_measured_nothing() -> None:
    hostile = benchmark("hostile_grammar")
    for seen in (attacker(ended="stream end"), attacker(ended="refused"), attacker(pieces=0)):
        targets = hostile.targets_of(rounds([1.1, 1.1, 1.1], seen))
        assert targets[0].met and not targets[1].met
        assert status(targets) == 1


def test_no_rounds_is_a_miss() -> None:
    assert status(benchmark("hostile_grammar").targets_of([])) == 1
