"""What-if hardware: a small JSON spec expanded into a `HardwareProfile` from the GPU catalog.

    {"schema": 1, "gpus": [{"model": "rtx-3090", "count": 2}], "memory_gb": 64,
     "cpu": {"cores": 6, "threads": 12, "flags": ["avx2", "fma", "f16c"]},
     "os": "linux", "disk": {"read_gb_s": 3.5, "read_ahead_kb": 128}}

A spec may describe a cluster of identical nodes for serving recipes: `"nodes": 2` (default 1)
and `"interconnect": {"gpu_link": "nvlink" | "pcie" | "unified", "network": "200GbE RoCE",
"network_gb_s": 25}` (the GPUs' link inside a node, and the network between nodes). `expand_spec`
still returns one node's profile; `expand_cluster_spec` adds the node count and the links.

Units: `memory_gb` and `vram_gb` are GiB (memory is sold in binary units); `read_gb_s` is
decimal GB/s like disk datasheets. GPU models are slugs of assets/gpu_catalog.json. The
expanded profile has `source="spec"` and an engine that assumes the right backend is built.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hearthside.core.errors import HearthsideError
from hearthside.core.probe.engine_build import GpuTarget, choose_build
from hearthside.core.probe.profile import (
    KNOWN_CPU_FLAGS,
    CpuInfo,
    DiskInfo,
    EngineDevice,
    EngineInfo,
    GpuInfo,
    GpuVendor,
    HardwareProfile,
    MemoryInfo,
)
from hearthside.core.units import GIB

SPEC_SCHEMA = 1
CATALOG_SCHEMA = 1
SPEC_KEYS = {"schema", "name", "gpus", "memory_gb", "cpu", "os", "disk", "nodes", "interconnect"}
INTERCONNECT_KEYS = {"gpu_link", "network", "network_gb_s"}
GPU_LINKS = ("nvlink", "pcie", "unified")
GPU_KEYS = {"model", "count", "vram_gb"}
CPU_KEYS = {"cores", "threads", "flags", "arch", "model", "vendor", "numa_nodes"}
OSES = ("linux", "darwin", "windows")
# ggml's registry and device names for each build, so a spec's engine looks like a real one.
ENGINE_NAMES = {"cuda": ("CUDA", "CUDA"), "hip": ("ROCm", "ROCm"), "metal": ("MTL", "MTL")}


class SpecError(HearthsideError):
    """A hardware spec is malformed or names hardware the catalog does not know."""


@dataclass(frozen=True)
class CatalogGpu:
    slug: str
    name: str
    vendor: GpuVendor
    arch: str
    vram_bytes: int
    memory_bandwidth_bytes_per_s: int
    fp16_tflops: float | None
    bf16_tflops: float | None
    fp8_tflops: float | None
    fp4_tflops: float | None
    unified_memory: bool
    compute_units: int | None
    tdp_w: int | None = None
    soc: bool = False  # system memory is the GPU's memory (Apple, GB10, Strix Halo)
    host_arch: str | None = None  # the CPU architecture the part implies


# --- the catalog ------------------------------------------------------------------------------


@functools.cache
def load_catalog() -> Mapping[str, CatalogGpu]:
    """The GPU catalog shipped in hearthside.assets, by slug."""
    text = resources.files("hearthside.assets").joinpath("gpu_catalog.json").read_text("utf-8")
    return MappingProxyType(parse_catalog(json.loads(text)))


def parse_catalog(data: Mapping[str, Any]) -> dict[str, CatalogGpu]:
    if data.get("schema", CATALOG_SCHEMA) > CATALOG_SCHEMA:
        raise SpecError("The GPU catalog comes from a newer Hearthside.")
    fields = set(CatalogGpu.__dataclass_fields__) - {"slug"}
    return {
        slug: CatalogGpu(slug=slug, **{k: v for k, v in entry.items() if k in fields})
        for slug, entry in data["gpus"].items()
    }


def close_matches(slug: str, catalog: Mapping[str, CatalogGpu]) -> list[str]:
    by_name = {entry.name.lower(): key for key, entry in catalog.items()}
    names = difflib.get_close_matches(slug.lower(), by_name, n=3, cutoff=0.5)
    slugs = difflib.get_close_matches(slug.lower(), catalog, n=3, cutoff=0.5)
    return list(dict.fromkeys([*slugs, *(by_name[name] for name in names)]))[:3]


# --- validation -------------------------------------------------------------------------------


def validate_spec(spec: Any, catalog: Mapping[str, CatalogGpu]) -> list[str]:
    """Every problem with `spec`, as sentences; empty when it is good."""
    if not isinstance(spec, dict):
        return ["A hardware spec must be a JSON object."]
    problems = [f"Unknown key {key!r}." for key in sorted(set(spec) - SPEC_KEYS)]
    if spec.get("schema", SPEC_SCHEMA) != SPEC_SCHEMA:
        problems.append(f"Unsupported spec schema {spec.get('schema')!r}; expected {SPEC_SCHEMA}.")
    gpus = spec.get("gpus", [])
    if not isinstance(gpus, list):
        problems.append('\'gpus\' must be a list of {"model": ..., "count": ...}.')
        gpus = []
    for position, gpu in enumerate(gpus):
        problems += _gpu_problems(position, gpu, catalog)
    problems += _memory_problems(spec, catalog)
    problems += _cpu_problems(spec.get("cpu", {}))
    if spec.get("os", "linux") not in OSES:
        problems.append(f"'os' must be one of {', '.join(OSES)}, not {spec.get('os')!r}.")
    disk = spec.get("disk", {})
    if not isinstance(disk, dict) or not all(
        _positive_number(disk.get(key, 1)) for key in ("read_gb_s", "read_ahead_kb")
    ):
        problems.append('\'disk\' must look like {"read_gb_s": 3.5, "read_ahead_kb": 128}.')
    return problems + _cluster_problems(spec)


def _cluster_problems(spec: dict[str, Any]) -> list[str]:
    problems = []
    nodes = spec.get("nodes", 1)
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        problems.append("'nodes' must be a whole number of at least 1.")
    if not isinstance(spec.get("name", ""), str):
        problems.append("'name' must be a string.")
    link = spec.get("interconnect", {})
    if not isinstance(link, dict):
        return [*problems, '\'interconnect\' must look like {"gpu_link": "nvlink", ...}.']
    unknown = sorted(set(link) - INTERCONNECT_KEYS)
    problems += [f"interconnect: unknown key {key!r}." for key in unknown]
    if link.get("gpu_link", "pcie") not in GPU_LINKS:
        problems.append(f"interconnect: 'gpu_link' must be one of {', '.join(GPU_LINKS)}.")
    if not isinstance(link.get("network", ""), str):
        problems.append("interconnect: 'network' must be a string, e.g. \"200GbE RoCE\".")
    if not _positive_number(link.get("network_gb_s", 1)):
        problems.append("interconnect: 'network_gb_s' must be a positive number (GB/s).")
    return problems


def _gpu_problems(position: int, gpu: Any, catalog: Mapping[str, CatalogGpu]) -> list[str]:
    where = f"gpus[{position}]"
    if not isinstance(gpu, dict) or not isinstance(gpu.get("model"), str):
        return [f'{where} must look like {{"model": "rtx-3090", "count": 2}}.']
    problems = [f"{where}: unknown key {key!r}." for key in sorted(set(gpu) - GPU_KEYS)]
    count = gpu.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        problems.append(f"{where}: 'count' must be a whole number of at least 1.")
    if "vram_gb" in gpu and not _positive_number(gpu["vram_gb"]):
        problems.append(f"{where}: 'vram_gb' must be a positive number.")
    entry = catalog.get(gpu["model"])
    if entry is None:
        suggestions = close_matches(gpu["model"], catalog)
        hint = f" Did you mean {', '.join(suggestions)}?" if suggestions else ""
        return [*problems, f"{where}: unknown GPU model {gpu['model']!r}.{hint}"]
    if entry.soc and count != 1:
        problems.append(f"{where}: {entry.name} is a system-on-chip; 'count' must be 1.")
    return problems


def _memory_problems(spec: dict[str, Any], catalog: Mapping[str, CatalogGpu]) -> list[str]:
    if "memory_gb" in spec:
        ok = _positive_number(spec["memory_gb"])
        return [] if ok else ["'memory_gb' must be a positive number (GiB of RAM)."]
    if _soc_entry(spec, catalog) is None:
        return ["'memory_gb' is required (GiB of system RAM)."]
    return []


def _cpu_problems(cpu: Any) -> list[str]:
    if not isinstance(cpu, dict):
        return ['\'cpu\' must be an object like {"cores": 6, "threads": 12, "flags": [...]}.']
    problems = [f"cpu: unknown key {key!r}." for key in sorted(set(cpu) - CPU_KEYS)]
    for key in ("cores", "threads", "numa_nodes"):
        value = cpu.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"cpu: {key!r} must be a whole number of at least 1.")
    for flag in cpu.get("flags", []):
        if flag not in KNOWN_CPU_FLAGS:
            near = difflib.get_close_matches(str(flag), KNOWN_CPU_FLAGS, n=3)
            hint = f" Did you mean {', '.join(near)}?" if near else ""
            problems.append(f"cpu: unknown flag {flag!r}.{hint}")
    return problems


def _positive_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _soc_entry(spec: Mapping[str, Any], catalog: Mapping[str, CatalogGpu]) -> CatalogGpu | None:
    gpus = spec.get("gpus", [])
    models = (
        [gpu.get("model") for gpu in gpus if isinstance(gpu, dict)]
        if isinstance(gpus, list)
        else []
    )
    entries = (catalog.get(model) for model in models if isinstance(model, str))
    return next((entry for entry in entries if entry is not None and entry.soc), None)


# --- expansion --------------------------------------------------------------------------------


def expand_spec(
    spec: dict[str, Any], catalog: Mapping[str, CatalogGpu] | None = None
) -> HardwareProfile:
    """The profile the spec describes; raises `SpecError` listing every problem."""
    catalog = load_catalog() if catalog is None else catalog
    problems = validate_spec(spec, catalog)
    if problems:
        raise SpecError("This hardware spec is not valid:\n  " + "\n  ".join(problems))
    memory_bytes = _memory_bytes(spec, catalog)
    gpus = _expand_gpus(spec, catalog, memory_bytes)
    os_name = spec.get("os", "darwin" if any(g.vendor == "apple" for g in gpus) else "linux")
    cpu = _expand_cpu(spec.get("cpu", {}), _default_arch(spec, catalog))
    return HardwareProfile(
        cpu=cpu,
        memory=MemoryInfo(total_bytes=memory_bytes, available_bytes=memory_bytes),
        os=os_name,
        gpus=gpus,
        disks=_expand_disks(spec.get("disk")),
        engine=assumed_engine(gpus, cpu, memory_bytes, os_name),
        source="spec",
    )


def load_spec(path: Path | str) -> HardwareProfile:
    return expand_spec(read_spec_file(path))


def read_spec_file(path: Path | str) -> Any:
    path = Path(path)
    try:
        return json.loads(path.read_text("utf-8"))
    except OSError as exc:
        raise SpecError(f"Cannot read the hardware spec {path}: {exc.strerror}.") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg}).") from exc


# --- clusters ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterSpec:
    """`nodes` identical machines like `node`, and how their GPUs are linked."""

    node: HardwareProfile
    nodes: int = 1
    gpu_link: str = "pcie"  # inside a node: "nvlink" | "pcie" | "unified" (one SoC GPU)
    network: str | None = None  # between nodes, in words ("200GbE RoCE")
    network_bytes_per_s: int | None = None
    name: str | None = None

    @property
    def gpus_per_node(self) -> int:
        return len(self.node.gpus)


def expand_cluster_spec(
    spec: dict[str, Any], catalog: Mapping[str, CatalogGpu] | None = None
) -> ClusterSpec:
    """`expand_spec` plus the node count and the links (a plain spec is one node)."""
    node = expand_spec(spec, catalog)
    link = spec.get("interconnect", {})
    soc = any(gpu.integrated and gpu.unified_memory for gpu in node.gpus)
    speed = link.get("network_gb_s")
    return ClusterSpec(
        node=node,
        nodes=spec.get("nodes", 1),
        gpu_link=link.get("gpu_link", "unified" if soc else "pcie"),
        network=link.get("network"),
        network_bytes_per_s=int(speed * 1e9) if speed is not None else None,
        name=spec.get("name"),
    )


def load_cluster_spec(path: Path | str) -> ClusterSpec:
    return expand_cluster_spec(read_spec_file(path))


def _memory_bytes(spec: Mapping[str, Any], catalog: Mapping[str, CatalogGpu]) -> int:
    if "memory_gb" in spec:
        return int(spec["memory_gb"] * GIB)
    soc = _soc_entry(spec, catalog)
    assert soc is not None  # validate_spec requires memory_gb otherwise
    return soc.vram_bytes


def _expand_gpus(
    spec: Mapping[str, Any], catalog: Mapping[str, CatalogGpu], memory_bytes: int
) -> tuple[GpuInfo, ...]:
    gpus: list[GpuInfo] = []
    for item in spec.get("gpus", []):
        entry = catalog[item["model"]]
        vram = _vram_bytes(item, entry, memory_bytes)
        for _ in range(item.get("count", 1)):
            gpus.append(_gpu_info(entry, index=len(gpus), vram_bytes=vram))
    return tuple(gpus)


def _vram_bytes(item: Mapping[str, Any], entry: CatalogGpu, memory_bytes: int) -> int:
    if "vram_gb" in item:
        return int(item["vram_gb"] * GIB)
    return memory_bytes if entry.soc else entry.vram_bytes


def _gpu_info(entry: CatalogGpu, *, index: int, vram_bytes: int) -> GpuInfo:
    return GpuInfo(
        vendor=entry.vendor,
        name=entry.name,
        arch=entry.arch,
        index=index,
        vram_total_bytes=vram_bytes,
        vram_free_bytes=vram_bytes,
        memory_bandwidth_bytes_per_s=entry.memory_bandwidth_bytes_per_s,
        unified_memory=entry.unified_memory,
        integrated=entry.soc,
        compute_units=entry.compute_units,
        recommended_working_set_bytes=(
            metal_working_set_bytes(vram_bytes) if entry.vendor == "apple" else None
        ),
    )


def metal_working_set_bytes(memory_bytes: int) -> int:
    """macOS's default Metal ceiling (`recommendedMaxWorkingSetSize`): about three quarters
    of RAM above 36 GiB, two thirds below; `iogpu.wired_limit_mb` raises it."""
    share = 0.75 if memory_bytes > 36 * GIB else 2 / 3
    return int(memory_bytes * share)


def _default_arch(spec: Mapping[str, Any], catalog: Mapping[str, CatalogGpu]) -> str:
    entries = (catalog[gpu["model"]] for gpu in spec.get("gpus", []))
    return next((entry.host_arch for entry in entries if entry.host_arch), "x86_64")


def _expand_cpu(cpu: Mapping[str, Any], default_arch: str) -> CpuInfo:
    cores = cpu.get("cores")
    return CpuInfo(
        arch=cpu.get("arch", default_arch),
        vendor=cpu.get("vendor"),
        model=cpu.get("model"),
        flags=tuple(sorted(set(cpu.get("flags", [])))),
        physical_cores=cores,
        logical_cores=cpu.get("threads", cores),
        performance_cores=cores,
        efficiency_cores=0 if cores is not None else None,
        numa_nodes=cpu.get("numa_nodes"),
    )


def _expand_disks(disk: Mapping[str, Any] | None) -> tuple[DiskInfo, ...]:
    if not disk:
        return ()
    read_gb_s, read_ahead_kb = disk.get("read_gb_s"), disk.get("read_ahead_kb")
    return (
        DiskInfo(
            path="(spec)",
            read_bytes_per_s=int(read_gb_s * 1e9) if read_gb_s else None,
            read_ahead_bytes=int(read_ahead_kb * 1024) if read_ahead_kb else None,
        ),
    )


def assumed_engine(
    gpus: tuple[GpuInfo, ...], cpu: CpuInfo, memory_bytes: int, os_name: str
) -> EngineInfo:
    """The engine a machine like this would have once `hearthside engine rebuild` chose its
    build: the backend `choose_build` picks, one engine device per GPU of that vendor."""
    targets = [GpuTarget(g.vendor, g.arch, g.name, g.vram_total_bytes) for g in gpus]
    platform = "darwin" if os_name == "darwin" else "linux"
    backend = choose_build(targets, platform=platform, machine=cpu.arch).backend
    registry, prefix = ENGINE_NAMES.get(backend, ("", ""))
    vendor = {"cuda": "nvidia", "hip": "amd", "metal": "apple"}.get(backend)
    driven = [gpu for gpu in gpus if gpu.vendor == vendor]
    devices = [_engine_device(f"{prefix}{i}", gpu) for i, gpu in enumerate(driven)]
    cpu_device = EngineDevice("CPU", cpu.model or "CPU", "cpu", memory_bytes, memory_bytes)
    return EngineInfo(
        backends=(registry, "CPU") if registry else ("CPU",),
        devices=(*devices, cpu_device),
        gpu_offload=bool(devices),
    )


def _engine_device(name: str, gpu: GpuInfo) -> EngineDevice:
    usable = gpu.recommended_working_set_bytes or gpu.vram_total_bytes
    return EngineDevice(name, gpu.name, "gpu", usable, usable)
