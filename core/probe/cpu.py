"""CPU probe: model, ISA flags, cores (physical, logical, P/E), sockets, NUMA, caches, clock.

Linux reads /proc/cpuinfo and /sys under `ctx.root`; macOS parses `sysctl -a` text; other
systems get what psutil and `platform` know. Parsers are pure functions over text.
"""

from __future__ import annotations

import math
import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from hearthside.core.probe.base import ProbeContext, ProbeResult, read_text_or_none
from hearthside.core.probe.profile import KNOWN_CPU_FLAGS, CpuInfo, ProbeError

SOURCE = "cpu"

# Arm /proc/cpuinfo "Features" spellings of the flags we track.
ARM_FLAG_NAMES = {"asimd": "neon", "asimddp": "dotprod"}

ARM_IMPLEMENTERS = {
    "0x41": "ARM",
    "0x4e": "NVIDIA",
    "0x51": "Qualcomm",
    "0x61": "Apple",
    "0x48": "HiSilicon",
    "0xc0": "Ampere",
}

# (implementer, part) → core name. NVIDIA Grace and AWS Graviton4 both report Neoverse V2,
# Graviton2 and Ampere Altra report Neoverse N1.
ARM_PARTS = {
    ("0x41", "0xd0c"): "Neoverse-N1",
    ("0x41", "0xd40"): "Neoverse-V1",
    ("0x41", "0xd49"): "Neoverse-N2",
    ("0x41", "0xd4f"): "Neoverse-V2",
    ("0x41", "0xd84"): "Neoverse-V3",
    ("0x41", "0xd8e"): "Neoverse-N3",
    ("0x41", "0xd0b"): "Cortex-A76",
    ("0x41", "0xd05"): "Cortex-A55",
    ("0xc0", "0xac3"): "AmpereOne",
}

# sysctl keys (value 1 = present) → our flag spelling.
DARWIN_FLAG_KEYS = {
    "hw.optional.AdvSIMD": "neon",
    "hw.optional.arm.AdvSIMD": "neon",
    "hw.optional.neon": "neon",
    "hw.optional.arm.FEAT_DotProd": "dotprod",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.sse4_2": "sse4_2",
    "hw.optional.avx1_0": "avx",
    "hw.optional.avx2_0": "avx2",
    "hw.optional.fma": "fma",
    "hw.optional.avx512f": "avx512f",
    "hw.optional.avx512bw": "avx512bw",
    "hw.optional.avx512vl": "avx512vl",
}

ARCH_ALIASES = {"aarch64": "arm64", "arm64": "arm64", "amd64": "x86_64", "x86_64": "x86_64"}

SIZE_SUFFIXES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


@dataclass(frozen=True)
class CpuinfoSummary:
    """What /proc/cpuinfo says, before sysfs adds topology."""

    vendor: str | None = None
    model: str | None = None
    flags: tuple[str, ...] = ()
    processors: int = 0
    physical_cores: int | None = None  # from "physical id" + "core id", x86 only
    sockets: int | None = None


@dataclass(frozen=True)
class Topology:
    logical_cores: int
    physical_cores: int
    sockets: int


# --- pure parsers -------------------------------------------------------------------------


def normalize_arch(machine: str) -> str:
    return ARCH_ALIASES.get(machine.lower(), machine.lower())


def parse_cpu_list(text: str) -> frozenset[int]:
    """ "0-15,17" (sysfs cpu list syntax) → {0, ..., 15, 17}; "" → empty."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return frozenset(cpus)


def parse_cache_size(text: str) -> int:
    """ "32768K" (sysfs cache size) → 33554432 bytes."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text.upper())
    if match is None:
        raise ValueError(f"unreadable cache size {text!r}")
    return int(match.group(1)) * SIZE_SUFFIXES[match.group(2)]


def translate_flags(raw_flags: Iterable[str]) -> tuple[str, ...]:
    """Native flag names → the KNOWN_CPU_FLAGS subset, sorted ("asimd" → "neon")."""
    translated = {ARM_FLAG_NAMES.get(flag, flag) for flag in raw_flags}
    return tuple(sorted(translated.intersection(KNOWN_CPU_FLAGS)))


def split_cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    """/proc/cpuinfo → one {key: value} dict per processor block.

    Sample lines: "model name\t: AMD Ryzen 5 3600 6-Core Processor", "CPU part\t: 0xd40".
    """
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if current:
                blocks.append(current)
            current = {}
            continue
        current[key.strip()] = value.strip()
    if current:
        blocks.append(current)
    return blocks


def arm_model_name(implementer: str | None, part: str | None) -> str | None:
    if implementer is None or part is None:
        return None
    return ARM_PARTS.get((implementer.lower(), part.lower()))


