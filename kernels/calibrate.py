"""`run_calibration`: every kernel on this machine, within a time budget, with progress.

Groups run in this order: CPU memory bandwidth, the disk and CPU matmul (short, fixed
kernels), the engine on the CPU (the shipped model and, in a full calibration, the speed
probes: synthetic models that separate fixed, per-row and per-quant-type costs, all timed in
the same interleaved rounds), the engine on each GPU, then the GPU kernels. The engine's rounds
take whatever time is left, so they come after the short kernels: before, a short budget
spent on the engine's rounds left the disk and matmul skipped. Each group gets a share
of the budget in proportion to its weight, and time a group saves flows to the ones after it.
The kernels plan to finish by PLANNING_SHARE of the budget (a kernel always completes its minimum
repetitions, so they overrun a little on a busy machine); anything still waiting at HARD_SHARE
of the budget is reported as skipped rather than run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from hearthside.core.models.store import DB_FILE_NAME, ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.cpu_use import cpu_use_now, others_cores
from hearthside.core.probe.profile import DiskInfo, GpuInfo, HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.probe.spec import CatalogGpu, load_catalog
from hearthside.kernels import gpu as gpu_kernels
from hearthside.kernels.anomalies import find_anomalies, pcie_gb_s
from hearthside.kernels.disk import FILE_BYTES, QUICK_FILE_BYTES, disk_label, measure_disk_read
from hearthside.kernels.engine_run import (
    backends_for,
    engine_weight,
    measure_cpu,
    measure_engine,
    speed_probes,
)
from hearthside.kernels.matmul import (
    CPU_SHAPES,
    NUMPY_DTYPES,
    TORCH_CPU_DTYPES,
    MatmulShape,
    measure_numpy_matmul,
    measure_torch_matmul,
)
from hearthside.kernels.measurement import (
    NOT_MEASURED_NOTE,
    SKIPPED_NOTE,
    Budget,
    Measurement,
)
from hearthside.kernels.memory import (
    array_bytes_for,
    measure_cpu_memory,
    memory_weight,
    thread_counts,
)
from hearthside.kernels.results import SCHEMA_VERSION, CalibrationReport, hearthside_version
from hearthside.kernels.torch_support import cpu_device, gpu_devices, import_torch

DEFAULT_BUDGET_S = 60.0
QUICK_BUDGET_S = 8.0
# the engine's rounds overrun by their minimum count: 3 rounds of ~6.6 s on the Sapphire
# Rapids VM, after ~18 s of loading 15 models; 0.85 of 60 s ended at 60.8 s there
PLANNING_SHARE = 0.78
# Past this share of the budget the remaining kernels are skipped; the rest of the budget is
# room for the kernel that is running to finish and for the caller to store the report.
HARD_SHARE = 0.9
WARMUP_S = 0.2
QUICK_WARMUP_S = 0.1
# Relative seconds per group (the engine includes loading the model).
MEMORY_WEIGHT = 6.0
QUICK_MEMORY_WEIGHT = 3.0
ENGINE_WEIGHT_PER_BACKEND = 12.0
QUICK_ENGINE_WEIGHT_PER_BACKEND = 9.0
ENGINE_WEIGHT_PER_PROBE = 4.0  # writing, loading and timing one synthetic speed probe
DISK_WEIGHT = 3.0
QUICK_DISK_WEIGHT = 1.5
CPU_MATMUL_WEIGHT = 6.0
QUICK_CPU_MATMUL_WEIGHT = 2.0
GPU_WEIGHT_PER_DEVICE = 8.0

ProgressCallback = Callable[[str, float], None]  # (what runs now, fraction of all done)
StepCallback = Callable[[str, float], None]  # (what runs now, fraction of its group done)


class _TorchOnDemand:
    """Imports torch the first time a group needs it (it takes seconds), once."""

    def __init__(self) -> None:
        self._tried = False
        self._torch: ModuleType | None = None

    def get(self) -> ModuleType | None:
        if not self._tried:
            self._tried = True
            self._torch = import_torch()
        return self._torch

    def version_if_loaded(self) -> str | None:
        return str(self._torch.__version__) if self._torch is not None else None


@dataclass(frozen=True)
class _Settings:
    quick: bool
    warmup_s: float
    profile: HardwareProfile
    model_path: Path | None
    models_folder: Path


@dataclass(frozen=True)
class _Group:
    name: str
    weight: float  # share of the whole budget
    inner_weight: float  # how many shares the group splits its own budget into
    run: Callable[[Budget, StepCallback], list[Measurement]]


def run_calibration(
    *,
    quick: bool = False,
    budget_s: float | None = None,
    progress: ProgressCallback | None = None,
    model_path: Path | None = None,
    profile: HardwareProfile | None = None,
) -> CalibrationReport:
    """Measure this machine. `budget_s` defaults to DEFAULT_BUDGET_S (QUICK_BUDGET_S with
    `quick`); `model_path` to the store's default model; `profile` to a fresh probe."""
    started = time.perf_counter()
    cpu_before = cpu_use_now()
    created_at = datetime.now(UTC).isoformat(timespec="seconds")
    total_s = budget_s if budget_s is not None else QUICK_BUDGET_S if quick else DEFAULT_BUDGET_S
    report = progress or _ignore_progress
    folder = models_dir(data_dir())
    if profile is None:
        report("probing the hardware", 0.0)
        profile = _probe(folder)
    settings = _Settings(
        quick=quick,
        warmup_s=QUICK_WARMUP_S if quick else WARMUP_S,
        profile=profile,
        model_path=model_path if model_path is not None else default_model_path(),
        models_folder=folder,
    )
    torch = _TorchOnDemand()
    groups = _groups(settings, torch)
    plan_s = max(0.0, started + total_s * PLANNING_SHARE - time.perf_counter())
    budget = Budget(
        plan_s,
        sum(group.weight for group in groups),
        hard_deadline_s=started + total_s * HARD_SHARE,
    )
    measurements = _run_groups(groups, budget, report)
    machine = summarize_machine(profile, torch_version=torch.version_if_loaded())
    report("done", 1.0)
    cpu_after = cpu_use_now()
    others = others_cores(cpu_before, cpu_after)
    return CalibrationReport(
        schema=SCHEMA_VERSION,
        created_at=created_at,
        hearthside_version=hearthside_version(),
        machine=machine,
        measurements=tuple(measurements),
        anomalies=find_anomalies(measurements, machine, others, cpu_after.cores),
        duration_s=round(time.perf_counter() - started, 3),
    )


