"""Memory probe: RAM, what is available now, swap, and this process's cgroup memory limit.

Linux reads /proc/meminfo and the cgroup files under `ctx.root`; macOS parses `sysctl -a`
text. "Available" on macOS and Windows comes from psutil, and only on the live machine.
Bandwidth stays None: calibration measures it.

The cgroup limit is the process's own, not the root cgroup's: /proc/self/cgroup names its
cgroup (v2, v1's memory controller, or both on a hybrid machine), /proc/self/mountinfo where
each hierarchy is mounted, and the smallest limit from that cgroup up to the mount's top wins
(a parent's limit binds its children). What is left under it (limit − usage + the inactive
file cache the kernel reclaims first) caps "available".
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import psutil

from hearthside.core.probe.base import ProbeContext, ProbeResult, read_text_or_none
from hearthside.core.probe.profile import MemoryInfo, ProbeError

SOURCE = "memory"
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


CgroupVersion = Literal[1, 2]
LIMIT_FILE: dict[CgroupVersion, str] = {2: "memory.max", 1: "memory.limit_in_bytes"}
USAGE_FILE: dict[CgroupVersion, str] = {2: "memory.current", 1: "memory.usage_in_bytes"}
# v1's plain `inactive_file` counts the cgroup's own pages only; usage counts its children too.
INACTIVE_FILE_STAT: dict[CgroupVersion, str] = {2: "inactive_file", 1: "total_inactive_file"}


@dataclass(frozen=True)
class CgroupMount:
    version: CgroupVersion
    mount_point: str  # "/sys/fs/cgroup/memory"
    root: str = "/"  # the cgroup shown at the mount point (a container's own, without cgroupns)


# Where the hierarchies usually are, for a tree without /proc/self/mountinfo: pure v2, a
# hybrid machine's v2, v1's memory controller.
DEFAULT_CGROUP_MOUNTS = (
    CgroupMount(2, "/sys/fs/cgroup"),
    CgroupMount(2, "/sys/fs/cgroup/unified"),
    CgroupMount(1, "/sys/fs/cgroup/memory"),
)


@dataclass(frozen=True)
class CgroupLevel:
    """One cgroup with a memory limit, from the process's own up to the top of the mount."""

    limit_bytes: int
    usage_bytes: int | None = None
    inactive_file_bytes: int = 0

    @property
    def headroom_bytes(self) -> int | None:
        """What may still be allocated here before the kernel reclaims more than cold cache."""
        if self.usage_bytes is None:
            return None
        return max(0, self.limit_bytes - self.usage_bytes + self.inactive_file_bytes)


@dataclass(frozen=True)
class CgroupMemory:
    limit_bytes: int | None = None  # the smallest limit over the process's cgroup and ancestors
    available_bytes: int | None = None  # the least headroom under any of those limits


def parse_proc_self_cgroup(text: str) -> dict[CgroupVersion, str]:
    """/proc/self/cgroup → the process's v2 cgroup and its v1 memory cgroup, where listed.

    Samples: "0::/user.slice/user-1000.slice/session-2.scope" (v2),
    "4:memory:/process_api/c2c63fc8667592b80f7bce20b1638ef9" (v1),
    "6:memory,hugetlb:/docker/3f2a9c" (v1, controllers mounted together).
    """
    paths: dict[CgroupVersion, str] = {}
    for line in text.splitlines():
        hierarchy, _, rest = line.strip().partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if hierarchy == "0" and controllers == "":
            paths[2] = path
        elif "memory" in controllers.split(","):
            paths[1] = path
    return paths


def parse_cgroup_mounts(mountinfo: str) -> tuple[CgroupMount, ...]:
    """/proc/self/mountinfo → the cgroup2 mounts and the v1 mounts with the memory controller.

    Samples (fields: id, parent, dev, root, mount point, options, [optional…], -, type,
    source, super options):
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2
    rw,nsdelegate,memory_recursiveprot" (pure v2);
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory" (v1);
    "1290 1283 0:32 /docker/3f2a9c /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime
    master:15 - cgroup cgroup rw,memory" (v1 in a container without a cgroup namespace).
    """
    mounts = []
    for line in mountinfo.splitlines():
        fields, _, tail = line.partition(" - ")
        before, after = fields.split(), tail.split()
        if len(before) < 5 or len(after) < 3:
            continue
        root, mount_point = _unescape_mount_path(before[3]), _unescape_mount_path(before[4])
        if after[0] == "cgroup2":
            mounts.append(CgroupMount(2, mount_point, root))
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            mounts.append(CgroupMount(1, mount_point, root))
    return tuple(mounts)


