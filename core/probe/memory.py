"""Memory probe: RAM, what is available now, swap, and a container's cgroup limit.

Linux reads /proc/meminfo and the cgroup files under `ctx.root`; macOS parses `sysctl -a`
text. "Available" on macOS and Windows comes from psutil, and only on the live machine.
Bandwidth stays None: calibration measures it.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from hearthside.core.probe.base import ProbeContext, ProbeResult, read_text_or_none
from hearthside.core.probe.profile import MemoryInfo, ProbeError

SOURCE = "memory"
CGROUP_V2_LIMIT = "/sys/fs/cgroup/memory.max"
CGROUP_V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
# cgroup v1 writes "no limit" as PAGE_COUNTER_MAX rounded to pages (9223372036854771712 on
# 4 KiB pages, other values on 16/64 KiB pages); no real machine has 2**60 bytes.
UNLIMITED_THRESHOLD_BYTES = 1 << 60
SWAP_USAGE_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


@dataclass(frozen=True)
class Meminfo:
    total_bytes: int | None = None
    available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None


def parse_meminfo(text: str) -> Meminfo:
    """/proc/meminfo → bytes. Sample line: "MemTotal:       24683656 kB"."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+):\s+(\d+)(?:\s+kB)?\s*", line)
        if match:
            unit = 1024 if line.rstrip().endswith("kB") else 1
            values[match.group(1)] = int(match.group(2)) * unit
    return Meminfo(
        total_bytes=values.get("MemTotal"),
        available_bytes=values.get("MemAvailable"),
        swap_total_bytes=values.get("SwapTotal"),
        swap_free_bytes=values.get("SwapFree"),
    )


def parse_cgroup_limit(text: str) -> int | None:
    """memory.max ("max" or "8589934592") or v1 memory.limit_in_bytes → bytes; None = no limit."""
    value = text.strip()
    if value == "max" or not value.isdigit():
        return None
    limit = int(value)
    return None if limit >= UNLIMITED_THRESHOLD_BYTES else limit


def effective_cgroup_limit(limit_bytes: int | None, total_bytes: int | None) -> int | None:
    """The limit only matters (and is only reported) when it is below physical RAM."""
    if limit_bytes is None:
        return None
    if total_bytes is not None and limit_bytes >= total_bytes:
        return None
    return limit_bytes


def parse_swap_usage(text: str) -> tuple[int, int] | None:
    """sysctl vm.swapusage → (total, free) bytes.

    Sample: "vm.swapusage: total = 2048.00M  used = 1035.25M  free = 1012.75M  (encrypted)".
    """
    total = re.search(r"total = ([\d.]+)([KMG])", text)
    free = re.search(r"free = ([\d.]+)([KMG])", text)
    if total is None or free is None:
        return None
    return (
        round(float(total.group(1)) * SWAP_USAGE_UNITS[total.group(2)]),
        round(float(free.group(1)) * SWAP_USAGE_UNITS[free.group(2)]),
    )


def memory_info_from_sysctl(text: str) -> MemoryInfo:
    """`sysctl -a` text → total RAM and swap. Sample line: "hw.memsize: 17179869184"."""
    total = re.search(r"^hw\.memsize:\s*(\d+)\s*$", text, re.MULTILINE)
    swap_line = re.search(r"^vm\.swapusage:.*$", text, re.MULTILINE)
    swap = parse_swap_usage(swap_line.group(0)) if swap_line else None
    return MemoryInfo(
        total_bytes=int(total.group(1)) if total else None,
        swap_total_bytes=swap[0] if swap else None,
        swap_free_bytes=swap[1] if swap else None,
    )


def is_live_machine(ctx: ProbeContext) -> bool:
    """psutil describes this process's machine, so it may only fill in for a real probe."""
    return ctx.root == Path("/") and ctx.platform == sys.platform


def read_cgroup_limit(ctx: ProbeContext) -> int | None:
    for path in (CGROUP_V2_LIMIT, CGROUP_V1_LIMIT):
        text = read_text_or_none(ctx.path(path))
        if text is not None:
            return parse_cgroup_limit(text)
    return None


def probe_linux(ctx: ProbeContext) -> ProbeResult:
    text = read_text_or_none(ctx.path("/proc/meminfo"))
    if text is None:
        return ProbeResult(memory=MemoryInfo(), errors=(ProbeError(SOURCE, "no /proc/meminfo"),))
    meminfo = parse_meminfo(text)
    memory = MemoryInfo(
        total_bytes=meminfo.total_bytes,
        available_bytes=meminfo.available_bytes,
        cgroup_limit_bytes=effective_cgroup_limit(read_cgroup_limit(ctx), meminfo.total_bytes),
        swap_total_bytes=meminfo.swap_total_bytes,
        swap_free_bytes=meminfo.swap_free_bytes,
    )
    return ProbeResult(memory=memory)


def probe_darwin(ctx: ProbeContext) -> ProbeResult:
    text = ctx.run_command(["sysctl", "-a"])
    if text is None:
        return ProbeResult(memory=MemoryInfo(), errors=(ProbeError(SOURCE, "sysctl failed"),))
    memory = memory_info_from_sysctl(text)
    if is_live_machine(ctx):
        memory = replace(memory, available_bytes=psutil.virtual_memory().available)
    return ProbeResult(memory=memory)


def probe_fallback(ctx: ProbeContext) -> ProbeResult:
    if not is_live_machine(ctx):
        return ProbeResult(memory=MemoryInfo())
    virtual = psutil.virtual_memory()
    swap = psutil.swap_memory()
    return ProbeResult(
        memory=MemoryInfo(
            total_bytes=virtual.total,
            available_bytes=virtual.available,
            swap_total_bytes=swap.total,
            swap_free_bytes=swap.free,
        )
    )


def probe(ctx: ProbeContext) -> ProbeResult:
    try:
        if ctx.platform == "darwin":
            return probe_darwin(ctx)
        if ctx.platform.startswith("linux"):
            return probe_linux(ctx)
        return probe_fallback(ctx)
    except (OSError, ValueError) as error:
        message = f"{type(error).__name__}: {error}"
        return ProbeResult(memory=MemoryInfo(), errors=(ProbeError(SOURCE, message),))
