"""The wait a tuning run is given is the wait a person has, and what it will measure is said
before it starts (`autotune/tune_wait.py`): replayed from the tuner's own deadlines, checked
against a real run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from hearthside.autotune.optimize import wait_text
from hearthside.autotune.planner import SpeedEstimate
from hearthside.autotune.tune_wait import (
    WORTH_MEASURING,
    TuneCosts,
    budget_measuring,
    expected_wait,
)
from hearthside.autotune.tuner import (
    _ranked,
    llama_cpp_python_defaults,
    tune,
    tuning_costs,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.probe.runner import probe_hardware
from tests.fixtures.synthetic_gguf import write_synthetic_gguf

# What Llama 3.1 8B Q4_K_M cost on a 2-core Xeon (benchmarks/realistic_models.py, 2026-12-04):
# a candidate 78.4 s, 10 in the queue; `tune --budget-s 600` measured 2 of them, when the
# candidates had only their share of the budget (no first claim on it).
EIGHT_B = TuneCosts(candidate_s=78.4, source="measured", candidates=10, audit_s=150.0)
# a model whose one candidate takes 5 min here: 10 min cannot reach a third
HUGE = TuneCosts(candidate_s=300.0, source="measured", candidates=10, audit_s=150.0)
SMALL = TuneCosts(candidate_s=2.0, source="measured", candidates=10, audit_s=3.0)


def test_the_wait_is_the_budget_plus_the_calibration_asked_for_first() -> None:
    calibrating = TuneCosts(2.0, "estimated", 10, 3.0, calibration_s=60.0)
    assert expected_wait(30, SMALL).total_s == 30
    assert expected_wait(30, calibrating).total_s == 90


def test_the_replay_keeps_the_tuners_rules() -> None:
    # the defaults and the planner's pick whatever the budget
    assert expected_wait(1, EIGHT_B).measured == 2
    # 600 s on an 8B here: the defaults and the two ranked best at least (the real run,
    # before the candidates' first claim, measured 2)
    assert expected_wait(600, EIGHT_B).measured >= WORTH_MEASURING
    assert expected_wait(600, HUGE).measured == 2
    # more time, more candidates, never more than the queue
    counts = [expected_wait(budget, SMALL).measured for budget in (15, 30, 60, 120, 600)]
    assert counts == sorted(counts) and counts[-1] == SMALL.candidates
    # the weight types take their share only when they can be measured in it
    missing = TuneCosts(2.0, "measured", 10, 3.0, missing_types=1)
    assert expected_wait(60, missing).types_s == 15
    assert expected_wait(30, missing).measured < expected_wait(30, SMALL).measured
    assert expected_wait(16, missing).types_s == 0  # 4 s: less than one type needs
    assert expected_wait(60, TuneCosts(2.0, "measured", 10, 3.0, 1, calibrated=False)).types_s == 0


def test_the_budget_named_is_the_shortest_that_measures_what_was_asked() -> None:
    budget = budget_measuring(SMALL, WORTH_MEASURING, step_s=15, max_s=600)
    assert budget is not None
    assert expected_wait(budget, SMALL).measured >= WORTH_MEASURING
    assert expected_wait(budget - 15, SMALL).measured < WORTH_MEASURING
    assert budget_measuring(HUGE, WORTH_MEASURING, step_s=15, max_s=600) is None


def test_a_short_budget_says_what_it_misses_and_what_would_not() -> None:
    enough = wait_text(600, SMALL, step_s=15, max_s=600)
    assert not enough.too_short
    assert enough.text.startswith("You wait about 10 min.")
    assert "llama.cpp's defaults and about 9 of the 9 other settings" in enough.text

    short = wait_text(5, SMALL, step_s=15, max_s=600)
    needed = budget_measuring(SMALL, WORTH_MEASURING, step_s=15, max_s=600)
    assert short.too_short and short.better_budget_s == needed
    assert "only llama.cpp's defaults and 1 other setting" in short.text
    assert "would also measure the next setting predicted fastest" in short.text

    slow = wait_text(600, HUGE, step_s=15, max_s=600)
    assert slow.too_short and slow.better_budget_s is None
    assert "even 10 min would not reach" in slow.text
    assert "one setting takes about 5 min here" in slow.text


def test_a_calibration_first_is_in_the_wait() -> None:
    calibrating = TuneCosts(2.0, "estimated", 10, 3.0, calibration_s=60.0)
    said = wait_text(30, calibrating, step_s=15, max_s=600).text
    assert said.startswith("You wait about 1 min 30 s: about 1 min calibrating, then 30 s")


def _speed(decode: float) -> SpeedEstimate:
    return SpeedEstimate(100.0, decode, 0.1, "CPU", decode_tps_empty_context=decode)


def test_the_variations_ranked_fastest_are_measured_right_after_the_defaults_and_the_pick() -> None:
    queue = [EngineConfig("m.gguf", n_threads=n) for n in (None, 2, 1, 3, 4)]
    python = llama_cpp_python_defaults("m.gguf")
    queue.append(python)
    speeds = [_speed(s) for s in (10, 12, 9, 11, 15)] + [_speed(99)]
    # defaults and pick first, then the fastest predicted; llama-cpp-python's defaults last
    assert _ranked(queue, speeds, 2, python) == [0, 1, 4, 2, 3, 5]
    # the pick is llama.cpp's defaults: the two fastest variations follow them
    assert _ranked(queue, speeds, 1, python) == [0, 4, 1, 2, 3, 5]


@pytest.fixture(scope="module")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wait")
    return write_synthetic_gguf(folder / "tiny-dense.gguf", "tiny-dense", "Q8_0")


@pytest.mark.usefixtures("repeat_noise_ignored")
def test_the_budget_said_beforehand_measures_the_defaults_and_the_two_ranked_best_in_time(
    small_model: Path, tmp_path: Path
) -> None:
    """The real tuner, given the budget the estimate names for the defaults and the two
    settings ranked best, measures them first and ends within 15% of that budget; afterwards
    the estimate's cost per candidate is the one measured."""
    profile = probe_hardware()
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        costs = tuning_costs(small_model, profile, wisdom, speculation=False)
        assert costs.source == "estimated"
        budget = budget_measuring(costs, WORTH_MEASURING, step_s=15, max_s=600)
        assert budget is not None
        started = time.monotonic()
        result = tune(small_model, profile, budget_s=budget, wisdom=wisdom, speculation=False)
        waited = time.monotonic() - started
        measured = [run for run in result.runs if run.outcome == "ok"]
        assert len(measured) >= WORTH_MEASURING, [n.reason for n in result.notes]
        assert waited <= 1.15 * budget, (waited, budget)
        after = tuning_costs(small_model, profile, wisdom, speculation=False)
    assert after.source == "measured"
    assert after.candidate_s == pytest.approx(result.candidate_s, rel=0.25)
