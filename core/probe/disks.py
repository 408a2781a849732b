"""Disk probe: which mount, device and filesystem hold the models folder, SSD or spinning,
its read-ahead, and how much room is left. Read bandwidth is measured later by calibration.

Linux reads /proc/mounts and /sys/block under `ctx.root`; other systems ask psutil for the
mount table on the live machine. Sizes come from `shutil.disk_usage`, also live only.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import psutil

from hearthside.core.probe.base import ProbeContext, ProbeResult, read_text_or_none
from hearthside.core.probe.profile import DiskInfo, ProbeError

SOURCE = "disks"
MAX_STACK_DEPTH = 8  # dm devices stack (LUKS on LVM on RAID); a loop in sysfs must not hang us
PARTITION_PATTERNS = (
    re.compile(r"(nvme\d+n\d+)p\d+"),  # nvme0n1p2
    re.compile(r"((?:mmcblk|loop|nbd)\d+)p\d+"),  # mmcblk0p1
    re.compile(r"((?:sd|vd|hd|xvd)[a-z]+)\d+"),  # sda3, vdb1, xvda1
)


@dataclass(frozen=True)
class Mount:
    device: str
    mount_point: str
    filesystem: str


def _unescape_octal(field: str) -> str:
    """/proc/mounts writes space as \\040, tab as \\011, backslash as \\134."""
    return re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), field)


def parse_proc_mounts(text: str) -> list[Mount]:
    """Sample line: "/dev/nvme0n1p2 / ext4 rw,relatime,errors=remount-ro 0 0"."""
    mounts = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 3:
            device, mount_point, filesystem = (_unescape_octal(field) for field in fields[:3])
            mounts.append(Mount(device, mount_point, filesystem))
    return mounts


def find_mount(mounts: Sequence[Mount], path: PurePosixPath) -> Mount | None:
    """The mount holding `path`: the longest mount point above it; the last one mounted wins
    a tie, because it hides the earlier ones."""
    best: Mount | None = None
    for mount in mounts:
        if not path.is_relative_to(mount.mount_point):
            continue
        if best is None or len(mount.mount_point) >= len(best.mount_point):
            best = mount
    return best


def parent_disk_name(name: str) -> str:
    """A partition's whole-disk name: "nvme0n1p2" → "nvme0n1", "sda3" → "sda"."""
    for pattern in PARTITION_PATTERNS:
        match = pattern.fullmatch(name)
        if match:
            return match.group(1)
    return name


def _list_names(folder: Path) -> list[str]:
    try:
        return sorted(entry.name for entry in folder.iterdir())
    except OSError:
        return []


def device_mapper_name(ctx: ProbeContext, mapper_name: str) -> str | None:
    """The kernel name of a mapper device ("vg-root" → "dm-0"), via /sys/block/dm-N/dm/name."""
    for name in _list_names(ctx.path("/sys/block")):
        text = read_text_or_none(ctx.path(f"/sys/block/{name}/dm/name"))
        if text is not None and text.strip() == mapper_name:
            return name
    return None


def block_device_name(ctx: ProbeContext, device: str) -> str | None:
    """The kernel name ("nvme0n1p2", "dm-0") of a mount source, None for tmpfs/overlay/NFS."""
    if not device.startswith("/dev/"):
        return None
    if ctx.root == Path("/"):
        device = os.path.realpath(device)  # /dev/mapper/x and /dev/disk/by-* are symlinks
    if device.startswith("/dev/mapper/"):
        return device_mapper_name(ctx, device.removeprefix("/dev/mapper/"))
    return device.removeprefix("/dev/")


def underlying_disks(ctx: ProbeContext, name: str, depth: int = 0) -> list[str]:
    """Whole disks under a block device: a partition's disk, a dm device's slaves' disks."""
    slaves = _list_names(ctx.path(f"/sys/block/{name}/slaves"))
    if slaves and depth < MAX_STACK_DEPTH:
        return [disk for slave in slaves for disk in underlying_disks(ctx, slave, depth + 1)]
    if ctx.path(f"/sys/block/{name}").is_dir():
        return [name]
    return [parent_disk_name(name)]


