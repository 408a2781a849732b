"""Decode threads that make way when another program takes a core, and come back after.

llama.cpp's threads meet at every layer of every token, so one thread on a core another
program holds stalls them all: on a 2-core VM with a busy program beside it, native
llama-bench decoded SmolLM2 Q8_0 at 6 tok/s with 2 threads (samples 1.7-10.5) and at 35 tok/s
with 1 (issue 32). A desktop is rarely idle, so while a reply is written the governor looks,
every `CHECK_S`, at the CPU time other programs used since its last look (all the CPU time
spent minus this process's, and minus programs at a lower priority than ours) and sets the
threads to the cores they leave: the loaded settings' count less each core they kept at least
`TAKEN_SHARE` busy, never below one. A core comes back once they keep it less than
`FREED_SHARE` busy: a busy program that merely had a slow half-second (the test's busy
loop once did, beside the niced test lane) keeps its core, and threads never flap at the line.
`llama_set_n_threads` changes them between two decode calls, at no cost.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import psutil

from hearthside.core.probe.cpu_use import busy_seconds, own_niceness

CHECK_S = 0.5  # how often a decoding reply looks again
FIRST_LOOK_S = 0.1  # a reply's first look: the kernel counts CPU time in 10 ms ticks
# Another program keeping a core at least this busy takes it: our own threads, spinning at
# every layer, leave it only part of a core while they run beside it.
TAKEN_SHARE = 0.5
FREED_SHARE = 0.25  # below this a taken core is free again


@dataclass(frozen=True)
class CpuTimes:
    at_s: float
    all_busy_s: float  # every program's CPU time, all cores
    own_s: float  # this process's


def cpu_times_now() -> CpuTimes:
    own = psutil.Process().cpu_times()
    busy = busy_seconds(psutil.cpu_times()._asdict(), own_niceness())
    return CpuTimes(time.monotonic(), busy, own.user + own.system)


def usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def others_busy_cores(before: CpuTimes, after: CpuTimes) -> float | None:
    """How many cores other programs kept busy between two looks; None when no time passed."""
    elapsed = after.at_s - before.at_s
    if elapsed <= 0:
        return None
    spent = (after.all_busy_s - before.all_busy_s) - (after.own_s - before.own_s)
    return max(0.0, spent / elapsed)


def threads_left(configured: int, busy_cores: float, cores: int) -> int:
    """The threads to decode with: `configured`, less the cores other programs took."""
    taken = math.floor(busy_cores + 1 - TAKEN_SHARE) if busy_cores >= TAKEN_SHARE else 0
    return max(1, min(configured, cores - taken))


def next_count(current: int, at_once: int, once_clearly_free: int) -> int:
    """Fewer threads as soon as a core is taken; more only once it is clearly free."""
    return at_once if at_once <= current else max(current, once_clearly_free)


class ThreadGovernor:
    """Keeps an engine's decode and prompt threads to the cores other programs leave."""

    def __init__(
        self,
        decode_threads: int,
        batch_threads: int,
        apply: Callable[[int, int], None],
        *,
        cores: int | None = None,
        clock: Callable[[], CpuTimes] = cpu_times_now,
        enabled: bool = True,
    ) -> None:
        self.enabled = enabled  # False: always the loaded settings' threads (a comparison)
        self.decode_threads = decode_threads
        self.batch_threads = batch_threads
        self._apply = apply
        self._cores = cores or usable_cores()
        self._clock = clock
        self._last = clock()
        self.current = (decode_threads, batch_threads)

    def look(self) -> tuple[int, int]:
        """Look at the machine since the last look; set and return the threads to use."""
        now = self._clock()
        busy = others_busy_cores(self._last, now)
        self._last = now
        if busy is None or not self.enabled:
            return self.current
        at_once = self._threads_for(busy)
        once_clearly_free = self._threads_for(busy + TAKEN_SHARE - FREED_SHARE)
        wanted = (
            next_count(self.current[0], at_once[0], once_clearly_free[0]),
            next_count(self.current[1], at_once[1], once_clearly_free[1]),
        )
        if wanted != self.current:
            self._apply(*wanted)
            self.current = wanted
        return self.current

    def _threads_for(self, busy_cores: float) -> tuple[int, int]:
        return (
            threads_left(self.decode_threads, busy_cores, self._cores),
            threads_left(self.batch_threads, busy_cores, self._cores),
        )

    def restore(self) -> None:
        """Back to the loaded settings' threads (a timed benchmark measures those)."""
        configured = (self.decode_threads, self.batch_threads)
        if self.current != configured:
            self._apply(*configured)
            self.current = configured

    def governed(self, tokens: Iterator[int]) -> Iterator[int]:
        """`tokens`, looking first `FIRST_LOOK_S` after they start, then every `CHECK_S`.
        The looks start afresh: what other programs did between two replies says nothing
        about now (a quiet reply after a busy minute ran on one thread for its first look,
        measured 0.72x on the quiet machine)."""
        self._last = self._clock()
        next_look = time.monotonic() + FIRST_LOOK_S
        for token in tokens:
            yield token
            if time.monotonic() >= next_look:
                self.look()
                next_look = time.monotonic() + CHECK_S
