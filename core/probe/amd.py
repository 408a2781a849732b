"""AMD GPUs from the amdgpu driver's sysfs: the KFD topology plus each device's DRM card.

This is what ROCm's own tools read, needs no ROCm install, and works with a fake root in
tests. `read_amd_sysfs` gathers one plain dict per GPU node; `parse_amd_records` decides.
Where sysfs shows no KFD topology (a container that hides /sys, say), the same records come
from `amd-smi static --json` or, failing that, `rocm-smi --json` (`parse_amd_smi_static`,
`parse_rocm_smi`; real outputs of both are in tests/fixtures/probe/gpu/, README there).

Sample KFD node properties (`/sys/class/kfd/kfd/topology/nodes/1/properties`, RX 7900 XTX):

    simd_count 192
    simd_per_cu 2
    gfx_target_version 110000
    vendor_id 4098
    device_id 29772
    location_id 768
    drm_render_minor 128
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearthside.core.probe import engine_build
from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.profile import GpuInfo, ProbeError, UnsupportedDevice
from hearthside.core.units import MIB

SOURCE = "amd"
AMD_PCI_VENDOR_ID = 0x1002
KFD_NODES = "/sys/class/kfd/kfd/topology/nodes"
DRM_CARDS = "/sys/class/drm"
AmdRecord = dict[str, Any]

# GCN 4 (gfx803, Polaris) and older: ROCm dropped them and llama.cpp's HIP build skips them.
OLDEST_SUPPORTED_GFX_TARGET_VERSION = 90000

# APUs share the system RAM; amdgpu does not say "integrated" in sysfs, so the gfx targets do.
APU_GFX_TARGETS = frozenset(
    {
        "gfx801",  # Carrizo
        "gfx902",  # Raven Ridge
        "gfx909",  # Raven 2
        "gfx90c",  # Renoir, Cezanne, Lucienne
        "gfx1033",  # Van Gogh (Steam Deck)
        "gfx1035",  # Rembrandt
        "gfx1036",  # Raphael / Granite Ridge iGPU
        "gfx1037",  # Mendocino
        "gfx1103",  # Phoenix, Hawk Point (Radeon 780M/760M)
        "gfx1150",  # Strix Point
        "gfx1151",  # Strix Halo (Radeon 8050S/8060S)
        "gfx1152",  # Krackan Point
    }
)
MI300A_DEVICE_ID = 0x74A0  # gfx942 like MI300X, but an APU with unified HBM


@dataclass(frozen=True)
class AmdPart:
    name: str
    bandwidth_bytes_per_s: int | None  # datasheet; None where it depends on the system's RAM


# Keyed by (PCI device id, revision), revision None matching any. Names follow libdrm's
# amdgpu.ids; bandwidths are AMD's spec pages.
AMD_PARTS: dict[tuple[int, int | None], AmdPart] = {
    (0x66A0, None): AmdPart("AMD Instinct MI60", 1_024_000_000_000),  # 4096-bit HBM2
    (0x66A1, None): AmdPart("AMD Instinct MI50", 1_024_000_000_000),  # 4096-bit HBM2
    (0x66AF, None): AmdPart("AMD Radeon VII", 1_024_000_000_000),  # 4096-bit HBM2
    (0x74A0, None): AmdPart("AMD Instinct MI300A", 5_300_000_000_000),  # 8192-bit HBM3
    (0x74A1, None): AmdPart("AMD Instinct MI300X", 5_300_000_000_000),  # 8192-bit HBM3
    (0x744C, 0xC8): AmdPart("AMD Radeon RX 7900 XTX", 960_000_000_000),  # 384-bit, 20 Gbps
    (0x744C, 0xCC): AmdPart("AMD Radeon RX 7900 XT", 800_000_000_000),  # 320-bit, 20 Gbps
    (0x744C, 0xCE): AmdPart("AMD Radeon RX 7900 GRE", 576_000_000_000),  # 256-bit, 18 Gbps
    (0x7551, None): AmdPart("AMD Radeon AI PRO R9700", 640_000_000_000),  # 256-bit, 20 Gbps
    # Ryzen AI Max: 256-bit LPDDR5X-8000 soldered on package, so the bandwidth is fixed.
    (0x1586, None): AmdPart("AMD Radeon 8060S Graphics (Strix Halo)", 256_000_000_000),
    (0x15BF, None): AmdPart("AMD Radeon 780M Graphics", None),
}

PCIE_GENERATION_BY_GT_S = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


AMD_SMI_COMMAND = ("amd-smi", "static", "--asic", "--bus", "--vram", "--driver", "--json")
ROCM_SMI_COMMAND = ("rocm-smi", "--showproductname", "--showbus", "--showmeminfo", "vram", "--json")


def probe(ctx: ProbeContext) -> ProbeResult:
    if ctx.platform != "linux":
        return ProbeResult()
    if not ctx.path(KFD_NODES).is_dir():
        return probe_with_tools(ctx)
    try:
        records = read_amd_sysfs(ctx.root)
    except (OSError, ValueError) as error:
        return ProbeResult(errors=(ProbeError(SOURCE, f"reading the KFD topology: {error}"),))
    return parse_amd_records(records)


def gfx_name(gfx_target_version: int) -> str:
    """KFD's gfx_target_version as an LLVM target: 90006 → "gfx906", 90010 → "gfx90a",
    110501 → "gfx1151" (major, then minor and stepping as one hex digit each)."""
    return engine_build.gfx_name(gfx_target_version) or f"gfx-unknown-{gfx_target_version}"


def parse_amd_records(records: list[AmdRecord]) -> ProbeResult:
    gpus: list[GpuInfo] = []
    unsupported: list[UnsupportedDevice] = []
    for index, record in enumerate(records):
        gfx = gfx_name(record["gfx_target_version"])
        if record["gfx_target_version"] < OLDEST_SUPPORTED_GFX_TARGET_VERSION:
            reason = f"{gfx} (GCN 4 or older) is not supported by ROCm or llama.cpp's HIP build"
            unsupported.append(UnsupportedDevice(name=part_name(record), reason=reason))
        else:
            gpus.append(gpu_from_record(record, index))
    return ProbeResult(gpus=tuple(gpus), unsupported=tuple(unsupported))


def gpu_from_record(record: AmdRecord, index: int) -> GpuInfo:
    gfx = gfx_name(record["gfx_target_version"])
    integrated = is_apu(gfx, record.get("device_id"))
    part = find_part(record)
    return GpuInfo(
        vendor="amd",
        name=part_name(record),
        arch=gfx,
        index=index,  # the position among KFD GPU nodes, which HIP_VISIBLE_DEVICES counts
        vram_total_bytes=gpu_memory_total_bytes(record, integrated),
        vram_free_bytes=gpu_memory_free_bytes(record, integrated),
        memory_bandwidth_bytes_per_s=part.bandwidth_bytes_per_s if part else None,
        unified_memory=integrated,
        integrated=integrated,
        compute_units=compute_units(record),
        # An iGPU's link is on-die; its reported speed means nothing.
        pcie_generation=None if integrated else pcie_generation(record.get("max_link_speed")),
        pcie_width=None if integrated else record.get("max_link_width"),
        driver_version=record.get("driver_version"),
        pci_bus_id=record.get("pci_bus_id"),
    )


def is_apu(gfx: str, device_id: int | None) -> bool:
    return gfx in APU_GFX_TARGETS or device_id == MI300A_DEVICE_ID


def find_part(record: AmdRecord) -> AmdPart | None:
    device_id = record.get("device_id")
    if device_id is None:
        return None
    return AMD_PARTS.get((device_id, record.get("revision"))) or AMD_PARTS.get((device_id, None))


def part_name(record: AmdRecord) -> str:
    if record.get("product_name"):
        return str(record["product_name"])
    part = find_part(record)
    if part is not None:
        return part.name
    return f"AMD GPU {gfx_name(record['gfx_target_version'])} (device 0x{record['device_id']:04x})"


def gpu_memory_total_bytes(record: AmdRecord, integrated: bool) -> int | None:
    """VRAM; for an APU the BIOS carve-out plus GTT, the system RAM the GPU may map.

    Strix Halo users commonly keep the carve-out at 512 MiB and raise the GTT limit instead;
    the carve-out alone would hide nearly all the memory llama.cpp can really allocate."""
    vram = record.get("vram_total_bytes")
    if not integrated or vram is None:
        return vram
    return vram + (record.get("gtt_total_bytes") or 0)


def gpu_memory_free_bytes(record: AmdRecord, integrated: bool) -> int | None:
    total = gpu_memory_total_bytes(record, integrated)
    used = record.get("vram_used_bytes")
    if total is None or used is None:
        return None
    if integrated:
        used += record.get("gtt_used_bytes") or 0
    return max(total - used, 0)


def compute_units(record: AmdRecord) -> int | None:
    if record.get("compute_units"):  # amd-smi says it; KFD counts SIMDs
        return int(record["compute_units"])
    simd_per_cu = record.get("simd_per_cu")
    return record["simd_count"] // simd_per_cu if simd_per_cu else None


def pcie_generation(max_link_speed: str | None) -> int | None:
    """`max_link_speed` text such as "16.0 GT/s PCIe" as a PCIe generation (4)."""
    match = re.match(r"([\d.]+) GT/s", max_link_speed or "")
    return PCIE_GENERATION_BY_GT_S.get(float(match.group(1))) if match else None


# --- reading sysfs (roots are parameters) ------------------------------------------------------


def read_amd_sysfs(root: Path) -> list[AmdRecord]:
    """One dict per KFD GPU node, in node order, joined with its DRM card."""
    cards = drm_cards_by_render_minor(root / DRM_CARDS.lstrip("/"))
    records = []
    nodes = [node for node in (root / KFD_NODES.lstrip("/")).iterdir() if node.name.isdigit()]
    for node in sorted(nodes, key=lambda node: int(node.name)):
        properties = parse_kfd_properties((node / "properties").read_text())
        if not is_gpu_node(properties):
            continue
        card = cards.get(properties.get("drm_render_minor", -1))
        records.append(kfd_record(properties) | (read_drm_card(card) if card else {}))
    return records


def parse_kfd_properties(text: str) -> dict[str, int]:
    """KFD `properties` lines ("simd_count 192") as ints by key."""
    values = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key and value.strip().lstrip("-").isdigit():
            values[key] = int(value)
    return values


def is_gpu_node(properties: dict[str, int]) -> bool:
    # CPU nodes have no SIMDs; KFD lists only AMD GPUs, the vendor check guards the future.
    vendor = properties.get("vendor_id", AMD_PCI_VENDOR_ID)
    return properties.get("simd_count", 0) > 0 and vendor == AMD_PCI_VENDOR_ID


def kfd_record(properties: dict[str, int]) -> AmdRecord:
    keys = ("gfx_target_version", "simd_count", "simd_per_cu", "device_id", "drm_render_minor")
    record: AmdRecord = {key: properties.get(key) for key in keys}
    # Older kernels fill local_mem_size; newer ones leave it 0 and only DRM knows VRAM.
    if properties.get("local_mem_size"):
        record["vram_total_bytes"] = properties["local_mem_size"]
    return record


def drm_cards_by_render_minor(drm_root: Path) -> dict[int, Path]:
    """Each DRM card's `device` folder by the minor of its render node (renderD128 → 128)."""
    cards: dict[int, Path] = {}
    if not drm_root.is_dir():
        return cards
    for card in drm_root.glob("card*"):
        for render_node in (card / "device" / "drm").glob("renderD*"):
            cards[int(render_node.name.removeprefix("renderD"))] = card / "device"
    return cards


