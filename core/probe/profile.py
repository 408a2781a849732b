"""`HardwareProfile`: what this machine (or a what-if spec) has, as plain frozen data.

Units are in the field names: bytes, bytes per second, hertz. `None` always means "unknown",
never zero. A device Hearthside cannot use is listed in `unsupported` with the reason; a probe
that failed is an entry in `errors`; `advice` says what to do about either.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from hearthside.core.serialize import from_jsonable, to_jsonable

SCHEMA_VERSION = 1

GpuVendor = Literal["nvidia", "amd", "apple", "intel", "other"]
ProfileSource = Literal["probe", "spec", "fixture"]

# The ISA flags the planner and the engine build care about, in Linux /proc/cpuinfo spelling
# (other OSes' names are translated to these).
KNOWN_CPU_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "neon",
    "sve",
    "sve2",
    "dotprod",
    "i8mm",
    "bf16",
)


@dataclass(frozen=True)
class CpuInfo:
    arch: str  # "x86_64" | "arm64" | ...
    vendor: str | None = None  # "GenuineIntel", "AuthenticAMD", "Apple", "ARM", ...
    model: str | None = None  # marketing name, e.g. "AMD EPYC 9654 96-Core Processor"
    flags: tuple[str, ...] = ()  # subset of KNOWN_CPU_FLAGS, sorted
    physical_cores: int | None = None
    logical_cores: int | None = None
    performance_cores: int | None = None  # hybrid CPUs; equals physical_cores otherwise
    efficiency_cores: int | None = None
    sockets: int | None = None
    numa_nodes: int | None = None
    l2_cache_bytes: int | None = None  # total over all cores
    l3_cache_bytes: int | None = None  # total over all sockets
    max_frequency_hz: int | None = None

    def has(self, flag: str) -> bool:
        return flag in self.flags


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int | None = None
    available_bytes: int | None = None  # MemAvailable, or less when a cgroup limit leaves less
    # this process's cgroup memory limit (the smallest up its cgroup tree), when lower than total
    cgroup_limit_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_free_bytes: int | None = None
    bandwidth_bytes_per_s: int | None = None  # spec sheet or calibration; None until known

    @property
    def usable_bytes(self) -> int | None:
        """What a process may really use: the smaller of RAM and the cgroup limit."""
        limits = [v for v in (self.total_bytes, self.cgroup_limit_bytes) if v is not None]
        return min(limits) if limits else None


@dataclass(frozen=True)
class GpuInfo:
    vendor: GpuVendor
    name: str
    arch: str | None = None  # "sm_86", "gfx906", "apple-m3", ...
    index: int | None = None  # the vendor's device index
    vram_total_bytes: int | None = None
    vram_free_bytes: int | None = None
    memory_bandwidth_bytes_per_s: int | None = None
    unified_memory: bool = False  # shares the system RAM (Apple, GB10, Strix Halo, GH200 C2C)
    integrated: bool = False
    compute_units: int | None = None  # SMs (NVIDIA), CUs (AMD), GPU cores (Apple)
    pcie_generation: int | None = None
    pcie_width: int | None = None
    driver_version: str | None = None
    runtime_version: str | None = None  # CUDA / ROCm / Metal version the driver offers
    pci_bus_id: str | None = None
    recommended_working_set_bytes: int | None = None  # Apple Metal's wired-memory ceiling


@dataclass(frozen=True)
class DiskInfo:
    path: str  # the folder this entry describes (the models folder)
    mount_point: str | None = None
    device: str | None = None
    filesystem: str | None = None
    rotational: bool | None = None
    total_bytes: int | None = None
    free_bytes: int | None = None
    read_bytes_per_s: int | None = None  # measured by calibration; None until then
    # the kernel's read-ahead for the device the folder's filesystem sits on
    # (/sys/block/<dev>/queue/read_ahead_kb): a page fault on a mapped model reads a window
    # of about this size around it (twice it once llama.cpp fadvises the file sequential)
    read_ahead_bytes: int | None = None


@dataclass(frozen=True)
class EngineDevice:
    name: str  # ggml's device name, e.g. "CUDA0", "ROCm0", "MTL0", "CPU"
    description: str
    kind: Literal["cpu", "gpu", "igpu", "accel"]
    memory_total_bytes: int | None = None
    memory_free_bytes: int | None = None


@dataclass(frozen=True)
class EngineInfo:
    """What the installed llama.cpp can drive."""

    package_version: str | None = None
    backends: tuple[str, ...] = ()  # ggml backend registry names: "CPU", "CUDA", "ROCm", "MTL"
    devices: tuple[EngineDevice, ...] = ()
    gpu_offload: bool = False
    system_info: str | None = None  # llama_print_system_info, as printed


@dataclass(frozen=True)
class UnsupportedDevice:
    name: str
    reason: str


@dataclass(frozen=True)
class ProbeError:
    source: str  # the probe module that failed, e.g. "nvidia"
    message: str


@dataclass(frozen=True)
class Advice:
    message: str
    fix: str | None = None  # a command to run, when there is one


@dataclass(frozen=True)
class HardwareProfile:
    cpu: CpuInfo
    memory: MemoryInfo
    os: str  # "linux" | "darwin" | "windows"
    os_version: str | None = None
    gpus: tuple[GpuInfo, ...] = ()
    disks: tuple[DiskInfo, ...] = ()
    engine: EngineInfo | None = None
    unsupported: tuple[UnsupportedDevice, ...] = ()
    errors: tuple[ProbeError, ...] = ()
    advice: tuple[Advice, ...] = ()
    source: ProfileSource = "probe"
    schema: int = field(default=SCHEMA_VERSION)

    def to_dict(self) -> dict[str, Any]:
        return dict(to_jsonable(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        if data.get("schema", SCHEMA_VERSION) > SCHEMA_VERSION:
            raise ValueError("This hardware profile comes from a newer Hearthside.")
        return from_jsonable(cls, data)

    @classmethod
    def from_json(cls, text: str) -> HardwareProfile:
        return cls.from_dict(json.loads(text))
