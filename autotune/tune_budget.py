"""One time budget for a tuning run, split into a deadline per phase.

`tune(budget_s=60)` ends after about 60 s: weight types the calibration lacks first (at most
`TYPES_SHARE`), then the candidates (first the time the ones worth measuring take, then their
share of the rest), then the quality of their KV-cache types (`QUALITY_SHARE`
of what the later phases share, and whatever the candidates left), then the model's installed
quant variants at the best settings (`VARIANTS_SHARE`, only when it has some), then the time
to measure a small gain again (held back for two runs; speculation's when nothing needs it),
then speculative decoding on the winner (`SPECULATION_SHARE`), then the winner's context audit,
whose time is
held back from the start (estimated from the planner's speeds, at most `AUDIT_SHARE`). A
measurement in flight may run `grace_s` past its phase's deadline (a speculation trial none: the
audit's time comes after it); past that its engine worker is stopped (`Watchdog`) and the run
is recorded as a `timeout`. A phase that does not fit is
shortened or skipped, and a `PhaseNote` says which and why.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

Phase = Literal["types", "candidates", "quality", "variants", "speculation", "audit"]

TYPES_SHARE = 0.25  # at most, of the budget, for the weight types the calibration lacks
SPECULATION_SHARE = 0.35  # of the time the candidates, quality and speculation share
QUALITY_SHARE = 0.20  # of that time: a reference pass and one per KV type, once per model
VARIANTS_SHARE = 0.15  # of that time: per variant one speed run and one quality pass
AUDIT_SHARE = 0.25  # at most, of the budget, held back for the context audit
GRACE_SHARE = 0.10  # of the budget: how far a measurement in flight may run past its deadline
GRACE_MIN_S = 1.5
# the audit fills the context: attention makes the later tokens slower than pp128 was
# (measured: SmolLM2 decodes at 34% of its empty-context speed when 90% full)
AUDIT_DEPTH_SLOWDOWN = 2.0
AUDIT_DECODE_TOKENS = 3 * 16  # capacity.DECODE_STEPS at each of its three depths
ENGINE_LOAD_S = 1.5  # a worker start and a small model's load, before one was timed
MIN_AUDIT_S = ENGINE_LOAD_S + 0.5  # a load and a little checking: less is not worth a load


@dataclass(frozen=True)
class PhaseNote:
    """A phase that was shortened or skipped to keep the budget, and why."""

    phase: Phase
    reason: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def estimated_audit_s(n_ctx: int, prefill_tps: float | None, decode_tps: float | None) -> float:
    """How long the context audit of a config should take: a load, one fill of ~90% of the
    context (slower than an empty-context prefill), and its decode steps; at least
    `MIN_AUDIT_S` and a second."""
    if not prefill_tps or not decode_tps:
        return MIN_AUDIT_S + 1.0
    fill_s = 0.9 * n_ctx / prefill_tps * AUDIT_DEPTH_SLOWDOWN
    decode_s = AUDIT_DECODE_TOKENS / decode_tps * AUDIT_DEPTH_SLOWDOWN
    return max(MIN_AUDIT_S + 1.0, ENGINE_LOAD_S + fill_s + decode_s)


class TuneClock:
    """The budget's deadlines, as `time.monotonic()` values."""

    def __init__(self, budget_s: float, now: Callable[[], float] = time.monotonic) -> None:
        self.now = now
        self.budget_s = budget_s
        self.started = now()
        self.end = self.started + budget_s
        self.grace_s = max(GRACE_MIN_S, GRACE_SHARE * budget_s)
        self.types_end = self.started + TYPES_SHARE * budget_s
        self.candidates_end = self.end
        self.quality_end = self.end
        self.variants_end = self.end
        self.speculation_end = self.end

    def hold_for_audit(self, audit_s: float) -> None:
        """Speculation ends `audit_s` (at most `AUDIT_SHARE` of the budget) before the end:
        from the planner's speeds at first, from the winner's measured ones once known."""
        self.speculation_end = self.end - min(audit_s, AUDIT_SHARE * self.budget_s)

    def left_s(self, deadline: float | None = None) -> float:
        return (self.end if deadline is None else deadline) - self.now()

    def split(
        self,
        audit_s: float,
        *,
        speculation: bool,
        quality: bool = True,
        variants: bool = False,
        candidates_first_s: float = 0.0,
        confirm_s: float = 0.0,
    ) -> None:
        """Deadlines for the candidates, quality, variants and speculation from what is left,
        once the weight types are measured, holding `audit_s` (at most `AUDIT_SHARE`) back for
        the audit. The candidates first get `candidates_first_s` (what measuring the ones
        worth measuring takes: a short budget measures them before anything else), then
        `confirm_s` is held back after the variants (measuring a small gain again, before
        speculation, which has that time when there is nothing to confirm), then the
        phases share the rest. Without `variants` their phase has no time: quality ends where
        it would."""
        self.hold_for_audit(audit_s)
        left = max(0.0, self.speculation_end - self.now())
        shared = left - min(candidates_first_s, left)
        confirm = min(confirm_s, shared)
        shared -= confirm
        self.variants_end = (
            self.speculation_end - confirm - (SPECULATION_SHARE * shared if speculation else 0.0)
        )
        self.quality_end = self.variants_end - (VARIANTS_SHARE * shared if variants else 0.0)
        self.candidates_end = self.quality_end - (QUALITY_SHARE * shared if quality else 0.0)


class Watchdog:
    """Kills an engine worker that is still busy at `deadline`: its calls in flight then
    fail, and `fired` tells the caller it was the time limit, not the settings."""

    def __init__(self, deadline: float, now: Callable[[], float] = time.monotonic) -> None:
        self.deadline = deadline
        self.now = now
        self.fired = False
        self._timer: threading.Timer | None = None

    def limit_s(self) -> float:
        return max(0.0, self.deadline - self.now())

    def arm(self, pid: int) -> None:
        """Watch the worker `pid` until `disarm` (no limit when the deadline is infinite)."""
        self.disarm()
        if math.isinf(self.deadline):
            return
        self._timer = threading.Timer(self.limit_s(), self._kill, (pid,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @contextlib.contextmanager
    def watching(self, pid: int) -> Iterator[None]:
        self.arm(pid)
        try:
            yield
        finally:
            self.disarm()

    def _kill(self, pid: int) -> None:
        self.fired = True
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)  # not SIGKILL: the log would blame the memory