def read_drm_card(device: Path) -> AmdRecord:
    record: AmdRecord = {
        "pci_bus_id": _uevent_value(device, "PCI_SLOT_NAME"),
        "revision": _read_hex(device / "revision"),
        "product_name": _read_text(device / "product_name"),
        "vram_total_bytes": _read_int(device / "mem_info_vram_total"),
        "vram_used_bytes": _read_int(device / "mem_info_vram_used"),
        "gtt_total_bytes": _read_int(device / "mem_info_gtt_total"),
        "gtt_used_bytes": _read_int(device / "mem_info_gtt_used"),
        "max_link_speed": _read_text(device / "max_link_speed"),
        "max_link_width": _read_int(device / "max_link_width"),
        "driver_version": _read_text(device / "driver" / "module" / "version"),
    }
    return {key: value for key, value in record.items() if value is not None}


def _read_text(path: Path) -> str | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return int(text) if text is not None and text.isdigit() else None


def _read_hex(path: Path) -> int | None:
    text = _read_text(path)
    return int(text, 16) if text is not None else None


def _uevent_value(device: Path, key: str) -> str | None:
    for line in (_read_text(device / "uevent") or "").splitlines():
        name, _, value = line.partition("=")
        if name == key:
            return value
    return None


# --- amd-smi and rocm-smi, where sysfs shows no KFD topology -------------------------------------


