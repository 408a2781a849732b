"""The targets a benchmark declares, its PASS/MISS table and its exit status.

Every benchmark turns its measured numbers into `Target`s with a pure function (so the tests
in tests/benchmarks/ can check the verdicts on recorded numbers without running anything
slow), prints them with `report` and returns `report`'s status from `main`: 0 when every
target is met, 1 on any MISS, so a script or CI job that runs a benchmark sees a miss.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TextIO

Direction = Literal["at least", "at most"]
EXIT_ALL_MET = 0
EXIT_MISSED = 1


@dataclass(frozen=True)
class Target:
    """One bound on one measured figure: `measured` must be `direction` `bound`.

    `measured` None (nothing could be measured) or NaN counts as a miss: a figure that was
    never taken has not met its target."""

    name: str
    measured: float | None
    bound: float
    direction: Direction = "at least"
    unit: str = "x"

    @property
    def met(self) -> bool:
        if self.measured is None or math.isnan(self.measured):
            return False
        if self.direction == "at least":
            return self.measured >= self.bound
        return self.measured <= self.bound

    @classmethod
    def holds(cls, name: str, condition: bool | None) -> Target:
        """A yes/no target ("the tuner switched prompt lookup on"): met when it holds."""
        measured = None if condition is None else float(condition)
        return cls(name, measured, 1.0, "at least", unit="yes/no")

    def measured_text(self) -> str:
        if self.measured is None:
            return "not measured"
        if self.unit == "yes/no":
            return "yes" if self.measured else "no"
        return f"{self.measured:.3f}{_suffix(self.unit)}"

    def bound_text(self) -> str:
        if self.unit == "yes/no":
            return "yes"
        sign = ">=" if self.direction == "at least" else "<="
        return f"{sign} {self.bound:g}{_suffix(self.unit)}"


def _suffix(unit: str) -> str:
    return unit if unit == "x" else f" {unit}" if unit else ""


def exit_status(targets: Sequence[Target]) -> int:
    """0 when every target is met (or there are none), 1 on any miss."""
    return EXIT_ALL_MET if all(target.met for target in targets) else EXIT_MISSED


def report(targets: Sequence[Target], out: TextIO | None = None) -> int:
    """Print the PASS/MISS table and return the exit status for `main`."""
    out = out if out is not None else sys.stdout
    if not targets:
        print("targets: none (this benchmark reports figures only; exit status 0)", file=out)
        return EXIT_ALL_MET
    width = max(len(target.name) for target in targets)
    print(f"{'target':{width}}  {'measured':>14}  {'bound':>12}  verdict", file=out)
    for target in targets:
        verdict = "PASS" if target.met else "MISS"
        print(
            f"{target.name:{width}}  {target.measured_text():>14}  {target.bound_text():>12}  "
            f"{verdict}",
            file=out,
        )
    status = exit_status(targets)
    missed = sum(1 for target in targets if not target.met)
    if status == EXIT_ALL_MET:
        print(f"all {len(targets)} targets met (exit status 0)", file=out)
    else:
        print(
            f"{missed} of {len(targets)} targets missed (exit status {status}); on a shared "
            "machine rerun once and read the figures with the load average before concluding",
            file=out,
        )
    return status
