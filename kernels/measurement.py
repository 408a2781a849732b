"""`Measurement`, the typed result of every kernel, and the timing loop they all share.

A kernel warms up by time (a cold page cache, a clocking-up core or a lazy GPU context settle
first), then repeats until the last few repetitions agree or its time budget ends, and reports
the median. Spread is (max - min) / median over the kept repetitions: the last `window` ones,
so the warm-up's stragglers never count.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "memory_read",
    "memory_copy",
    "memory_triad",
    "matmul",
    "h2d",
    "d2h",
    "disk_read",
    "engine_prefill",
    "engine_decode",
)
UNITS = ("GB/s", "GFLOP/s", "tok/s")  # GB = 1e9 bytes
NOT_MEASURED_NOTE = "not measured (install the `kernels` extra)"
NO_GPU_NOTE = "no GPU"

# A bandwidth's fastest kept repetition, in its unit: what the planner reads as RAM's speed
# (`autotune.calibration_figures.ram_read_rate`).
FASTEST_PARAM = "fastest_gb_s"

WARMUP_S = 0.2
TARGET_SPREAD = 0.05
MIN_REPETITIONS = 3
WINDOW = 5
MAX_REPETITIONS = 200


@dataclass(frozen=True)
class Measurement:
    """One figure the machine delivered, with how it was obtained.

    `value` and `median` are the same number (the median of the kept repetitions); both are
    0.0 when `ok` is False, and `note` then says why nothing was measured.
    """

    kind: str  # one of KINDS
    device: str  # "cpu" | "cuda:0" | "rocm:0" | "mps" | "gpu" (none found) | "disk:/dev/vda"
    value: float  # the median, in `unit`
    unit: str  # one of UNITS
    median: float
    spread: float  # (max - min) / median over the kept repetitions
    repetitions: int  # kept repetitions
    method: str  # how it was measured, in a few words
    params: dict[str, Any] = field(default_factory=dict)  # JSON scalars only
    ok: bool = True
    note: str = ""

    @classmethod
    def from_samples(
        cls,
        kind: str,
        device: str,
        unit: str,
        samples: Samples,
        *,
        method: str,
        params: dict[str, Any] | None = None,
        note: str = "",
    ) -> Measurement:
        return cls(
            kind=kind,
            device=device,
            value=samples.median,
            unit=unit,
            median=samples.median,
            spread=samples.spread,
            repetitions=len(samples.values),
            method=method,
            params=dict(params or {}),
            note=note,
        )

    @classmethod
    def failed(
        cls,
        kind: str,
        device: str,
        unit: str,
        note: str,
        *,
        method: str = "",
        params: dict[str, Any] | None = None,
    ) -> Measurement:
        """A kernel that could not run here; `note` says why (a missing library, no GPU...)."""
        return cls(
            kind=kind,
            device=device,
            value=0.0,
            unit=unit,
            median=0.0,
            spread=0.0,
            repetitions=0,
            method=method,
            params=dict(params or {}),
            ok=False,
            note=note,
        )


@dataclass(frozen=True)
class Samples:
    values: tuple[float, ...]  # the kept repetitions, in the kernel's unit
    runs: int  # timed repetitions in all (warm-up excluded)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def spread(self) -> float:
        return spread_of(self.values)


def spread_of(values: tuple[float, ...] | list[float]) -> float:
    """(max - min) / median; 0 for a single value."""
    if len(values) < 2:
        return 0.0
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median > 0 else float("inf")


def measure_until_stable(
    sample: Callable[[], float],
    *,
    budget_s: float,
    warmup_s: float = WARMUP_S,
    min_repetitions: int = MIN_REPETITIONS,
    window: int = WINDOW,
    target_spread: float = TARGET_SPREAD,
    max_repetitions: int = MAX_REPETITIONS,
    clock: Callable[[], float] = time.perf_counter,
) -> Samples:
    """Call `sample` (which returns one repetition's figure) until the last `window` values
    agree within `target_spread`, or `budget_s` (warm-up included) is spent.

    At least `min_repetitions` run even past the budget, so a slow kernel still has a spread.
    """
    started = clock()
    if warmup_s > 0:  # 0: no warm-up at all (a cold read is the point of the disk kernel)
        _warm_up(sample, min(warmup_s, budget_s / 2), clock)
    values: list[float] = []
    while len(values) < max_repetitions:
        values.append(sample())
        kept = values[-window:]
        if len(kept) >= min_repetitions and spread_of(kept) < target_spread:
            break
        if len(values) >= min_repetitions and clock() - started >= budget_s:
            break
    return Samples(values=tuple(values[-window:]), runs=len(values))


def _warm_up(sample: Callable[[], float], warmup_s: float, clock: Callable[[], float]) -> None:
    """Run `sample` for `warmup_s`, and at least once."""
    deadline = clock() + warmup_s
    sample()
    while clock() < deadline:
        sample()


def timed_s(work: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    """Wall seconds `work()` took."""
    start = clock()
    work()
    return clock() - start


class Budget:
    """A time budget shared by several kernels: each takes the time left in proportion to its
    weight among the work left, so time one kernel saves goes to the ones after it.

    `hard_deadline_s` (a `clock()` time) is when the whole calibration must stop: past it,
    `expired()` tells the remaining kernels to report themselves skipped instead of running.
    """

    def __init__(
        self,
        total_s: float,
        total_weight: float,
        *,
        hard_deadline_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self._deadline = clock() + total_s
        self._hard_deadline_s = hard_deadline_s
        self._weight_left = total_weight

    def remaining_s(self) -> float:
        return max(0.0, self._deadline - self._clock())

    def take(self, weight: float = 1.0) -> float:
        """Seconds for the next piece of work of `weight`."""
        weight_left = max(self._weight_left, weight)
        self._weight_left = weight_left - weight
        return self.remaining_s() * weight / weight_left if weight_left > 0 else 0.0

    def child(self, weight: float, total_weight: float) -> Budget:
        """A budget for a group of kernels: this one's share of `weight`, split `total_weight`
        ways, under the same hard deadline."""
        return Budget(
            self.take(weight),
            total_weight,
            hard_deadline_s=self._hard_deadline_s,
            clock=self._clock,
        )

    def expired(self) -> bool:
        return self._hard_deadline_s is not None and self._clock() >= self._hard_deadline_s


SKIPPED_NOTE = "skipped: the time budget ran out (give calibrate more time with --budget-s)"