def _ignore_progress(_name: str, _fraction: float) -> None:
    return None


def _probe(folder: Path) -> HardwareProfile:
    return probe_hardware(ProbeContext(models_dir=folder))


def default_model_path() -> Path | None:
    """The model calibration times, without installing anything (None when there is none):
    the shipped Gemma 3 270M, which the speed probes and the recorded fits are made with, else
    the store's default model."""
    from hearthside.core.models.default_model import GEMMA_MODEL_SHA256

    root = data_dir()
    if not (root / DB_FILE_NAME).exists():
        return None
    with ModelStore(root) as store:
        record = store.find_by_sha256(GEMMA_MODEL_SHA256) or store.default()
    return record.path if record is not None and record.path.is_file() else None


def _run_groups(
    groups: list[_Group], budget: Budget, report: ProgressCallback
) -> list[Measurement]:
    total_weight = sum(group.weight for group in groups) or 1.0
    measurements: list[Measurement] = []
    done_weight = 0.0
    for group in groups:
        step = _group_step(report, done_weight / total_weight, group.weight / total_weight)
        measurements += group.run(budget.child(group.weight, group.inner_weight), step)
        done_weight += group.weight
    return measurements


def _group_step(report: ProgressCallback, start: float, share: float) -> StepCallback:
    """A group's progress (0..1 of the group) as progress of the whole calibration."""
    return lambda name, fraction: report(name, start + share * fraction)


