"""Timing helpers shared by the side-by-side benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence


def rate_from_stamps(stamps: Sequence[float]) -> float:
    """Pieces per second from arrival times: 1 / the median gap, which shrugs off the hiccups
    of a shared machine."""
    gaps = [later - earlier for earlier, later in zip(stamps, stamps[1:], strict=False)]
    return 1.0 / statistics.median(gaps)


def paired(first: Callable[[], None], second: Callable[[], None], flip: bool) -> None:
    """Run both, back to back, in an order that alternates between calls."""
    for run in (second, first) if flip else (first, second):
        run()


def median_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of the ratios of back-to-back pairs, so slow drifts of the machine cancel."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
