"""The timing loop and budget every kernel shares, on a fake clock (the loop's logic, not the
machine's speed, is under test here)."""

from __future__ import annotations

import pytest

from hearthside.kernels.measurement import (
    Budget,
    Measurement,
    Samples,
    measure_until_stable,
    spread_of,
)


class FakeClock:
    """Advances only when a sample runs, like a kernel that takes `step_s` per repetition."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def sampler(clock: FakeClock, values: list[float], step_s: float = 0.01):
    calls = {"count": 0}

    def sample() -> float:
        clock.now_s += step_s
        value = values[calls["count"] % len(values)]
        calls["count"] += 1
        return value

    return sample, calls


def test_spread_is_range_over_median() -> None:
    assert spread_of([10.0, 11.0, 9.0]) == pytest.approx(0.2)
    assert spread_of([5.0]) == 0.0


def test_a_steady_kernel_stops_after_the_minimum_repetitions() -> None:
    clock = FakeClock()
    sample, calls = sampler(clock, [10.0])
    samples = measure_until_stable(sample, budget_s=10.0, warmup_s=0.0, clock=clock)
    assert samples.runs == 3
    assert samples.median == 10.0
    assert samples.spread == 0.0
    assert calls["count"] == 3


def test_warm_up_is_by_time_and_its_samples_are_not_kept() -> None:
    clock = FakeClock()
    # Five cold repetitions (0.05 s of warm-up at 0.01 s each), then steady ones.
    sample, calls = sampler(clock, [1.0] * 5 + [10.0] * 100)
    samples = measure_until_stable(sample, budget_s=10.0, warmup_s=0.05, clock=clock)
    assert calls["count"] == 5 + 3
    assert samples.values == (10.0, 10.0, 10.0)


def test_a_noisy_kernel_stops_when_its_budget_is_spent_and_keeps_the_last_window() -> None:
    clock = FakeClock()
    sample, _calls = sampler(clock, [10.0, 20.0])
    samples = measure_until_stable(sample, budget_s=0.1, warmup_s=0.0, window=5, clock=clock)
    assert samples.runs == pytest.approx(10, abs=1)
    assert len(samples.values) == 5
    assert samples.spread >= 0.5  # never settled: the budget, not stability, ended it


def test_the_minimum_repetitions_run_even_past_the_budget() -> None:
    clock = FakeClock()
    sample, _calls = sampler(clock, [10.0, 20.0], step_s=1.0)
    samples = measure_until_stable(sample, budget_s=0.0, warmup_s=0.2, clock=clock)
    assert samples.runs == 3


def test_measurement_from_samples_reports_the_median_as_the_value() -> None:
    samples = Samples(values=(9.0, 10.0, 12.0), runs=7)
    measurement = Measurement.from_samples(
        "memory_read", "cpu", "GB/s", samples, method="m", params={"threads": 1}
    )
    assert measurement.value == measurement.median == 10.0
    assert measurement.spread == pytest.approx(0.3)
    assert measurement.repetitions == 3
    assert measurement.ok


def test_a_failed_measurement_has_no_value_and_says_why() -> None:
    failed = Measurement.failed("h2d", "gpu", "GB/s", "no GPU")
    assert not failed.ok
    assert failed.value == 0.0
    assert failed.note == "no GPU"


def test_budget_shares_follow_the_weights_and_pass_saved_time_on() -> None:
    clock = FakeClock()
    budget = Budget(10.0, total_weight=4, clock=clock)
    assert budget.take(1) == pytest.approx(2.5)
    clock.now_s += 1.0  # the first kernel finished early
    assert budget.take(1) == pytest.approx(3.0)  # 9 s left for 3 shares
    child = budget.child(2, total_weight=4)
    assert child.remaining_s() == pytest.approx(9.0)
    assert child.take(1) == pytest.approx(9.0 / 4)


def test_budget_expires_at_the_hard_deadline_for_every_child() -> None:
    clock = FakeClock()
    budget = Budget(10.0, total_weight=1, hard_deadline_s=12.0, clock=clock)
    child = budget.child(1, total_weight=3)
    clock.now_s = 11.0
    assert not child.expired()
    clock.now_s = 12.0
    assert child.expired() and budget.expired()
