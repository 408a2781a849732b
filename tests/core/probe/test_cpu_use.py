"""Other programs' CPU time is counted apart from Hearthside's own (the engine workers are
its descendants), on real processes."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace

from hearthside.core.probe.cpu_use import CpuUse, cpu_use_now, others_cores
from tests.fixtures.other_programs import BUSY_LOOP, start_other_program, stop_other_programs

WINDOW_S = 1.0
# busy programs that each end within a moment, one after the other (a lowered test lane)
SHORT_LIVED_LOOP = (
    "import subprocess, sys, time\n"
    "end = time.monotonic() + 300\n"
    "while time.monotonic() < end:\n"
    "    subprocess.run([sys.executable, '-c', 'sum(range(3_000_000))'])"
)


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
    """The kernel's nice time (every lowered program, ended ones too) is left out, less what
    the live ones lowered only a little used: those still take our threads' cores."""
    before = CpuUse(100.0, 40.0, 10.0, 2, lowered_s=10.0, mildly_lowered_s={(7, 1.0): 5.0})
    # 7 (plain `nice`) used 1 s more, 9 started since (0.5 s), the rest at nice 19 (1.5 s)
    after = CpuUse(
        106.0, 42.0, 14.0, 2, lowered_s=13.0, mildly_lowered_s={(7, 1.0): 6.0, (9, 12.0): 0.5}
    )
    assert others_cores(before, after) == 0.625  # (6 - 2 - 1.5) s over 4 s
    # when Hearthside itself runs lowered, nobody makes way for it: all of it counts
    assert others_cores(before, replace(after, niced=True)) == 1.0


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
    lowest_short_lived = others_beside(SHORT_LIVED_LOOP, niceness=19)
    plain_nice = others_beside(BUSY_LOOP, niceness=10)
    # one loop keeps one core busy; the machine's own background stays far below half a core
    assert ours < 0.3, ours
    assert theirs > 0.7, theirs
    # one at the lowest priority (a `nice -n 19` backup) makes way for our threads at once;
    # one at plain `nice`'s 10 still slows them (0.82x), so it counts
    assert lowest < 0.3, lowest
    assert lowest_short_lived < 0.3, lowest_short_lived  # counted though each one has ended
    assert plain_nice > 0.7, plain_nice


def others_beside(code: str, niceness: int = 0) -> float:
    """The cores counted as other programs' while `code` runs in another program."""
    other = start_other_program(code, niceness)
    try:
        time.sleep(0.3)
        return others_while(WINDOW_S)
    finally:
        stop_other_programs([other])
