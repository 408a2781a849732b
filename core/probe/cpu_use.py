"""How much CPU other programs used between two moments: the direct sign of a busy machine.

Repeats that disagree only hint at it, and fail both ways on a 2-core VM: an idle one's
short engine probes varied by 25-72%, while two busy loops that take the cores steadily make
every measurement slow but steady. So Hearthside counts instead: the CPU time the machine
spent busy (on the CPUs this process may run on; steal, time the hypervisor gave to the
VM's neighbours, included) minus what this process and its descendants used (the engine
workers), over the wall time between two snapshots. Programs at the lowest priorities
(`MAKES_WAY_NICENESS`: a `nice -n 19` backup or build) are left out too: they make way for
our threads at once. They are counted as the kernel's "nice" time (every lowered program,
ended ones included) less the live programs lowered only a little (a plain `nice`, 10, does
not make way, so it counts); one of those that ends between the two moments is missed.

A descendant that is re-parented away (orphaned) before it is reaped counts as another
program; Hearthside reaps its engine workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import psutil

# Cores other programs kept busy on average while measuring beyond which they disturbed it:
# llama.cpp's threads meet at a barrier after every matrix, so half a core taken slows a run
# on every core. Measured (2-core Zen 4 VM): idle 0.007, one busy loop elsewhere 1.009.
OTHERS_BUSY_CORES = 0.5
# Programs at this niceness or above give our threads their cores at once: native llama-bench,
# SmolLM2 Q4_1, 2 threads on the 2-core Zen 4 VM beside two busy loops decoded at 0.98-1.0x
# quiet at nice 19, 0.95x at 15, 0.82x at 10 (plain `nice`), 0.55x at 5 and 0.20x at 0.
MAKES_WAY_NICENESS = 15
# fields of psutil.cpu_times() that are not work: idle, waiting on disks, and guest time
# (already counted in user time on Linux)
NOT_BUSY_FIELDS = frozenset({"idle", "iowait", "guest", "guest_nice"})


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent busy by the machine (on this process's CPUs) and by this process's
    tree up to one moment, and that moment (monotonic seconds)."""

    machine_busy_s: float
    own_s: float
    at_s: float
    cores: int
    # the kernel's "nice" time: every program at a lower priority than the default, ended
    # ones included (a lowered lane of short-lived processes, say)
    lowered_s: float = 0.0
    # of those, the live ones that do not make way (niceness 1 to `MAKES_WAY_NICENESS` - 1),
    # CPU seconds by process id and start time (a reused id is another program)
    mildly_lowered_s: Mapping[tuple[int, float], float] = field(default_factory=dict)
    niced: bool = False  # this process itself runs lowered: then nobody makes way for it


def cpu_use_now() -> CpuUse:
    """The counters now."""
    cpus = _allowed_cpus()
    per_cpu = psutil.cpu_times(percpu=True)
    chosen = [per_cpu[i] for i in cpus if i < len(per_cpu)] if cpus else per_cpu
    own = _own_tree()
    return CpuUse(
        sum(_busy_s(times) for times in chosen),
        sum(_tree_s(process) for process in own),
        time.monotonic(),
        len(chosen),
        sum(getattr(times, "nice", 0.0) for times in chosen),
        _mildly_lowered_s({process.pid for process in own}),
        own_niceness() > 0,
    )


def others_cores(before: CpuUse, after: CpuUse) -> float:
    """How many cores other programs kept busy on average between the two snapshots (0 when
    no time passed; never below 0, since the counters tick at different moments)."""
    wall = after.at_s - before.at_s
    if wall <= 0:
        return 0.0
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    if not after.niced:
        lowered = after.lowered_s - before.lowered_s
        mildly = sum(
            seconds - before.mildly_lowered_s.get(program, 0.0)  # started since: all of it
            for program, seconds in after.mildly_lowered_s.items()
        )
        others -= max(0.0, lowered - mildly)  # what the programs that make way used
    return max(0.0, others / wall)


def busy_seconds(values: Mapping[str, float], niceness: int) -> float:
    """The CPU time that can take a core from our threads (the thread governor's count), of
    the kernel's counters (`values`, as psutil names them): all but idle time, and but
    programs running at a lower priority (the kernel's "nice" time) while we are not lowered
    ourselves: our threads keep their cores beside a niced build (2 threads beside two loops
    at plain `nice`, 10, decoded at 0.82x quiet; 1 thread alone decodes at about 0.6x)."""
    idle = values.get("idle", 0.0) + values.get("iowait", 0.0)
    guests = values.get("guest", 0.0) + values.get("guest_nice", 0.0)  # counted in user
    lowered = values.get("nice", 0.0) if niceness <= 0 else 0.0
    return sum(values.values()) - idle - guests - lowered


def own_niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else 0


def _allowed_cpus() -> list[int]:
    """The CPUs this process may run on (a container's cpuset), where the OS says."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return []


def _own_tree() -> list[psutil.Process]:
    """This process and its live descendants (the engine workers)."""
    me = psutil.Process()
    try:
        return [me, *me.children(recursive=True)]
    except psutil.Error:
        return [me]


def _tree_s(process: psutil.Process) -> float:
    """CPU seconds used by `process` and its children already reaped (0 once it ended)."""
    try:
        times = process.cpu_times()
    except psutil.Error:  # ended between the listing and the reading
        return 0.0
    return times.user + times.system + times.children_user + times.children_system


def _mildly_lowered_s(own: set[int]) -> dict[tuple[int, float], float]:
    """CPU seconds of each live program (not ours) at niceness 1 to `MAKES_WAY_NICENESS` - 1:
    lowered, but not so far that it leaves our threads their cores."""
    found: dict[tuple[int, float], float] = {}
    for process in psutil.process_iter(["nice", "cpu_times", "create_time"]):
        info = process.info
        nice, times = info.get("nice"), info.get("cpu_times")
        if process.pid in own or times is None or not 0 < (nice or 0) < MAKES_WAY_NICENESS:
            continue
        found[(process.pid, info.get("create_time") or 0.0)] = times.user + times.system
    return found


def _busy_s(times: object) -> float:
    fields = getattr(times, "_fields", ())
    return sum(getattr(times, name) for name in fields if name not in NOT_BUSY_FIELDS)
