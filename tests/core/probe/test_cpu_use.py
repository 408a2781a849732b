"""Other programs' CPU time is counted apart from Hearthside's own (the engine workers are
its descendants), on real processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from hearthside.core.probe.cpu_use import CpuUse, cpu_use_now, others_cores
from tests.fixtures.other_programs import BUSY_LOOP, start_other_program

WINDOW_S = 2.0


def others_while(seconds: float) -> float:
    before = cpu_use_now()
    time.sleep(seconds)
    return others_cores(before, cpu_use_now())


def test_the_counters_give_cores_used_per_second() -> None:
    before = CpuUse(machine_busy_s=100.0, own_s=40.0, at_s=10.0, cores=2)
    after = CpuUse(machine_busy_s=106.0, own_s=42.0, at_s=14.0, cores=2)
    assert others_cores(before, after) == 1.0  # (6 - 2) s of CPU over 4 s
    assert others_cores(before, before) == 0.0
    assert others_cores(before, CpuUse(101.0, 43.0, 12.0, 2)) == 0.0  # ticks apart: never < 0


def test_programs_that_make_way_are_not_counted() -> None:
    before = CpuUse(100.0, 40.0, 10.0, 2, {(7, 1.0): 5.0, (8, 1.0): 2.0})
    # 7 used 2 s more, 9 started since (1 s), 8 ended (its last 0.5 s cannot be told apart)
    after = CpuUse(106.0, 42.0, 14.0, 2, {(7, 1.0): 7.0, (9, 12.0): 1.0})
    assert others_cores(before, after) == 0.25  # (6 - 2 - 3) s over 4 s


def test_a_loop_in_another_program_counts_and_one_in_a_worker_of_ours_does_not() -> None:
    worker = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])  # as an engine worker is
    try:
        time.sleep(0.3)
        ours = others_while(WINDOW_S)
    finally:
        worker.kill()
        worker.wait()
    theirs = others_beside(BUSY_LOOP)
    lowest = others_beside(BUSY_LOOP, niceness=19)
    plain_nice = others_beside(BUSY_LOOP, niceness=10)
    # one loop keeps one core busy; the machine's own background stays far below half a core
    assert ours < 0.3, ours
    assert theirs > 0.7, theirs
    # one at the lowest priority (a `nice -n 19` backup) makes way for our threads at once;
    # one at plain `nice`'s 10 still slows them (0.82x), so it counts
    assert lowest < 0.3, lowest
    assert plain_nice > 0.7, plain_nice


def others_beside(code: str, niceness: int = 0) -> float:
    """The cores counted as other programs' while `code` runs in another program."""
    other = start_other_program(code, niceness)
    try:
        time.sleep(0.3)
        return others_while(WINDOW_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(other, signal.SIGKILL)