# Paravirtual disks (virtio "vda", Xen "xvda") report rotational=1 whatever the host's media
# is, so their flag says nothing.
_VIRTUAL_DISK_PREFIXES = ("vd", "xvd")


def read_rotational(ctx: ProbeContext, disks: Iterable[str]) -> bool | None:
    """True when any disk under the mount spins: the slowest member sets the pace."""
    real = [disk for disk in disks if not disk.startswith(_VIRTUAL_DISK_PREFIXES)]
    flags = [read_text_or_none(ctx.path(f"/sys/block/{disk}/queue/rotational")) for disk in real]
    known = [flag.strip() == "1" for flag in flags if flag is not None]
    return any(known) if known else None


def read_ahead_bytes(ctx: ProbeContext, name: str) -> int | None:
    """The read-ahead of the device a filesystem on `name` reads through: a dm device has its
    own, a partition shares its disk's queue. Sample file content: "8192\n" (KiB)."""
    for device in (name, parent_disk_name(name)):
        text = read_text_or_none(ctx.path(f"/sys/block/{device}/queue/read_ahead_kb"))
        if text is not None and text.strip().isdigit():
            return int(text.strip()) * 1024
    return None


def _existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def with_usage(disk: DiskInfo, path: Path) -> DiskInfo:
    usage = shutil.disk_usage(_existing_ancestor(path))
    return replace(disk, total_bytes=usage.total, free_bytes=usage.free)


def describe_linux(ctx: ProbeContext, models_dir: Path) -> DiskInfo:
    text = read_text_or_none(ctx.path("/proc/mounts"))
    if text is None:
        raise OSError("cannot read /proc/mounts")
    mount = find_mount(parse_proc_mounts(text), PurePosixPath(models_dir))
    if mount is None:
        return DiskInfo(path=str(models_dir))
    name = block_device_name(ctx, mount.device)
    rotational = read_rotational(ctx, underlying_disks(ctx, name)) if name else None
    return DiskInfo(
        path=str(models_dir),
        mount_point=mount.mount_point,
        device=mount.device,
        filesystem=mount.filesystem,
        rotational=rotational,
        read_ahead_bytes=read_ahead_bytes(ctx, name) if name else None,
    )


def describe_from_psutil(models_dir: Path) -> DiskInfo:
    """macOS/Windows: the live mount table; no rotational flag without platform tools."""
    mounts = [
        Mount(part.device, part.mountpoint, part.fstype)
        for part in psutil.disk_partitions(all=False)
    ]
    mount = max(
        (m for m in mounts if models_dir.is_relative_to(m.mount_point)),
        key=lambda m: len(m.mount_point),
        default=None,
    )
    if mount is None:
        return DiskInfo(path=str(models_dir))
    return DiskInfo(
        path=str(models_dir),
        mount_point=mount.mount_point,
        device=mount.device,
        filesystem=mount.filesystem,
    )


def describe_models_dir(ctx: ProbeContext, models_dir: Path) -> DiskInfo:
    live = ctx.root == Path("/")
    # On the live machine symlinks decide which mount really holds the folder.
    lookup_path = Path(os.path.realpath(models_dir)) if live else models_dir
    if ctx.platform.startswith("linux"):
        disk = describe_linux(ctx, lookup_path)
    elif live:
        disk = describe_from_psutil(lookup_path)
    else:
        disk = DiskInfo(path=str(lookup_path))
    disk = replace(disk, path=str(models_dir))
    return with_usage(disk, lookup_path) if live else disk


def probe(ctx: ProbeContext) -> ProbeResult:
    if ctx.models_dir is None:
        return ProbeResult()
    try:
        return ProbeResult(disks=(describe_models_dir(ctx, ctx.models_dir),))
    except (OSError, ValueError) as error:
        message = f"{type(error).__name__}: {error}"
        disk = DiskInfo(path=str(ctx.models_dir))
        return ProbeResult(disks=(disk,), errors=(ProbeError(SOURCE, message),))
