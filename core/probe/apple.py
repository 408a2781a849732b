"""Apple Silicon GPUs (macOS only) from `sysctl` and `system_profiler SPDisplaysDataType -json`.

Sample `sysctl hw.memsize machdep.cpu.brand_string` / `sysctl iogpu.wired_limit_mb` output:

    hw.memsize: 103079215104
    machdep.cpu.brand_string: Apple M3 Ultra
    iogpu.wired_limit_mb: 0

and the display entry of `system_profiler SPDisplaysDataType -json`:

    {"_name": "Apple M3 Ultra", "sppci_model": "Apple M3 Ultra", "sppci_cores": "80",
     "spdisplays_mtlgpufamilysupport": "spdisplays_metal3", ...}
"""

from __future__ import annotations

import json
import re
from typing import Any

from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.profile import GpuInfo, ProbeError
from hearthside.core.units import GB, GIB, MIB

SOURCE = "apple"

SYSCTL_COMMAND = ("sysctl", "hw.memsize", "machdep.cpu.brand_string")
# Asked apart: sysctl fails as a whole for an unknown key, and macOS 13 and older lack it.
WIRED_LIMIT_COMMAND = ("sysctl", "iogpu.wired_limit_mb")
SYSTEM_PROFILER_COMMAND = ("system_profiler", "SPDisplaysDataType", "-json")

# Unified memory bandwidth by chip, from Apple's tech specs pages (GB/s). Chips sold with two
# bandwidths are keyed by (chip, GPU cores) first.
BANDWIDTH_GB_S_BY_CHIP_AND_CORES: dict[tuple[str, int], float] = {
    ("M3 Max", 30): 300,
    ("M3 Max", 40): 400,
    ("M4 Max", 32): 410,
    ("M4 Max", 40): 546,
}
BANDWIDTH_GB_S_BY_CHIP: dict[str, float] = {
    "M1": 68.25,
    "M1 Pro": 200,
    "M1 Max": 400,
    "M1 Ultra": 800,
    "M2": 100,
    "M2 Pro": 200,
    "M2 Max": 400,
    "M2 Ultra": 800,
    "M3": 100,
    "M3 Pro": 150,
    "M3 Ultra": 819,
    "M4": 120,
    "M4 Pro": 273,
    "M5": 153,
}


def probe(ctx: ProbeContext) -> ProbeResult:
    if ctx.platform != "darwin":
        return ProbeResult()
    sysctl_text = ctx.run_command(SYSCTL_COMMAND)
    if sysctl_text is None:
        return ProbeResult(errors=(ProbeError(SOURCE, "sysctl gave no hw.memsize output"),))
    sysctl_text += ctx.run_command(WIRED_LIMIT_COMMAND) or ""
    return parse_apple(sysctl_text, ctx.run_command(SYSTEM_PROFILER_COMMAND))


def parse_apple(sysctl_text: str, system_profiler_json: str | None) -> ProbeResult:
    values = parse_sysctl(sysctl_text)
    brand = values.get("machdep.cpu.brand_string", "")
    chip = apple_chip(brand)
    if chip is None:
        return ProbeResult()  # an Intel Mac: its GPUs are not Apple Silicon
    try:
        display = apple_display_entry(system_profiler_json)
    except ValueError as error:
        return ProbeResult(errors=(ProbeError(SOURCE, f"system_profiler output: {error}"),))
    return ProbeResult(gpus=(gpu_info(chip, brand, values, display),))


def gpu_info(chip: str, brand: str, sysctl: dict[str, str], display: dict[str, Any]) -> GpuInfo:
    memory_bytes = _int(sysctl.get("hw.memsize"))
    cores = _int(display.get("sppci_cores"))
    return GpuInfo(
        vendor="apple",
        name=display.get("sppci_model") or brand,
        arch=f"apple-{chip.split()[0].lower()}",
        index=0,
        vram_total_bytes=memory_bytes,
        memory_bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s(chip, cores),
        unified_memory=True,
        integrated=True,
        compute_units=cores,
        runtime_version=metal_version(display.get("spdisplays_mtlgpufamilysupport")),
        recommended_working_set_bytes=recommended_working_set_bytes(
            memory_bytes, _int(sysctl.get("iogpu.wired_limit_mb"))
        ),
    )


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl` lines ("hw.memsize: 103079215104") as text by key."""
    values = {}
    for line in text.splitlines():
        key, separator, value = line.partition(":")
        if separator:
            values[key.strip()] = value.strip()
    return values


def apple_chip(brand: str) -> str | None:
    """ "Apple M3 Ultra" → "M3 Ultra"; None for an Intel brand string."""
    match = re.fullmatch(r"Apple (M\d+(?: (?:Pro|Max|Ultra))?)", brand.strip())
    return match.group(1) if match else None


def apple_display_entry(system_profiler_json: str | None) -> dict[str, Any]:
    """The built-in GPU's entry of SPDisplaysDataType; {} when system_profiler gave nothing."""
    if not system_profiler_json:
        return {}
    try:
        entries = json.loads(system_profiler_json).get("SPDisplaysDataType", [])
    except (json.JSONDecodeError, AttributeError) as error:
        raise ValueError("not SPDisplaysDataType JSON") from error
    builtin = [entry for entry in entries if entry.get("sppci_bus") == "spdisplays_builtin"]
    return (builtin or entries or [{}])[0]


def memory_bandwidth_bytes_per_s(chip: str, gpu_cores: int | None) -> int | None:
    by_cores = BANDWIDTH_GB_S_BY_CHIP_AND_CORES.get((chip, gpu_cores or 0))
    gb_per_s = by_cores if by_cores is not None else BANDWIDTH_GB_S_BY_CHIP.get(chip)
    return int(gb_per_s * GB) if gb_per_s is not None else None


def recommended_working_set_bytes(
    memory_bytes: int | None, wired_limit_mb: int | None
) -> int | None:
    """What Metal will let the GPU wire: `iogpu.wired_limit_mb` when set, else the default.

    Metal's default `recommendedMaxWorkingSetSize`, as llama.cpp logs it on real Macs: 2/3 of
    RAM up to 32 GB (16 GB → 10.67 GiB), 3/4 from 36 GB up (36 GB → 27 GiB, 64 GB → 48 GiB).
    No Apple Silicon Mac ships with 33-35 GB, so the boundary is exact for real machines."""
    if wired_limit_mb:
        return wired_limit_mb * MIB
    if memory_bytes is None:
        return None
    if memory_bytes <= 32 * GIB:
        return memory_bytes * 2 // 3
    return memory_bytes * 3 // 4


def metal_version(family_support: str | None) -> str | None:
    """ "spdisplays_metal3" → "Metal 3"."""
    match = re.fullmatch(r"spdisplays_metal(\d+)", family_support or "")
    return f"Metal {match.group(1)}" if match else None


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None
