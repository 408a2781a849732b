"""torch, when installed: which devices it drives and how to time work on each of them.

torch is optional (the `kernels` extra). Nothing here imports it at module load; callers get
`None` from `import_torch()` and report "not measured" instead. GPU work is timed with
CUDA/HIP events between two records on the device's stream (a host clock would time the
launch, not the kernel); MPS has no events, so it synchronizes around a host clock.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

Backend = Literal["cuda", "rocm", "mps", "cpu"]
SAMPLE_TARGET_S = 0.02  # one timed sample runs the work this long, so timer resolution is moot
MAX_CALLS_PER_SAMPLE = 10_000


def import_torch() -> ModuleType | None:
    """torch, or None when it is not installed or cannot load (a broken CUDA install)."""
    try:
        return importlib.import_module("torch")
    except Exception:  # ImportError, or OSError from a missing shared library
        return None


@dataclass(frozen=True)
class TorchDevice:
    label: str  # the Measurement device: "cuda:0", "rocm:0", "mps", "cpu"
    torch_device: str  # what torch calls it: "cuda:0", "mps", "cpu"
    backend: Backend
    name: str
    index: int | None = None  # torch's device index (CUDA/HIP)
    cache_bytes: int | None = None  # the GPU's L2; None for the CPU (the caller knows its L3)
    uuid: str | None = None  # the GPU's UUID, which NVML looks devices up by


def gpu_devices(torch: Any) -> list[TorchDevice]:
    """The GPUs this torch build can drive: CUDA or ROCm devices, or Apple's MPS."""
    devices = []
    if torch.cuda.is_available():
        backend: Backend = "rocm" if getattr(torch.version, "hip", None) else "cuda"
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                TorchDevice(
                    label=f"{backend}:{index}",
                    torch_device=f"cuda:{index}",
                    backend=backend,
                    name=str(props.name),
                    index=index,
                    cache_bytes=getattr(props, "L2_cache_size", None) or None,
                    uuid=_uuid(props),
                )
            )
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        devices.append(TorchDevice(label="mps", torch_device="mps", backend="mps", name="mps"))
    return devices


def _uuid(props: Any) -> str | None:
    uuid = getattr(props, "uuid", None)
    return str(uuid) if uuid is not None else None


def cpu_device(name: str = "cpu") -> TorchDevice:
    return TorchDevice(label="cpu", torch_device="cpu", backend="cpu", name=name)


def synchronize(torch: Any, device: TorchDevice) -> None:
    if device.backend in ("cuda", "rocm"):
        torch.cuda.synchronize(device.torch_device)
    elif device.backend == "mps":
        torch.mps.synchronize()


def seconds_per_call(
    torch: Any, device: TorchDevice, work: Callable[[], object], calls: int
) -> float:
    """Device seconds one `work()` takes, averaged over `calls` back-to-back calls."""
    if device.backend in ("cuda", "rocm"):
        with torch.cuda.device(device.index):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                work()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1000.0 / calls
    synchronize(torch, device)
    began = time.perf_counter()
    for _ in range(calls):
        work()
    synchronize(torch, device)
    return (time.perf_counter() - began) / calls


def calls_per_sample(
    torch: Any, device: TorchDevice, work: Callable[[], object], target_s: float = SAMPLE_TARGET_S
) -> int:
    """How many calls make one sample last about `target_s`. The first call pays one-time
    costs (allocator, library handles), so the faster of two sizes the sample."""
    once_s = min(seconds_per_call(torch, device, work, 1), seconds_per_call(torch, device, work, 1))
    if once_s <= 0:
        return MAX_CALLS_PER_SAMPLE
    return max(1, min(MAX_CALLS_PER_SAMPLE, math.ceil(target_s / once_s)))


def free_memory_bytes(torch: Any, device: TorchDevice) -> int | None:
    if device.backend in ("cuda", "rocm"):
        free, _total = torch.cuda.mem_get_info(device.torch_device)
        return int(free)
    if device.backend == "mps":
        recommended = getattr(torch.mps, "recommended_max_memory", None)
        return int(recommended()) if recommended is not None else None
    return None


def release_memory(torch: Any, device: TorchDevice) -> None:
    """Hand cached blocks back, so the next kernel (or the engine) finds the memory free."""
    if device.backend in ("cuda", "rocm"):
        torch.cuda.empty_cache()
    elif device.backend == "mps":
        empty = getattr(torch.mps, "empty_cache", None)
        if empty is not None:
            empty()


def torch_version(torch: Any | None) -> str | None:
    return None if torch is None else str(torch.__version__)


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