def _groups(settings: _Settings, torch: _TorchOnDemand) -> list[_Group]:
    quick = settings.quick
    cpu = settings.profile.cpu
    threads = thread_counts(cpu.physical_cores, cpu.logical_cores)
    # the CPU's run times the shipped model and the speed probes together (`measure_cpu`)
    gpu_backends = backends_for(settings.profile.engine.devices if settings.profile.engine else ())[
        1:
    ]
    # --quick keeps to the shipped model; the probes are what a full calibration adds
    probes = [] if quick else speed_probes(cpu.l3_cache_bytes)
    gpu_count = len(settings.profile.gpus)
    return [
        _Group(
            "memory",
            QUICK_MEMORY_WEIGHT if quick else MEMORY_WEIGHT,
            memory_weight(threads),
            lambda budget, step: _cpu_memory(settings, threads, budget, step),
        ),
        _Group(
            "disk",
            QUICK_DISK_WEIGHT if quick else DISK_WEIGHT,
            1.0,
            lambda budget, step: [_disk(settings, budget, step)],
        ),
        _Group(
            "cpu matmul",
            QUICK_CPU_MATMUL_WEIGHT if quick else CPU_MATMUL_WEIGHT,
            _cpu_matmul_weight(quick),
            lambda budget, step: _cpu_matmul(settings, torch, budget, step),
        ),
        _Group(
            "engine",
            (QUICK_ENGINE_WEIGHT_PER_BACKEND if quick else ENGINE_WEIGHT_PER_BACKEND)
            + len(probes) * ENGINE_WEIGHT_PER_PROBE,
            1.0,
            lambda budget, step: measure_cpu(
                settings.model_path, probes, quick=quick, budget=budget, step=step
            ),
        ),
        _Group(
            "engine on gpus",
            len(gpu_backends)
            * (QUICK_ENGINE_WEIGHT_PER_BACKEND if quick else ENGINE_WEIGHT_PER_BACKEND),
            engine_weight(gpu_backends) or 1,
            lambda budget, step: (
                measure_engine(
                    settings.model_path,
                    gpu_backends,
                    quick=quick,
                    budget=budget,
                    warmup_s=settings.warmup_s,
                    step=step,
                )
                if gpu_backends
                else []
            ),
        ),
        _Group(
            "gpu",
            GPU_WEIGHT_PER_DEVICE * gpu_count,
            max(1, gpu_count) * gpu_kernels.gpu_weight(),
            lambda budget, step: _gpus(settings, torch, budget, step),
        ),
    ]


def _cpu_memory(
    settings: _Settings, threads: tuple[int, ...], budget: Budget, step: StepCallback
) -> list[Measurement]:
    memory = settings.profile.memory
    array_bytes = array_bytes_for(
        settings.profile.cpu.l3_cache_bytes, memory.available_bytes, quick=settings.quick
    )
    return measure_cpu_memory(
        array_bytes=array_bytes,
        threads=threads,
        budget=budget,
        warmup_s=settings.warmup_s,
        step=step,
    )


def _disk(settings: _Settings, budget: Budget, step: StepCallback) -> Measurement:
    disk = _models_disk(settings)
    device = disk_label(disk.device if disk is not None else None)
    if budget.expired():
        return Measurement.failed("disk_read", device, "GB/s", SKIPPED_NOTE)
    step("disk read", 0.0)
    return measure_disk_read(
        settings.models_folder,
        file_bytes=QUICK_FILE_BYTES if settings.quick else FILE_BYTES,
        budget_s=budget.take(),
        device=device,
    )


def _models_disk(settings: _Settings) -> DiskInfo | None:
    disks = settings.profile.disks
    same = [disk for disk in disks if disk.path == str(settings.models_folder)]
    return next(iter(same or disks), None)


def _cpu_matmul_jobs(quick: bool) -> list[tuple[str, str, MatmulShape]]:
    jobs = [("numpy", dtype, shape) for dtype in NUMPY_DTYPES for shape in CPU_SHAPES]
    if not quick:  # importing torch alone takes seconds; --quick keeps to numpy
        jobs += [("torch", dtype, shape) for dtype in TORCH_CPU_DTYPES for shape in CPU_SHAPES]
    return jobs


def _cpu_matmul_weight(quick: bool) -> float:
    return len(_cpu_matmul_jobs(quick)) + (0 if quick else 2)  # + importing torch


def _cpu_matmul(
    settings: _Settings, torch_loader: _TorchOnDemand, budget: Budget, step: StepCallback
) -> list[Measurement]:
    jobs = _cpu_matmul_jobs(settings.quick)
    measurements = []
    for done, (library, dtype, shape) in enumerate(jobs):
        torch = torch_loader.get() if library == "torch" else None
        blocker = _cpu_matmul_blocker(library, torch, budget)
        if blocker is not None:
            params = {"library": library, "dtype": dtype, "m": shape.m, "n": shape.n, "k": shape.k}
            measurements.append(
                Measurement.failed("matmul", "cpu", "GFLOP/s", blocker, params=params)
            )
            continue
        step(f"matmul {library} {dtype} {shape.name}", done / len(jobs))
        measurements.append(_one_cpu_matmul(settings, torch, dtype, shape, budget.take()))
    return measurements


def _cpu_matmul_blocker(library: str, torch: ModuleType | None, budget: Budget) -> str | None:
    """Why a CPU matmul cannot run now (torch missing costs no time, so it is said first)."""
    if library == "torch" and torch is None:
        return NOT_MEASURED_NOTE
    return SKIPPED_NOTE if budget.expired() else None


