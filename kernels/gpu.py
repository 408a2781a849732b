"""GPU kernels through torch (CUDA, ROCm/HIP, Apple MPS): memory bandwidth (read, copy,
triad in device memory), matmul per dtype, and host↔device transfers.

Without torch, or with a torch that sees no GPU, every GPU kind is still reported, as
`ok=False` with the reason — never an exception — so a report always says what is missing.
Bytes are counted as on the CPU (read 1, copy 2, triad 3 array sizes per pass).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from hearthside.core.units import MIB
from hearthside.kernels.matmul import (
    GPU_SHAPES,
    TORCH_GPU_DTYPES,
    MatmulShape,
    measure_torch_matmul,
)
from hearthside.kernels.measurement import (
    NO_GPU_NOTE,
    NOT_MEASURED_NOTE,
    SKIPPED_NOTE,
    Budget,
    Measurement,
    Samples,
    measure_until_stable,
)
from hearthside.kernels.torch_support import (
    TorchDevice,
    calls_per_sample,
    first_line,
    free_memory_bytes,
    release_memory,
    seconds_per_call,
)
from hearthside.kernels.transfer import (
    DIRECTIONS,
    QUICK_TRANSFER_BYTES,
    TRANSFER_BYTES,
    measure_transfer,
)

GPU_ARRAY_BYTES = 1024 * MIB
QUICK_GPU_ARRAY_BYTES = 256 * MIB
MIN_GPU_ARRAY_BYTES = 64 * MIB
FREE_MEMORY_SHARE = 16  # three arrays at most 3/16 of the free memory
TRIAD_SCALAR = 3.0
MEMORY_KINDS = ("memory_read", "memory_copy", "memory_triad")
BYTES_PER_PASS = {"memory_read": 1, "memory_copy": 2, "memory_triad": 3}
GPU_KINDS = (*MEMORY_KINDS, "matmul", *DIRECTIONS)
UNITS = {"matmul": "GFLOP/s"}

StepCallback = Callable[[str, float], None]


def gpu_weight(shapes: Sequence[MatmulShape] = GPU_SHAPES) -> int:
    """`Budget` shares one GPU's measurements take (at most)."""
    return len(_plan("cuda", shapes))


def _plan(backend: str, shapes: Sequence[MatmulShape]) -> list[tuple[str, Any]]:
    """(kind, detail) for every measurement on one GPU, in the order they run. TF32 exists
    only where torch can switch it on (CUDA, and ROCm on the cards that have it)."""
    dtypes = [d for d in TORCH_GPU_DTYPES if d != "tf32" or backend in ("cuda", "rocm")]
    plan: list[tuple[str, Any]] = [(kind, None) for kind in MEMORY_KINDS]
    plan += [("matmul", (dtype, shape)) for shape in shapes for dtype in dtypes]
    plan += [(direction, pinned) for pinned in (True, False) for direction in DIRECTIONS]
    return plan


def unmeasured(note: str, devices: Sequence[str] = ("gpu",)) -> list[Measurement]:
    """Every GPU kind for every device, marked not measured with `note`."""
    return [
        Measurement.failed(kind, device, UNITS.get(kind, "GB/s"), note)
        for device in devices
        for kind in GPU_KINDS
    ]


def unavailable_reason(torch: Any | None, profiled_gpus: int) -> str:
    """Why no GPU can be measured (when `gpu_devices` found none)."""
    if torch is None:
        return NOT_MEASURED_NOTE
    if profiled_gpus:
        return (
            f"not measured: torch {torch.__version__} cannot use this machine's GPU "
            "(a CPU-only build?); install the `kernels` extra with the GPU build of torch"
        )
    return NO_GPU_NOTE