def probe_with_tools(ctx: ProbeContext) -> ProbeResult:
    """amd-smi's records when it names each GPU's gfx target, else rocm-smi's; an output that
    is not their JSON is an error with the tool's name."""
    for command, parse in (
        (AMD_SMI_COMMAND, parse_amd_smi_static),
        (ROCM_SMI_COMMAND, parse_rocm_smi),
    ):
        text = ctx.run_command(command)
        if not text:
            continue
        try:
            records = parse(text)
        except ValueError as error:
            return ProbeResult(errors=(ProbeError(SOURCE, f"{command[0]} output: {error}"),))
        if records:
            return parse_amd_records(records)
    return ProbeResult()


def gfx_target_version(name: str) -> int | None:
    """A gfx target as KFD's number: LLVM's names ("gfx906" → 90006, "gfx90a" → 90010,
    "gfx1151" → 110501) and the decimal spelling older rocm-smi prints, major·1000 + minor·100
    + stepping ("gfx9010" for an MI250X's gfx90a, "gfx11001" for an RX 7800 XT's gfx1101)."""
    match = re.fullmatch(r"gfx([0-9a-f]{3,5})", name.strip().lower())
    if not match:
        return None
    digits = match.group(1)
    if digits.isdigit() and (len(digits) == 5 or (len(digits) == 4 and digits[0] in "89")):
        major, rest = divmod(int(digits), 1000)
        minor, stepping = divmod(rest, 100)
    else:
        major, minor, stepping = int(digits[:-2]), int(digits[-2], 16), int(digits[-1], 16)
    return major * 10000 + minor * 100 + stepping


