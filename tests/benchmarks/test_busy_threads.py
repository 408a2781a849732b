"""benchmarks/busy_threads.py's verdicts on recorded rounds (issue 32): threads that make way
must win clearly beside a busy program and cost nothing on a quiet machine."""

from __future__ import annotations

from typing import Any

from tests.benchmarks.test_targets import benchmark


def rounds_of(busy: tuple[float, float], quiet: tuple[float, float]) -> list[Any]:
    module = benchmark("busy_threads")
    return [module.Round(*busy, *quiet, 1) for _ in range(3)]


def verdicts(rounds: list[Any]) -> list[bool]:
    return [target.met for target in benchmark("busy_threads").targets(rounds)]


def test_a_clear_win_beside_busy_programs_at_no_cost_when_quiet_passes() -> None:
    assert verdicts(rounds_of((35.0, 6.0), (70.0, 70.5))) == [True, True]


def test_no_gain_beside_busy_programs_misses() -> None:
    assert verdicts(rounds_of((6.2, 6.0), (70.0, 70.5))) == [False, True]


def test_a_cost_on_a_quiet_machine_misses() -> None:
    assert verdicts(rounds_of((35.0, 6.0), (60.0, 70.0))) == [True, False]