def measure_gpu(
    torch: Any,
    device: TorchDevice,
    *,
    quick: bool,
    budget: Budget,
    warmup_s: float,
    step: StepCallback | None = None,
    shapes: Sequence[MatmulShape] = GPU_SHAPES,
) -> list[Measurement]:
    """Every GPU measurement on one device, within `budget` (one share each); matmuls at
    `shapes` (a GEMV and a GEMM of an 8192-wide model unless told otherwise)."""
    plan = _plan(device.backend, shapes)
    measurements = []
    for done, (kind, detail) in enumerate(plan):
        if budget.expired():
            measurements.append(
                Measurement.failed(kind, device.label, UNITS.get(kind, "GB/s"), SKIPPED_NOTE)
            )
            continue
        if step is not None:
            step(f"{device.label} {kind.replace('_', ' ')}", done / len(plan))
        share_s = budget.take()
        measurements.append(
            _measure_one(torch, device, kind, detail, quick, budget_s=share_s, warmup_s=warmup_s)
        )
    return measurements


def _measure_one(
    torch: Any,
    device: TorchDevice,
    kind: str,
    detail: Any,
    quick: bool,
    *,
    budget_s: float,
    warmup_s: float,
) -> Measurement:
    if kind in MEMORY_KINDS:
        return measure_gpu_memory(
            torch, device, kind, quick=quick, budget_s=budget_s, warmup_s=warmup_s
        )
    if kind == "matmul":
        dtype, shape = detail
        measurement = measure_torch_matmul(
            torch, device, dtype, shape, budget_s=budget_s, warmup_s=warmup_s
        )
        return _with_gpu_name(measurement, device)
    nbytes = QUICK_TRANSFER_BYTES if quick else TRANSFER_BYTES
    return measure_transfer(
        torch, device, kind, pinned=detail, nbytes=nbytes, budget_s=budget_s, warmup_s=warmup_s
    )


def _with_gpu_name(measurement: Measurement, device: TorchDevice) -> Measurement:
    return replace(measurement, params={**measurement.params, "gpu": device.name})


def gpu_array_bytes(torch: Any, device: TorchDevice, *, quick: bool) -> int:
    wanted = QUICK_GPU_ARRAY_BYTES if quick else GPU_ARRAY_BYTES
    free = free_memory_bytes(torch, device)
    if free is not None:
        wanted = min(wanted, max(MIN_GPU_ARRAY_BYTES, free // FREE_MEMORY_SHARE))
    return wanted - wanted % MIB


def measure_gpu_memory(
    torch: Any,
    device: TorchDevice,
    kind: str,
    *,
    quick: bool,
    budget_s: float,
    warmup_s: float,
) -> Measurement:
    """GB/s of reading (sum), copying or triad-ing fp32 arrays in device memory."""
    nbytes = gpu_array_bytes(torch, device, quick=quick)
    params: dict[str, Any] = {"array_bytes": nbytes, "gpu": device.name}
    method = f"torch {_OPERATION_TEXT[kind]} over {nbytes // MIB} MiB fp32 on {device.label}"
    try:
        samples = _time_gpu_memory(
            torch, device, kind, nbytes, budget_s=budget_s, warmup_s=warmup_s
        )
    except Exception as error:  # out of memory, a broken driver
        note = f"{kind} did not run on {device.label}: {first_line(error)}"
        return Measurement.failed(kind, device.label, "GB/s", note, method=method, params=params)
    finally:
        release_memory(torch, device)
    return Measurement.from_samples(
        kind, device.label, "GB/s", samples, method=method, params=params
    )


_OPERATION_TEXT = {
    "memory_read": "sum",
    "memory_copy": "copy_",
    "memory_triad": "add(b, c, alpha=s, out=a)",
}


def _time_gpu_memory(
    torch: Any, device: TorchDevice, kind: str, nbytes: int, *, budget_s: float, warmup_s: float
) -> Samples:
    count = nbytes // 4
    with torch.inference_mode():
        a, b, c = (
            torch.full((count,), 1.0, dtype=torch.float32, device=device.torch_device)
            for _ in range(3)
        )
        work = {
            "memory_read": lambda: torch.sum(a),
            "memory_copy": lambda: b.copy_(a),
            "memory_triad": lambda: torch.add(b, c, alpha=TRIAD_SCALAR, out=a),
        }[kind]
        calls = calls_per_sample(torch, device, work)
        bytes_per_call = BYTES_PER_PASS[kind] * nbytes
        return measure_until_stable(
            lambda: bytes_per_call / seconds_per_call(torch, device, work, calls) / 1e9,
            budget_s=budget_s,
            warmup_s=warmup_s,
        )