def parse_amd_smi_static(text: str) -> list[AmdRecord]:
    """`amd-smi static --asic --bus --vram --driver --json`: a list of GPUs (ROCm 6) or
    {"gpu_data": [...]} (ROCm 7). A GPU whose gfx target is not given is left out: without
    it no build can be chosen (`static -B -b` prints none)."""
    data = _json(text)
    entries = data.get("gpu_data", []) if isinstance(data, dict) else data
    records = []
    for entry in entries if isinstance(entries, list) else []:
        asic, bus = entry.get("asic") or {}, entry.get("bus") or {}
        version = gfx_target_version(str(asic.get("target_graphics_version", "")))
        if version is None:
            continue
        record: AmdRecord = {
            "gfx_target_version": version,
            "device_id": _hex_int(asic.get("device_id")),
            "revision": _hex_int(asic.get("rev_id")),
            "product_name": _known(asic.get("market_name")),
            "compute_units": _whole(asic.get("num_compute_units")),
            "pci_bus_id": _known(bus.get("bdf")),
            "vram_total_bytes": _mib_bytes(_value((entry.get("vram") or {}).get("size"))),
            "max_link_width": _whole(bus.get("max_pcie_width")),
            "max_link_speed": _gt_s(_value(bus.get("max_pcie_speed"))),
            "driver_version": _known((entry.get("driver") or {}).get("version")),
        }
        records.append({key: value for key, value in record.items() if value is not None})
    return records


def parse_rocm_smi(text: str) -> list[AmdRecord]:
    """`rocm-smi --showproductname --showbus --showmeminfo vram --json`: {"card0": {...}}.
    A compute-partitioned GPU (MI300X in CPX) is listed once per partition; each PCI bus
    address counts once."""
    data = _json(text)
    if not isinstance(data, dict):
        raise ValueError("not rocm-smi's JSON (no cards)")
    cards = sorted((key for key in data if re.fullmatch(r"card\d+", key)), key=lambda k: int(k[4:]))
    records, seen = [], set()
    for key in cards:
        card = data[key]
        version = gfx_target_version(str(card.get("GFX Version", "")))
        bus = _known(card.get("PCI Bus"))
        if version is None or (bus is not None and bus.lower() in seen):
            continue
        seen.add(bus.lower() if bus else key)
        record: AmdRecord = {
            "gfx_target_version": version,
            "device_id": _hex_int(card.get("Card Model") or card.get("Device ID")),
            "revision": _hex_int(card.get("Device Rev")),
            "product_name": _series_name(card.get("Card Series")),
            "pci_bus_id": bus.lower() if bus else None,
            "vram_total_bytes": _whole(card.get("VRAM Total Memory (B)")),
            "vram_used_bytes": _whole(card.get("VRAM Total Used Memory (B)")),
        }
        records.append({k: v for k, v in record.items() if v is not None})
    return records


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON ({error.msg})") from error


def _known(value: object) -> str | None:
    text = str(value).strip() if value is not None else ""
    return text if text and text != "N/A" else None


def _series_name(value: object) -> str | None:
    """rocm-smi's "Card Series" when it is a name (older versions print the PCI id there)."""
    text = _known(value)
    return None if text is None or re.fullmatch(r"0x[0-9a-fA-F]+", text) else text


def _hex_int(value: object) -> int | None:
    text = _known(value)
    return int(text, 16) if text and re.fullmatch(r"0x[0-9a-fA-F]+", text) else None


def _whole(value: object) -> int | None:
    text = _known(value)
    return int(text) if text and text.isdigit() else None


def _value(field: object) -> object:
    """amd-smi's JSON gives a quantity as {"value": 196592, "unit": "MB"}."""
    return field.get("value") if isinstance(field, dict) else field


def _mib_bytes(value: object) -> int | None:
    mib = _whole(value)  # amd-smi's "MB" are MiB: an MI300X reports 196592
    return mib * MIB if mib is not None else None


def _gt_s(value: object) -> str | None:
    """amd-smi's max_pcie_speed (32 for Gen 5) in sysfs's words ("32.0 GT/s PCIe")."""
    try:
        return f"{float(str(value)):.1f} GT/s PCIe" if _known(value) else None
    except ValueError:
        return None