def _unescape_mount_path(field: str) -> str:
    """mountinfo writes a space, tab, newline or backslash in a path as an octal escape."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def parse_memory_stat(text: str) -> dict[str, int]:
    """memory.stat → counters. Sample lines: "inactive_file 991232", "total_rss 1826816"."""
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[name] = int(value)
    return values


def cgroup_chain(mount: CgroupMount, cgroup_path: str) -> list[str]:
    """The directories from the cgroup at `cgroup_path` up to `mount`'s top, innermost first;
    only the top when the path lies outside what the mount shows (another cgroup namespace)."""
    relative = posixpath.relpath(posixpath.normpath(cgroup_path), mount.root)
    if relative == "." or relative.startswith(".."):
        return [mount.mount_point]
    parts = relative.split("/")
    return [
        posixpath.join(mount.mount_point, *parts[:depth]) for depth in range(len(parts), -1, -1)
    ]


def combine_levels(levels: Sequence[CgroupLevel]) -> CgroupMemory:
    headrooms = [level.headroom_bytes for level in levels if level.headroom_bytes is not None]
    return CgroupMemory(
        limit_bytes=min((level.limit_bytes for level in levels), default=None),
        available_bytes=min(headrooms, default=None),
    )


def smaller(first: int | None, second: int | None) -> int | None:
    known = [value for value in (first, second) if value is not None]
    return min(known) if known else None


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


def read_cgroup_memory(ctx: ProbeContext) -> CgroupMemory:
    own = parse_proc_self_cgroup(read_text_or_none(ctx.path("/proc/self/cgroup")) or "")
    mounts = parse_cgroup_mounts(read_text_or_none(ctx.path("/proc/self/mountinfo")) or "")
    levels = [
        level
        for mount in mounts or DEFAULT_CGROUP_MOUNTS
        for level in _limited_levels(ctx, mount, own.get(mount.version, "/"))
    ]
    return combine_levels(levels)


def _limited_levels(
    ctx: ProbeContext, mount: CgroupMount, cgroup_path: str
) -> Iterator[CgroupLevel]:
    chain = cgroup_chain(mount, cgroup_path)
    if not ctx.path(chain[0]).is_dir():
        chain = [mount.mount_point]  # the path belongs to another cgroup namespace
    for directory in chain:
        level = _read_level(ctx, directory, mount.version)
        if level is not None:
            yield level


def _read_level(ctx: ProbeContext, directory: str, version: CgroupVersion) -> CgroupLevel | None:
    def read(name: str) -> str:
        return read_text_or_none(ctx.path(f"{directory}/{name}")) or ""

    limit = parse_cgroup_limit(read(LIMIT_FILE[version]))
    if limit is None:
        return None
    usage = read(USAGE_FILE[version]).strip()
    return CgroupLevel(
        limit_bytes=limit,
        usage_bytes=int(usage) if usage.isdigit() else None,
        inactive_file_bytes=parse_memory_stat(read("memory.stat")).get(
            INACTIVE_FILE_STAT[version], 0
        ),
    )


def probe_linux(ctx: ProbeContext) -> ProbeResult:
    text = read_text_or_none(ctx.path("/proc/meminfo"))
    if text is None:
        return ProbeResult(memory=MemoryInfo(), errors=(ProbeError(SOURCE, "no /proc/meminfo"),))
    meminfo = parse_meminfo(text)
    cgroup = read_cgroup_memory(ctx)
    limit = effective_cgroup_limit(cgroup.limit_bytes, meminfo.total_bytes)
    available = meminfo.available_bytes
    if limit is not None:
        available = smaller(available, cgroup.available_bytes)
    memory = MemoryInfo(
        total_bytes=meminfo.total_bytes,
        available_bytes=available,
        cgroup_limit_bytes=limit,
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
