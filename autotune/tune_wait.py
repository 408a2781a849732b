"""How long a tuning run makes a person wait, and what it measures in that time, known before
it starts.

The budget is the wait: `tune(budget_s=B)` ends about B after it starts (`tune_budget.py`),
and a calibration first (the wizard's box) adds its own stated time. What B buys depends on
what one candidate costs on this machine: measured (this model's earlier runs here,
`RunRecord.seconds`) or, before any, estimated from the plan's speeds (`tuner.tuning_costs`).
`expected_wait` replays the tuner's deadlines with that cost — the weight types' share, the
audit's time held back, the candidates' first claim (`candidates_first_s`), the time held for
a confirmation (`confirm_reserve_s`) and the candidates' share — as
`tuner._measure_candidates` keeps them (llama.cpp's defaults and the planner's pick always,
each next one while it still fits), and
`budget_measuring` finds the shortest budget that reaches a number of candidates. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hearthside.autotune.tune_budget import TYPES_SHARE, TuneClock
from hearthside.autotune.tune_types import MIN_TYPE_S

# llama.cpp's defaults and the two settings the cost model ranks best (the planner's pick and
# the next by predicted speed, `tuner._ranked`): fewer, and the verdict has nothing to compare
WORTH_MEASURING = 3
ALWAYS_MEASURED = 2  # the defaults and the planner's pick, whatever the budget
CONFIRM_RUNS = 2  # a confirmation measures llama.cpp's defaults and the pick again


def candidates_first_s(candidate_s: float) -> float:
    """The time the candidates get before the later phases share the rest: enough for the
    ones worth measuring, so the shortest budget measures them (`TuneClock.split`)."""
    return WORTH_MEASURING * candidate_s


def confirm_reserve_s(candidate_s: float) -> float:
    """The time held back to measure a small gain again (llama.cpp's defaults and the pick,
    back to back) before speculation, which has it when there is nothing to confirm. On the
    Qwen3-30B-A3B-shaped MoE here the candidates and quality used speculation's time too, and
    a 1.09x (0.975x natively) went out unconfirmed for want of two runs."""
    return CONFIRM_RUNS * candidate_s


@dataclass(frozen=True)
class TuneCosts:
    """What one tuning run of a model costs on this machine, before it starts."""

    candidate_s: float  # one candidate: a worker start, the model's load and a quick bench
    source: Literal["measured", "estimated"]  # candidate_s from this model's runs here or not
    candidates: int  # the tuner's queue: llama.cpp's defaults, the pick, its variations
    audit_s: float  # the winner's context check, held back from the budget's end
    missing_types: int = 0  # weight types the calibration lacks: measured first if it can
    calibrated: bool = True  # there is (or will be, first) a calibration to measure them by
    calibration_s: float = 0.0  # a whole calibration first, else 0
    speculation: bool = True
    variants: bool = False  # the model has installed quant variants to try


@dataclass(frozen=True)
class TuneWait:
    budget_s: float
    calibration_s: float
    types_s: float  # of the budget, for the missing weight types
    measured: int  # how many of the queue the budget reaches, llama.cpp's defaults first

    @property
    def total_s(self) -> float:
        """The whole wait: the calibration first, then the budget."""
        return self.calibration_s + self.budget_s


def expected_wait(budget_s: float, costs: TuneCosts) -> TuneWait:
    """What a run of `budget_s` waits in all and how many candidates it measures, replaying
    the tuner's deadlines on a clock that advances by what each step costs."""
    elapsed = [0.0]
    clock = TuneClock(budget_s, now=lambda: elapsed[0])
    types_s = _types_s(budget_s, costs)
    elapsed[0] += types_s
    clock.split(
        costs.audit_s,
        speculation=costs.speculation,
        variants=costs.variants,
        candidates_first_s=candidates_first_s(costs.candidate_s),
        confirm_s=confirm_reserve_s(costs.candidate_s),
    )
    measured = 0
    while measured < costs.candidates:
        if measured >= ALWAYS_MEASURED and elapsed[0] + costs.candidate_s > clock.candidates_end:
            break
        elapsed[0] += costs.candidate_s
        measured += 1
    return TuneWait(budget_s, costs.calibration_s, types_s, measured)


def budget_measuring(costs: TuneCosts, count: int, *, step_s: float, max_s: float) -> float | None:
    """The shortest budget, in steps of `step_s` up to `max_s`, that measures `count`
    candidates (all of them when there are fewer); None when even `max_s` does not."""
    wanted = min(count, costs.candidates)
    steps = int(max_s // step_s)
    for step in range(1, steps + 1):
        if expected_wait(step * step_s, costs).measured >= wanted:
            return step * step_s
    return None


def _types_s(budget_s: float, costs: TuneCosts) -> float:
    """The weight types' phase: its whole share when it measures them (the probes fill what
    they are given, `tune_types.MEASURE_OVERRUN`), nothing when it cannot."""
    allotted = TYPES_SHARE * budget_s
    if not costs.missing_types or not costs.calibrated:
        return 0.0
    return allotted if allotted >= MIN_TYPE_S * costs.missing_types else 0.0
