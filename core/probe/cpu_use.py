"""How much CPU other programs used between two moments: the direct sign of a busy machine.

Repeats that disagree only hint at it, and fail both ways on a 2-core VM: an idle one's
short engine probes varied by 25-72%, while two busy loops that take the cores steadily make
every measurement slow but steady. So Hearthside counts instead: the CPU time the machine
spent busy (on the CPUs this process may run on; steal, time the hypervisor gave to the
VM's neighbours, included) minus what this process and its descendants used (the engine
workers), over the wall time between two snapshots. Programs at a lower priority than ours
(the kernel's "nice" time) are left out, as the thread governor leaves them out: they make
way for our threads at once (native llama-bench, SmolLM2 Q4_1, 2 threads beside two
`nice -n 19` busy loops decoded at 97.8 tok/s, 0.94x quiet; beside one un-niced loop, 4.3).

A descendant that is re-parented away (orphaned) before it is reaped counts as another
program; Hearthside reaps its engine workers.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

import psutil

# Cores other programs kept busy on average while measuring beyond which they disturbed it:
# llama.cpp's threads meet at a barrier after every matrix, so half a core taken slows a run
# on every core. Measured (2-core Zen 4 VM): idle 0.007, one busy loop elsewhere 1.009.
OTHERS_BUSY_CORES = 0.5


@dataclass(frozen=True)
class CpuUse:
    """CPU seconds spent busy by the machine (on this process's CPUs) and by this process's
    tree up to one moment, and that moment (monotonic seconds)."""

    machine_busy_s: float
    own_s: float
    at_s: float
    cores: int


def cpu_use_now() -> CpuUse:
    """The counters now."""
    cpus = _allowed_cpus()
    per_cpu = psutil.cpu_times(percpu=True)
    chosen = [per_cpu[i] for i in cpus if i < len(per_cpu)] if cpus else per_cpu
    niceness = own_niceness()
    return CpuUse(
        sum(busy_seconds(times._asdict(), niceness) for times in chosen),
        _own_tree_s(),
        time.monotonic(),
        len(chosen),
    )


def others_cores(before: CpuUse, after: CpuUse) -> float:
    """How many cores other programs kept busy on average between the two snapshots (0 when
    no time passed; never below 0, since the counters tick at different moments)."""
    wall = after.at_s - before.at_s
    if wall <= 0:
        return 0.0
    others = (after.machine_busy_s - before.machine_busy_s) - (after.own_s - before.own_s)
    return max(0.0, others / wall)


def busy_seconds(values: Mapping[str, float], niceness: int) -> float:
    """The CPU time that can take a core from us, of the kernel's counters (`values`, as
    psutil names them): all but idle time, and but programs running at a lower priority
    (the kernel's "nice" time) while we are not lowered ourselves: the kernel gives a program
    at nice 10 a tenth of our threads' share, so a niced build or backup makes way at once."""
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


def _own_tree_s() -> float:
    """CPU seconds used by this process, its live descendants and the ones already reaped."""
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:  # ended between the listing and the reading
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total
