"""`hearthside probe [--json] [--from-spec FILE]`: what this machine has and can use."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hearthside.core.errors import HearthsideError
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import GpuInfo, HardwareProfile
from hearthside.core.probe.runner import probe_hardware, with_advice
from hearthside.core.units import format_bytes


def add_probe_parser(subparsers: argparse._SubParsersAction) -> None:
    probe = subparsers.add_parser("probe", help="show this machine's hardware and advice")
    probe.add_argument("--json", action="store_true", help="print only the HardwareProfile JSON")
    probe.add_argument(
        "--from-spec", type=Path, metavar="FILE", help="expand a what-if hardware spec instead"
    )
    probe.set_defaults(handler=_run_probe)


def _run_probe(args: argparse.Namespace) -> int:
    profile = load_profile(spec_path=args.from_spec)
    if args.json:
        sys.stdout.write(profile.to_json() + "\n")
    else:
        print(describe(profile))
    return 0


def load_profile(
    *, spec_path: Path | None = None, profile_path: Path | None = None
) -> HardwareProfile:
    """A saved profile (`hearthside probe --json > FILE`), a what-if spec, or this machine."""
    if profile_path is not None:
        try:
            return HardwareProfile.from_json(profile_path.read_text("utf-8"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HearthsideError(
                f"{profile_path} is not a hardware profile ({exc}).",
                hint="Save one with `hearthside probe --json > profile.json`.",
            ) from exc
    if spec_path is not None:
        from hearthside.core.probe.spec import load_spec

        return with_advice(load_spec(spec_path))
    return probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))


def describe(profile: HardwareProfile) -> str:
    """The profile as a few lines a person reads at a glance."""
    lines = [_cpu_line(profile), _memory_line(profile)]
    lines += [_gpu_line(gpu) for gpu in profile.gpus] or ["GPU      none found"]
    lines += [
        f"Disk     {disk.path}: {_disk_kind(disk.rotational)}"
        + (f", {format_bytes(disk.free_bytes)} free" if disk.free_bytes is not None else "")
        for disk in profile.disks
    ]
    lines.append(_engine_line(profile))
    lines += [f"Cannot use {item.name}: {item.reason}" for item in profile.unsupported]
    lines += [f"Probe error ({error.source}): {error.message}" for error in profile.errors]
    for advice in profile.advice:
        lines.append(f"Advice   {advice.message}")
        if advice.fix:
            lines.append(f"         → {advice.fix}")
    return "\n".join(lines)


def _cpu_line(profile: HardwareProfile) -> str:
    cpu = profile.cpu
    cores = f"{cpu.physical_cores or '?'} cores / {cpu.logical_cores or '?'} threads"
    if cpu.efficiency_cores:
        cores += f" ({cpu.performance_cores} P + {cpu.efficiency_cores} E)"
    flags = " ".join(cpu.flags) or "no SIMD flags known"
    return f"CPU      {cpu.model or cpu.arch}, {cores}; {flags}"


def _memory_line(profile: HardwareProfile) -> str:
    memory = profile.memory
    parts = [_sized(memory.total_bytes, "total"), _sized(memory.available_bytes, "free")]
    if memory.cgroup_limit_bytes is not None:
        parts.append(_sized(memory.cgroup_limit_bytes, "container limit"))
    return "Memory   " + ", ".join(part for part in parts if part)


def _gpu_line(gpu: GpuInfo) -> str:
    details = [gpu.arch or "unknown arch", _sized(gpu.vram_total_bytes, "VRAM")]
    if gpu.memory_bandwidth_bytes_per_s:
        details.append(f"{gpu.memory_bandwidth_bytes_per_s / 1e9:.0f} GB/s")
    if gpu.unified_memory:
        details.append("unified memory")
    index = "-" if gpu.index is None else str(gpu.index)
    return f"GPU {index:<4} {gpu.name} ({', '.join(d for d in details if d)})"


def _disk_kind(rotational: bool | None) -> str:
    return {True: "spinning disk", False: "SSD", None: "disk type unknown"}[rotational]


def _engine_line(profile: HardwareProfile) -> str:
    engine = profile.engine
    if engine is None:
        return "Engine   not inspected"
    backends = ", ".join(engine.backends) or "none"
    offload = "GPU offload available" if engine.gpu_offload else "CPU only"
    return f"Engine   llama-cpp-python {engine.package_version}: {backends} ({offload})"


def _sized(value: int | None, label: str) -> str:
    return f"{format_bytes(value)} {label}" if value is not None else ""
