"""NVIDIA GPUs through NVML (the `nvidia-ml-py` package, imported only when probing).

Collection is thin: `collect_nvml_records` asks NVML for a plain dict of values per device
(what `tests/fixtures/probe/gpu/*/nvml.json` records). `parse_nvml_records` turns those dicts
into `GpuInfo` and is where every decision lives, so recorded machines test it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.profile import GpuInfo, ProbeError, UnsupportedDevice

SOURCE = "nvidia"
NvmlRecord = dict[str, Any]
OLDEST_SUPPORTED_COMPUTE_CAPABILITY = (7, 0)

# Datasheet bandwidth (bytes/s) for parts where NVML's bus width × max memory clock is off or
# missing (HBM3e clocks, GB10's LPDDR5x that NVML does not describe). First match wins, so
# variants come before their family. Sources: NVIDIA product datasheets / spec pages.
KNOWN_BANDWIDTH_BYTES_PER_S: tuple[tuple[str, int], ...] = (
    (r"\bGH200\b.*(144G|HBM3e)", 4_900_000_000_000),  # GH200 144 GB HBM3e: 4.9 TB/s
    (r"\bGH200\b", 4_000_000_000_000),  # GH200 480GB (96 GB HBM3): 4 TB/s
    (r"\bGB10\b", 273_000_000_000),  # DGX Spark: 256-bit LPDDR5x-8533, 273 GB/s
    (r"\bB200\b", 8_000_000_000_000),  # HGX B200 datasheet: 8 TB/s per GPU
    (r"\bH200\b", 4_800_000_000_000),  # H200 SXM and NVL: 4.8 TB/s
    (r"\bH100\b.*\bNVL\b", 3_900_000_000_000),  # H100 NVL: 3.9 TB/s
    (r"\bH100\b.*\bPCIe\b", 2_000_000_000_000),  # H100 PCIe 80 GB: 2 TB/s
    (r"\bH100\b", 3_350_000_000_000),  # H100 SXM5 80 GB HBM3: 3.35 TB/s
    (r"\bA100\b.*40GB", 1_555_000_000_000),  # A100 40 GB: 1,555 GB/s
    (r"\bA100\b.*(PCIe|PCIE)", 1_935_000_000_000),  # A100 80 GB PCIe: 1,935 GB/s
    (r"\bA100\b", 2_039_000_000_000),  # A100 80 GB SXM: 2,039 GB/s
    (r"RTX 5090(?!.*Laptop)", 1_792_000_000_000),  # 512-bit GDDR7 at 28 Gbps
    (r"RTX 4090(?!.*Laptop)", 1_008_000_000_000),  # 384-bit GDDR6X at 21 Gbps
    (r"RTX 3090 Ti(?!.*Laptop)", 1_008_000_000_000),  # 384-bit GDDR6X at 21 Gbps
    (r"RTX 3090(?!.*Laptop)", 936_000_000_000),  # 384-bit GDDR6X at 19.5 Gbps
)

# Grace-coupled parts share memory with the CPU over NVLink-C2C (hardware coherent, ATS).
# NVML says so through the addressing mode on recent drivers; this list covers older drivers.
COHERENT_PART_NAME = re.compile(r"\b(GH200|GB200|GB300|GB10)\b")
ADDRESSING_MODE_NAMES = {0: "none", 1: "hmm", 2: "ats"}


def probe(ctx: ProbeContext, nvml: Any | None = None) -> ProbeResult:
    """NVIDIA devices NVML sees. `nvml` is the `pynvml` module (tests pass a stand-in)."""
    if nvml is None:
        if ctx.root != Path("/"):
            return ProbeResult()  # a recorded machine: the live driver is not its GPU
        nvml = _import_pynvml()
        if nvml is None:
            return ProbeResult()
    try:
        records = collect_nvml_records(nvml, ctx)
    except nvml.NVMLError_LibraryNotFound:
        return ProbeResult()  # no NVIDIA driver installed: nothing to report
    except nvml.NVMLError as error:
        return ProbeResult(errors=(ProbeError(SOURCE, f"NVML failed: {_error_text(error)}"),))
    return parse_nvml_records(records)


def cuda_architecture(arch: str) -> str:
    """The CMAKE_CUDA_ARCHITECTURES value for an arch string: "sm_86" → "86"."""
    if not arch.startswith("sm_"):
        raise ValueError(f"not an NVIDIA arch: {arch!r}")
    return arch.removeprefix("sm_")


def parse_nvml_records(records: list[NvmlRecord]) -> ProbeResult:
    gpus: list[GpuInfo] = []
    unsupported: list[UnsupportedDevice] = []
    errors: list[ProbeError] = []
    for record in records:
        if "error" in record:
            errors.append(ProbeError(SOURCE, f"GPU {record.get('index')}: {record['error']}"))
        elif (reason := unsupported_reason(record)) is not None:
            unsupported.append(UnsupportedDevice(name=str(record["name"]), reason=reason))
        else:
            gpus.append(gpu_from_record(record))
    return ProbeResult(gpus=tuple(gpus), unsupported=tuple(unsupported), errors=tuple(errors))


def unsupported_reason(record: NvmlRecord) -> str | None:
    major, minor = record["compute_capability"]
    if (major, minor) >= OLDEST_SUPPORTED_COMPUTE_CAPABILITY:
        return None
    return (
        f"GPU {record.get('index')} has compute capability {major}.{minor} (Pascal or older); "
        "Hearthside's CUDA builds need 7.0 (Volta) or newer"
    )


def gpu_from_record(record: NvmlRecord) -> GpuInfo:
    name = str(record["name"])
    unified = is_unified(record)
    has_own_memory = record.get("memory_total_bytes") is not None
    return GpuInfo(
        vendor="nvidia",
        name=name,
        arch=sm_arch(*record["compute_capability"]),
        index=record.get("index"),
        vram_total_bytes=_memory(record, "memory_total_bytes", "host_memory_total_bytes"),
        vram_free_bytes=_memory(record, "memory_free_bytes", "host_memory_available_bytes"),
        memory_bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s(record),
        unified_memory=unified,
        # GB10 has no memory of its own (NVML reports none): it is part of the SoC. GH200
        # keeps its HBM, so it is coherent with the CPU but not integrated.
        integrated=unified and not has_own_memory,
        compute_units=record.get("multiprocessor_count"),
        pcie_generation=record.get("pcie_max_link_generation"),
        pcie_width=record.get("pcie_max_link_width"),
        driver_version=record.get("driver_version"),
        runtime_version=cuda_version_text(record.get("cuda_driver_version")),
        pci_bus_id=record.get("pci_bus_id"),
    )


def sm_arch(major: int, minor: int) -> str:
    return f"sm_{major}{minor}"


def is_unified(record: NvmlRecord) -> bool:
    """True for GPUs that share the CPU's memory coherently (GB10, GH200, GB200).

    GH200 still reports its HBM as VRAM, but the CPU's LPDDR5x is reachable at C2C speed and
    the driver may migrate pages both ways, so the planner must treat it as one pool."""
    if record.get("addressing_mode") == "ats":
        return True
    return COHERENT_PART_NAME.search(str(record["name"])) is not None


def _memory(record: NvmlRecord, own_key: str, host_key: str) -> int | None:
    # NVML has no framebuffer on GB10 ("Not Supported"); its memory is the host's RAM.
    own = record.get(own_key)
    return own if own is not None else record.get(host_key)


def memory_bandwidth_bytes_per_s(record: NvmlRecord) -> int | None:
    name = str(record["name"])
    for pattern, bandwidth in KNOWN_BANDWIDTH_BYTES_PER_S:
        if re.search(pattern, name):
            return bandwidth
    bus_width_bits = record.get("memory_bus_width_bits")
    clock_mhz = record.get("max_memory_clock_mhz")
    if not bus_width_bits or not clock_mhz:
        return None
    return int(bus_width_bits // 8 * clock_mhz * 2 * 1_000_000)  # double data rate


def cuda_version_text(cuda_driver_version: int | None) -> str | None:
    """NVML's integer CUDA version as text: 12040 → "12.4", 13000 → "13.0"."""
    if cuda_driver_version is None:
        return None
    return f"{cuda_driver_version // 1000}.{cuda_driver_version % 1000 // 10}"


