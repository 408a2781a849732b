"""Concrete advice from a HardwareProfile: what is off, and the command that fixes it."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from hearthside.core.probe.profile import Advice, GpuInfo, HardwareProfile
from hearthside.core.units import GIB

LOW_AVAILABLE_MEMORY_BYTES = 2 * GIB
# ggml backend registry names that can drive each vendor's GPUs (case-insensitive).
BACKENDS_FOR_VENDOR = {
    "nvidia": {"cuda", "vulkan"},
    "amd": {"rocm", "hip", "vulkan"},
    "apple": {"metal", "mtl"},
    "intel": {"sycl", "vulkan"},
}
BUILD_FOR_VENDOR = {"nvidia": "CUDA", "amd": "ROCm/HIP", "apple": "Metal", "intel": "SYCL"}

Rule = Callable[[HardwareProfile], Iterator[Advice]]


def advise(profile: HardwareProfile) -> tuple[Advice, ...]:
    return tuple(advice for rule in RULES for advice in rule(profile))


def _engine_cannot_drive(profile: HardwareProfile) -> Iterator[Advice]:
    if profile.engine is None or profile.source == "spec":
        return
    compiled = {backend.lower() for backend in profile.engine.backends}
    for gpu in profile.gpus:
        usable = BACKENDS_FOR_VENDOR.get(gpu.vendor, set())
        if compiled & usable:
            continue
        target = f" for {gpu.arch}" if gpu.arch else ""
        yield Advice(
            f"Your {gpu.name} is present, but the installed engine was built for "
            f"{_describe_backends(compiled)} only, so it cannot use it. A rebuild compiles "
            f"it with {_build_name(gpu)}{target}.",
            fix="hearthside engine rebuild",
        )


def _describe_backends(compiled: set[str]) -> str:
    gpu_backends = sorted(compiled - {"cpu", "blas", "rpc"})
    return ", ".join(gpu_backends) if gpu_backends else "the CPU"


def _build_name(gpu: GpuInfo) -> str:
    return BUILD_FOR_VENDOR.get(gpu.vendor, "a GPU backend")


def _volta_needs_cuda_12(profile: HardwareProfile) -> Iterator[Advice]:
    for gpu in profile.gpus:
        if gpu.vendor == "nvidia" and gpu.arch == "sm_70":
            yield Advice(
                f"{gpu.name} (sm_70) needs a CUDA 12.x toolkit: CUDA 13 dropped Volta.",
                fix="Install CUDA 12.x (e.g. 12.8), then run `hearthside engine rebuild`.",
            )


def _gfx906_needs_old_rocm(profile: HardwareProfile) -> Iterator[Advice]:
    for gpu in profile.gpus:
        if gpu.vendor == "amd" and gpu.arch == "gfx906":
            yield Advice(
                f"{gpu.name} (gfx906) needs ROCm 6.3 or older: ROCm 6.4 dropped gfx906.",
                fix="Install ROCm 6.3 and run `hearthside engine rebuild`, or rebuild with "
                "`--backend vulkan`.",
            )


def _container_memory_limit(profile: HardwareProfile) -> Iterator[Advice]:
    memory = profile.memory
    limit, total = memory.cgroup_limit_bytes, memory.total_bytes
    if limit is not None and total is not None and limit < total:
        yield Advice(
            f"This container may use {limit / GIB:.1f} GiB of the machine's "
            f"{total / GIB:.1f} GiB; Hearthside plans with the smaller figure.",
            fix="Raise the container's memory limit to run bigger models.",
        )


def _low_available_memory(profile: HardwareProfile) -> Iterator[Advice]:
    available = profile.memory.available_bytes
    if available is not None and available < LOW_AVAILABLE_MEMORY_BYTES:
        yield Advice(
            f"Only {available / GIB:.1f} GiB of memory is free right now; "
            "larger models will not fit.",
            fix="Close other programs, or pick a smaller model or quantization.",
        )


def _models_on_spinning_disk(profile: HardwareProfile) -> Iterator[Advice]:
    for disk in profile.disks:
        if disk.rotational:
            yield Advice(
                f"Your models folder ({disk.path}) is on a spinning disk: loading will be slow "
                "and models bigger than memory will crawl.",
                fix="Point HEARTHSIDE_HOME at a folder on an SSD.",
            )


def _unsupported_devices(profile: HardwareProfile) -> Iterator[Advice]:
    for device in profile.unsupported:
        yield Advice(f"{device.name} cannot be used: {device.reason}")


RULES: tuple[Rule, ...] = (
    _engine_cannot_drive,
    _volta_needs_cuda_12,
    _gfx906_needs_old_rocm,
    _container_memory_limit,
    _low_available_memory,
    _models_on_spinning_disk,
    _unsupported_devices,
)