def _one_cpu_matmul(
    settings: _Settings, torch: ModuleType | None, dtype: str, shape: MatmulShape, budget_s: float
) -> Measurement:
    l3 = settings.profile.cpu.l3_cache_bytes
    if torch is None:
        return measure_numpy_matmul(
            dtype, shape, budget_s=budget_s, warmup_s=settings.warmup_s, cache_bytes=l3
        )
    device = cpu_device(settings.profile.cpu.model or "cpu")
    return measure_torch_matmul(
        torch, device, dtype, shape, budget_s=budget_s, warmup_s=settings.warmup_s, cache_bytes=l3
    )


def _gpus(
    settings: _Settings, torch_loader: _TorchOnDemand, budget: Budget, step: StepCallback
) -> list[Measurement]:
    profiled = [gpu_label(gpu, position) for position, gpu in enumerate(settings.profile.gpus)]
    if settings.quick and not profiled:
        return gpu_kernels.unmeasured(gpu_kernels.NO_GPU_NOTE)
    torch = torch_loader.get()
    devices = gpu_devices(torch) if torch is not None else []
    if not devices:
        reason = gpu_kernels.unavailable_reason(torch, len(profiled))
        return gpu_kernels.unmeasured(reason, profiled or ["gpu"])
    measurements = []
    per_device = gpu_kernels.gpu_weight()
    for position, device in enumerate(devices):
        device_budget = budget.child(per_device, per_device)

        def device_step(name: str, fraction: float, at: int = position) -> None:
            step(name, (at + fraction) / len(devices))

        measurements += gpu_kernels.measure_gpu(
            torch,
            device,
            quick=settings.quick,
            budget=device_budget,
            warmup_s=settings.warmup_s,
            step=device_step,
        )
    return measurements


# --- the machine summary stored with the report -----------------------------------------------


def gpu_label(gpu: GpuInfo, position: int) -> str:
    """The Measurement device a profiled GPU gets: "cuda:0", "rocm:1", "mps"."""
    if gpu.vendor == "apple":
        return "mps"
    prefix = {"nvidia": "cuda", "amd": "rocm"}.get(gpu.vendor, gpu.vendor)
    return f"{prefix}:{gpu.index if gpu.index is not None else position}"


def summarize_machine(profile: HardwareProfile, *, torch_version: str | None) -> dict[str, Any]:
    """A short hardware summary stored with the calibration (and used for spec values)."""
    cpu, memory, engine = profile.cpu, profile.memory, profile.engine
    bandwidth = memory.bandwidth_bytes_per_s
    return {
        "os": profile.os,
        "cpu_model": cpu.model,
        "cpu_arch": cpu.arch,
        "cpu_flags": list(cpu.flags),
        "physical_cores": cpu.physical_cores,
        "logical_cores": cpu.logical_cores,
        "l3_cache_bytes": cpu.l3_cache_bytes,
        "memory_total_bytes": memory.total_bytes,
        "memory_bandwidth_gb_s": bandwidth / 1e9 if bandwidth else None,
        "gpus": [_gpu_summary(gpu, position) for position, gpu in enumerate(profile.gpus)],
        "disk": _disk_summary(profile.disks[0]) if profile.disks else None,
        "engine_version": engine.package_version if engine else None,
        "engine_backends": list(engine.backends) if engine else [],
        "numpy_version": np.__version__,
        "torch_version": torch_version,
    }


def _gpu_summary(gpu: GpuInfo, position: int) -> dict[str, Any]:
    catalog = _catalog_entry(gpu.name)
    bandwidth = gpu.memory_bandwidth_bytes_per_s or (
        catalog.memory_bandwidth_bytes_per_s if catalog else None
    )
    return {
        "device": gpu_label(gpu, position),
        "name": gpu.name,
        "vendor": gpu.vendor,
        "arch": gpu.arch,
        "vram_total_bytes": gpu.vram_total_bytes,
        "memory_bandwidth_gb_s": bandwidth / 1e9 if bandwidth else None,
        "pcie_generation": gpu.pcie_generation,
        "pcie_width": gpu.pcie_width,
        "pcie_gb_s": pcie_gb_s(gpu.pcie_generation, gpu.pcie_width),
        "fp16_tflops": catalog.fp16_tflops if catalog else None,
        "bf16_tflops": catalog.bf16_tflops if catalog else None,
    }


def _catalog_entry(name: str) -> CatalogGpu | None:
    """The GPU catalog's entry for a device name (NVML and the catalog spell them alike)."""
    wanted = name.strip().lower()
    return next((e for e in load_catalog().values() if e.name.lower() == wanted), None)


def _disk_summary(disk: DiskInfo) -> dict[str, Any]:
    return {
        "path": disk.path,
        "device": disk.device,
        "filesystem": disk.filesystem,
        "rotational": disk.rotational,
    }