# --- live collection -------------------------------------------------------------------------


def _import_pynvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def collect_nvml_records(nvml: Any, ctx: ProbeContext) -> list[NvmlRecord]:
    """One plain dict per device; a device NVML cannot describe becomes {"index", "error"}."""
    nvml.nvmlInit()
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_version = _optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
        records = []
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                record = _device_record(nvml, nvml.nvmlDeviceGetHandleByIndex(index), ctx)
            except nvml.NVMLError as error:
                records.append({"index": index, "error": _error_text(error)})
                continue
            records.append(
                {
                    "index": index,
                    **record,
                    "driver_version": driver,
                    "cuda_driver_version": cuda_version,
                }
            )
        return records
    finally:
        nvml.nvmlShutdown()


def _device_record(nvml: Any, handle: Any, ctx: ProbeContext) -> NvmlRecord:
    memory = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    attributes = _optional(nvml, getattr(nvml, "nvmlDeviceGetAttributes", None), handle)
    addressing = _optional(nvml, getattr(nvml, "nvmlDeviceGetAddressingMode", None), handle)
    record: NvmlRecord = {
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": _text(nvml.nvmlDeviceGetPciInfo(handle).busId),
        "compute_capability": list(nvml.nvmlDeviceGetCudaComputeCapability(handle)),
        "memory_total_bytes": memory.total if memory is not None else None,
        "memory_free_bytes": memory.free if memory is not None else None,
        "memory_bus_width_bits": _optional(nvml, nvml.nvmlDeviceGetMemoryBusWidth, handle),
        "max_memory_clock_mhz": _optional(
            nvml, nvml.nvmlDeviceGetMaxClockInfo, handle, nvml.NVML_CLOCK_MEM
        ),
        "pcie_max_link_generation": _optional(
            nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle
        ),
        "pcie_max_link_width": _optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle),
        "multiprocessor_count": attributes.multiprocessorCount if attributes else None,
        "addressing_mode": ADDRESSING_MODE_NAMES.get(addressing)
        if addressing is not None
        else None,
    }
    if memory is None:
        record |= host_memory(ctx)
    return record


def host_memory(ctx: ProbeContext) -> NvmlRecord:
    """MemTotal/MemAvailable in bytes, for GPUs whose memory is the host's (GB10)."""
    try:
        text = ctx.path("/proc/meminfo").read_text()
    except OSError:
        return {}
    values = parse_meminfo_bytes(text)
    return {
        "host_memory_total_bytes": values.get("MemTotal"),
        "host_memory_available_bytes": values.get("MemAvailable"),
    }


def parse_meminfo_bytes(text: str) -> dict[str, int]:
    """`/proc/meminfo` lines such as "MemTotal:       127600748 kB" as bytes by key."""
    values = {}
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+):\s+(\d+) kB", line.strip())
        if match:
            values[match.group(1)] = int(match.group(2)) * 1024
    return values


def _optional(nvml: Any, query: Callable[..., Any] | None, *args: Any) -> Any:
    """A value this driver or device may not offer: None instead of an error."""
    if query is None:
        return None
    try:
        return query(*args)
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _error_text(error: BaseException) -> str:
    return str(error) or type(error).__name__
