"""Two runs of a kernel must agree. The test machines are shared (other jobs come and go), so
runs that disagree are followed by more runs, up to MAX_RUNS, and any two of them that agree
pass: a kernel that is really unstable spreads its figures everywhere, while a neighbour's
burst of work (seen lasting a minute or more on the 2-core VM, its RAM bandwidth moving
between 14 and 20 GB/s; on CI one torch GEMM test's runs drifted 58 -> 107 GFLOP/s, each
run faster than the one before it) moves a run or two away from the rest."""

from __future__ import annotations

from collections.abc import Callable
from itertools import combinations

STABLE_BETWEEN_RUNS = 0.15
MAX_RUNS = 6


def relative_difference(first: float, second: float) -> float:
    return abs(first - second) / max(first, second)


def two_agreeing_runs(
    measure: Callable[[], float], tolerance: float = STABLE_BETWEEN_RUNS
) -> tuple[float, float]:
    """Two values of `measure()` within `tolerance` of each other, or AssertionError."""
    values = [measure()]
    while len(values) < MAX_RUNS:
        values.append(measure())
        for first, second in combinations(values, 2):
            if relative_difference(first, second) < tolerance:
                return first, second
    raise AssertionError(
        f"no two of {MAX_RUNS} runs agree within {tolerance:.0%}: {[round(v, 3) for v in values]}"
    )