def parse_proc_cpuinfo(text: str) -> CpuinfoSummary:
    blocks = [block for block in split_cpuinfo_blocks(text) if "processor" in block]
    if not blocks:
        return CpuinfoSummary()
    first = blocks[0]
    # x86: "flags : fpu vme ... avx2"; Arm: "Features : fp asimd evtstrm ... sve i8mm bf16"
    raw_flags = (first.get("flags") or first.get("Features") or "").split()
    implementer = first.get("CPU implementer")
    vendor = first.get("vendor_id") or ARM_IMPLEMENTERS.get((implementer or "").lower())
    model = first.get("model name") or arm_model_name(implementer, first.get("CPU part"))
    core_pairs = {
        (block["physical id"], block["core id"])
        for block in blocks
        if "physical id" in block and "core id" in block
    }
    packages = {block["physical id"] for block in blocks if "physical id" in block}
    return CpuinfoSummary(
        vendor=vendor,
        model=model,
        flags=translate_flags(raw_flags),
        processors=len(blocks),
        physical_cores=len(core_pairs) or None,
        sockets=len(packages) or None,
    )


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl -a` text → {key: value}. Sample line: "hw.perflevel0.physicalcpu: 4"."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key and " " not in key.strip():
            values[key.strip()] = value.strip()
    return values


def _sysctl_int(values: Mapping[str, str], key: str) -> int | None:
    try:
        return int(values[key])
    except (KeyError, ValueError):
        return None


def _darwin_l2_cache_bytes(values: Mapping[str, str]) -> int | None:
    """Sum over L2 clusters: each perf level's L2 is shared by `cpusperl2` cores.

    hw.l2cachesize alone is the least performant level's cluster size, not a total.
    """
    levels = _sysctl_int(values, "hw.nperflevels") or 0
    total = 0
    for level in range(levels):
        prefix = f"hw.perflevel{level}."
        size = _sysctl_int(values, prefix + "l2cachesize")
        cores = _sysctl_int(values, prefix + "physicalcpu")
        cores_per_l2 = _sysctl_int(values, prefix + "cpusperl2")
        if not (size and cores and cores_per_l2):
            return None
        total += size * math.ceil(cores / cores_per_l2)
    return total or None


def cpu_info_from_sysctl(text: str, arch: str) -> CpuInfo:
    values = parse_sysctl(text)
    physical = _sysctl_int(values, "hw.physicalcpu")
    performance = _sysctl_int(values, "hw.perflevel0.physicalcpu")
    efficiency = _sysctl_int(values, "hw.perflevel1.physicalcpu")
    if performance is None:
        performance = physical
    if efficiency is None and performance is not None:
        efficiency = 0
    flags = [flag for key, flag in DARWIN_FLAG_KEYS.items() if values.get(key) == "1"]
    brand = values.get("machdep.cpu.brand_string")
    frequency = _sysctl_int(values, "hw.cpufrequency_max")
    return CpuInfo(
        arch=arch,
        vendor="Apple" if brand and brand.startswith("Apple") else values.get("machdep.cpu.vendor"),
        model=brand,
        flags=translate_flags(flags),
        physical_cores=physical,
        logical_cores=_sysctl_int(values, "hw.logicalcpu"),
        performance_cores=performance,
        efficiency_cores=efficiency,
        sockets=_sysctl_int(values, "hw.packages"),
        l2_cache_bytes=_darwin_l2_cache_bytes(values),
        l3_cache_bytes=_sysctl_int(values, "hw.l3cachesize"),
        max_frequency_hz=frequency,
    )


# --- sysfs readers (roots are parameters through ctx) ---------------------------------------


def _cpu_dir(ctx: ProbeContext, cpu: int) -> Path:
    return ctx.path(f"/sys/devices/system/cpu/cpu{cpu}")


def online_cpus(ctx: ProbeContext) -> frozenset[int]:
    text = read_text_or_none(ctx.path("/sys/devices/system/cpu/online"))
    if text is not None:
        return parse_cpu_list(text)
    cpu_root = ctx.path("/sys/devices/system/cpu")
    if not cpu_root.is_dir():
        return frozenset()
    names = (entry.name for entry in cpu_root.iterdir())
    return frozenset(int(name[3:]) for name in names if re.fullmatch(r"cpu\d+", name))


def _core_key(ctx: ProbeContext, cpu: int) -> tuple[str, str] | None:
    topology = _cpu_dir(ctx, cpu) / "topology"
    package = read_text_or_none(topology / "physical_package_id")
    core = read_text_or_none(topology / "core_id")
    if package is None or core is None:
        return None
    return package.strip(), core.strip()


def read_topology(ctx: ProbeContext, cpus: frozenset[int]) -> Topology | None:
    """Physical cores are unique (package, core_id) pairs; core ids have gaps on real chips."""
    keys = [_core_key(ctx, cpu) for cpu in sorted(cpus)]
    known = [key for key in keys if key is not None]
    if not cpus or len(known) != len(keys):
        return None
    return Topology(
        logical_cores=len(cpus),
        physical_cores=len(set(known)),
        sockets=len({package for package, _core in known}),
    )


def count_cores(ctx: ProbeContext, cpus: Iterable[int]) -> int:
    return len({key for cpu in cpus if (key := _core_key(ctx, cpu)) is not None})


def read_hybrid_cores(ctx: ProbeContext, online: frozenset[int]) -> tuple[int, int] | None:
    """(P cores, E cores) on Intel hybrid chips, from the two PMU cpu lists."""
    p_text = read_text_or_none(ctx.path("/sys/devices/cpu_core/cpus"))
    e_text = read_text_or_none(ctx.path("/sys/devices/cpu_atom/cpus"))
    if p_text is None or e_text is None:
        return None
    p_cpus = parse_cpu_list(p_text) & online
    e_cpus = parse_cpu_list(e_text) & online
    return count_cores(ctx, p_cpus), count_cores(ctx, e_cpus)


def count_numa_nodes(ctx: ProbeContext) -> int | None:
    node_root = ctx.path("/sys/devices/system/node")
    if not node_root.is_dir():
        return None
    nodes = [entry for entry in node_root.iterdir() if re.fullmatch(r"node\d+", entry.name)]
    return len(nodes) or None


def _cache_entries(ctx: ProbeContext, cpu: int) -> Iterable[tuple[int, frozenset[int], int]]:
    """(level, sharing cpus, size bytes) for each data/unified cache this cpu sees."""
    cache_root = _cpu_dir(ctx, cpu) / "cache"
    if not cache_root.is_dir():
        return
    for index in sorted(cache_root.glob("index*")):
        level = read_text_or_none(index / "level")
        size = read_text_or_none(index / "size")
        shared = read_text_or_none(index / "shared_cpu_list")
        kind = (read_text_or_none(index / "type") or "").strip()
        if level is None or size is None or shared is None or kind == "Instruction":
            continue
        yield int(level), parse_cpu_list(shared) or frozenset({cpu}), parse_cache_size(size)


def read_cache_totals(ctx: ProbeContext, cpus: frozenset[int]) -> dict[int, int]:
    """{level: total bytes}, counting a cache shared by several cpus once."""
    unique: dict[tuple[int, frozenset[int]], int] = {}
    for cpu in sorted(cpus):
        for level, sharing, size in _cache_entries(ctx, cpu):
            unique[(level, sharing)] = size
    totals: dict[int, int] = {}
    for (level, _sharing), size in unique.items():
        totals[level] = totals.get(level, 0) + size
    return totals


def read_max_frequency_hz(ctx: ProbeContext) -> int | None:
    text = read_text_or_none(ctx.path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))
    if text is None or not text.strip().isdigit():
        return None
    return int(text) * 1000  # the file is in kHz


# --- per-OS probes ------------------------------------------------------------------------


def probe_linux(ctx: ProbeContext) -> ProbeResult:
    cpuinfo_text = read_text_or_none(ctx.path("/proc/cpuinfo"))
    errors: tuple[ProbeError, ...] = ()
    if cpuinfo_text is None:
        errors = (ProbeError(SOURCE, "cannot read /proc/cpuinfo"),)
    summary = parse_proc_cpuinfo(cpuinfo_text or "")
    online = online_cpus(ctx)
    topology = read_topology(ctx, online)
    physical = topology.physical_cores if topology else summary.physical_cores
    hybrid = read_hybrid_cores(ctx, online)
    performance, efficiency = hybrid if hybrid else (physical, 0 if physical else None)
    caches = read_cache_totals(ctx, online)
    cpu = CpuInfo(
        arch=normalize_arch(ctx.machine),
        vendor=summary.vendor,
        model=summary.model,
        flags=summary.flags,
        physical_cores=physical,
        logical_cores=topology.logical_cores if topology else (summary.processors or None),
        performance_cores=performance,
        efficiency_cores=efficiency,
        sockets=topology.sockets if topology else summary.sockets,
        numa_nodes=count_numa_nodes(ctx),
        l2_cache_bytes=caches.get(2),
        l3_cache_bytes=caches.get(3),
        max_frequency_hz=read_max_frequency_hz(ctx),
    )
    return ProbeResult(cpu=cpu, errors=errors)


def probe_darwin(ctx: ProbeContext) -> ProbeResult:
    text = ctx.run_command(["sysctl", "-a"])
    arch = normalize_arch(ctx.machine)
    if text is None:
        return ProbeResult(cpu=CpuInfo(arch=arch), errors=(ProbeError(SOURCE, "sysctl failed"),))
    return ProbeResult(cpu=cpu_info_from_sysctl(text, arch))


def probe_fallback(ctx: ProbeContext) -> ProbeResult:
    """Windows and the rest: core counts from psutil, no flags (no portable source)."""
    return ProbeResult(
        cpu=CpuInfo(
            arch=normalize_arch(ctx.machine),
            model=platform.processor() or None,
            physical_cores=psutil.cpu_count(logical=False),
            logical_cores=psutil.cpu_count(logical=True) or os.cpu_count(),
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
        cpu = CpuInfo(arch=normalize_arch(ctx.machine))
        return ProbeResult(cpu=cpu, errors=(ProbeError(SOURCE, message),))
