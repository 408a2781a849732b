"""What every probe source shares: its input (`ProbeContext`) and its output (`ProbeResult`).

Each source is a module in this package with one function `probe(ctx) -> ProbeResult`. It
never raises for "no such device" (that is an empty result) and keeps parsing in pure
functions over text or a root folder, so tests feed it recorded output from other machines.
"""

from __future__ import annotations

import platform as platform_module
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

# engine_build.py is standard-library only (bootstrap runs it before installing anything),
# so its command runner can serve every probe.
from hearthside.core.probe.engine_build import run_command
from hearthside.core.probe.profile import (
    CpuInfo,
    DiskInfo,
    EngineInfo,
    GpuInfo,
    HardwareProfile,
    MemoryInfo,
    ProbeError,
    ProfileSource,
    UnsupportedDevice,
)

CommandRunner = Callable[[Sequence[str]], str | None]


def read_text_or_none(path: Path) -> str | None:
    """A sysfs/procfs file's text, or None when it is missing or unreadable (some sysfs
    attributes fail with EINVAL/EIO in VMs; that is "unknown", not an error)."""
    try:
        return path.read_text()
    except OSError:
        return None


def os_name(platform_name: str) -> str:
    return {"win32": "windows", "darwin": "darwin"}.get(platform_name, "linux")


@dataclass(frozen=True)
class ProbeContext:
    """Where a probe looks. Tests point `root` at a recorded /proc + /sys tree and
    `run_command` at recorded tool output."""

    root: Path = Path("/")
    platform: str = sys.platform  # "linux" | "darwin" | "win32"
    machine: str = field(default_factory=platform_module.machine)  # "x86_64" | "arm64" | "aarch64"
    models_dir: Path | None = None
    run_command: CommandRunner = run_command

    def path(self, absolute: str) -> Path:
        """`absolute` (e.g. "/proc/cpuinfo") under this context's root."""
        return self.root / absolute.lstrip("/")


@dataclass(frozen=True)
class ProbeResult:
    cpu: CpuInfo | None = None
    memory: MemoryInfo | None = None
    gpus: tuple[GpuInfo, ...] = ()
    disks: tuple[DiskInfo, ...] = ()
    engine: EngineInfo | None = None
    unsupported: tuple[UnsupportedDevice, ...] = ()
    errors: tuple[ProbeError, ...] = ()


def merge_results(
    results: Sequence[ProbeResult],
    *,
    os: str,
    os_version: str | None = None,
    machine: str = "x86_64",
    source: ProfileSource = "probe",
) -> HardwareProfile:
    """One profile from several sources' results: the first CPU/memory/engine found wins;
    devices, errors and unsupported entries add up. Advice is added later (advice.py)."""
    cpu = next((r.cpu for r in results if r.cpu is not None), None)
    memory = next((r.memory for r in results if r.memory is not None), None)
    engine = next((r.engine for r in results if r.engine is not None), None)
    return HardwareProfile(
        cpu=cpu or CpuInfo(arch=machine),
        memory=memory or MemoryInfo(),
        os=os,
        os_version=os_version,
        gpus=tuple(gpu for r in results for gpu in r.gpus),
        disks=tuple(disk for r in results for disk in r.disks),
        engine=engine,
        unsupported=tuple(item for r in results for item in r.unsupported),
        errors=tuple(error for r in results for error in r.errors),
        source=source,
    )
