"""Matmul throughput per dtype at shapes like a model's: GEMV (m=1, decode) and GEMM (m=512,
prefill). numpy (BLAS) for fp32/fp64 on the CPU; torch for fp32/bf16/fp16/int8 on the CPU and
fp32/tf32/fp16/bf16/int8 on each GPU.

Decode multiplies one token by weights that are read once per token, so a GEMV is memory-bound;
its weights rotate over several copies that together exceed the cache, and the measurement also
reports the GB/s of weights streamed (`weights_gb_s` in params). FLOPs are 2·m·n·k per call; for
int8 that counts integer multiply-adds the same way. A dtype a device cannot run becomes
`ok=False` with the reason, never an exception.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hearthside.core.units import MIB
from hearthside.kernels.measurement import Measurement, Samples, measure_until_stable, timed_s
from hearthside.kernels.torch_support import (
    TorchDevice,
    first_line,
    release_memory,
    seconds_per_call,
)

NUMPY_DTYPES = ("fp32", "fp64")
TORCH_CPU_DTYPES = ("fp32", "bf16", "fp16", "int8")
TORCH_GPU_DTYPES = ("fp32", "tf32", "fp16", "bf16", "int8")
BYTES_PER_ELEMENT = {"fp64": 8, "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "int8": 1}
TORCH_DTYPE_NAMES = {
    "fp32": "float32",
    "tf32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "int8": "int8",
}
# GEMV weights rotate over copies that together are this many times the cache, so each call
# streams its weights from memory as decode does.
GEMV_CACHE_MULTIPLE = 2
CPU_GEMV_WEIGHTS_FLOOR = 64 * MIB
GPU_GEMV_WEIGHTS_FLOOR = 256 * MIB
# at most this much on a CPU, as the memory arrays (`kernels.memory.MAX_ARRAY_BYTES`): the
# Sapphire Rapids VM reports its host's 480 MiB L3, and making 2x that of weights took ~3 s
# for each torch dtype, a fifth of the calibration
CPU_GEMV_WEIGHTS_CAP = 512 * MIB
SAMPLE_TARGET_S = 0.02  # passes per timed sample: enough to last this long
MAX_PASSES_PER_SAMPLE = 10_000
PASSES_PER_BUDGET = 4  # a GEMM pass slower than budget / this is shrunk
MIN_GEMM_FEATURES = 256
PassFn = Callable[[], None]


@dataclass(frozen=True)
class MatmulShape:
    m: int  # tokens in the batch: 1 for decode, 512 for a prefill batch
    n: int  # output features
    k: int  # input features

    @property
    def name(self) -> str:
        return "gemv" if self.m == 1 else "gemm"

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def weight_bytes(self, dtype: str) -> int:
        return self.n * self.k * BYTES_PER_ELEMENT[dtype]


CPU_SHAPES = (MatmulShape(1, 4096, 4096), MatmulShape(512, 1024, 1024))
GPU_SHAPES = (MatmulShape(1, 8192, 8192), MatmulShape(512, 8192, 8192))


def weight_copies(
    shape: MatmulShape,
    dtype: str,
    cache_bytes: int | None,
    floor_bytes: int,
    cap_bytes: int | None = None,
) -> int:
    """How many weight matrices a GEMV cycles through (1 for a GEMM: it is compute-bound)."""
    if shape.m != 1:
        return 1
    working_set = max(floor_bytes, GEMV_CACHE_MULTIPLE * (cache_bytes or 0))
    if cap_bytes is not None:
        working_set = min(working_set, max(floor_bytes, cap_bytes))
    return max(1, math.ceil(working_set / shape.weight_bytes(dtype)))


def _params(
    library: str, dtype: str, shape: MatmulShape, threads: int | None, gflop_s: float
) -> dict[str, Any]:
    params: dict[str, Any] = {
        "library": library,
        "dtype": dtype,
        "m": shape.m,
        "n": shape.n,
        "k": shape.k,
    }
    if threads is not None:
        params["threads"] = threads
    if shape.m == 1:
        # Each call reads n·k weights once: GFLOP/s × bytes per element / 2 = GB/s streamed.
        params["weights_gb_s"] = round(gflop_s * BYTES_PER_ELEMENT[dtype] / 2, 3)
    return params


def _from_gflop_samples(
    device: str,
    library: str,
    dtype: str,
    shape: MatmulShape,
    threads: int | None,
    samples: Samples,
    method: str,
) -> Measurement:
    measurement = Measurement.from_samples("matmul", device, "GFLOP/s", samples, method=method)
    return replace(measurement, params=_params(library, dtype, shape, threads, measurement.value))


# --- numpy -------------------------------------------------------------------------------------


def blas_threads() -> int:
    """OpenBLAS (numpy's BLAS) uses every core unless the environment says otherwise."""
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


def measure_numpy_matmul(
    dtype: str,
    shape: MatmulShape,
    *,
    budget_s: float,
    warmup_s: float,
    cache_bytes: int | None = None,
) -> Measurement:
    np_dtype = np.float32 if dtype == "fp32" else np.float64

    def prepare(shape: MatmulShape) -> tuple[PassFn, int]:
        x = np.full((shape.m, shape.k), 0.5, dtype=np_dtype)
        copies = weight_copies(
            shape, dtype, cache_bytes, CPU_GEMV_WEIGHTS_FLOOR, CPU_GEMV_WEIGHTS_CAP
        )
        weights = [np.full((shape.k, shape.n), 0.5, dtype=np_dtype) for _ in range(copies)]

        def one_pass() -> None:
            for w in weights:
                np.matmul(x, w)

        return one_pass, copies

    def seconds_per_pass(one_pass: PassFn, passes: int) -> float:
        return timed_s(lambda: _repeat(one_pass, passes)) / passes

    run = _measure(prepare, seconds_per_pass, shape, budget_s=budget_s, warmup_s=warmup_s)
    method = _method("numpy matmul (BLAS)", dtype, run, "cpu")
    return _from_gflop_samples(
        "cpu", "numpy", dtype, run.shape, blas_threads(), run.samples, method
    )


def _repeat(work: PassFn, times: int) -> None:
    for _ in range(times):
        work()


# --- shared timing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    shape: MatmulShape  # as run: a GEMM may have been shrunk to fit the budget
    copies: int
    samples: Samples


def _measure(
    prepare: Callable[[MatmulShape], tuple[PassFn, int]],
    seconds_per_pass: Callable[[PassFn, int], float],
    shape: MatmulShape,
    *,
    budget_s: float,
    warmup_s: float,
) -> _Run:
    shape, one_pass, copies, once_s = _fit(prepare, seconds_per_pass, shape, budget_s)
    passes = max(1, min(MAX_PASSES_PER_SAMPLE, math.ceil(SAMPLE_TARGET_S / max(once_s, 1e-9))))
    flops_per_pass = shape.flops * copies
    samples = measure_until_stable(
        lambda: flops_per_pass / seconds_per_pass(one_pass, passes) / 1e9,
        budget_s=budget_s,
        warmup_s=warmup_s,
    )
    return _Run(shape, copies, samples)


def _fit(
    prepare: Callable[[MatmulShape], tuple[PassFn, int]],
    seconds_per_pass: Callable[[PassFn, int], float],
    shape: MatmulShape,
    budget_s: float,
) -> tuple[MatmulShape, PassFn, int, float]:
    """The shape to run, its operands, and one pass timed. A GEMM too slow for the budget
    (int8 or fp16 on a CPU without native support, a small GPU) runs at a smaller n and k."""
    if shape.m > 1:
        shape = _affordable_gemm(prepare, seconds_per_pass, shape, budget_s / PASSES_PER_BUDGET)
    one_pass, copies = prepare(shape)
    return shape, one_pass, copies, _fastest_pass_s(seconds_per_pass, one_pass)


def _affordable_gemm(
    prepare: Callable[[MatmulShape], tuple[PassFn, int]],
    seconds_per_pass: Callable[[PassFn, int], float],
    shape: MatmulShape,
    limit_s: float,
) -> MatmulShape:
    """`shape`, or the largest of its halvings in n and k whose pass should take at most
    `limit_s`. It grows from the smallest, predicting each next size from the one just timed
    (8x the FLOPs), so a minute-long pass is never started and the probes cost about one
    pass of the size chosen."""
    sizes = [shape]
    while min(sizes[-1].n, sizes[-1].k) > MIN_GEMM_FEATURES:
        sizes.append(MatmulShape(shape.m, sizes[-1].n // 2, sizes[-1].k // 2))
    sizes.reverse()
    for smaller, larger in zip(sizes, sizes[1:], strict=False):
        small_pass, _copies = prepare(smaller)
        seconds = _fastest_pass_s(seconds_per_pass, small_pass)
        if seconds * larger.flops / smaller.flops > limit_s:
            return smaller
    return shape


def _fastest_pass_s(seconds_per_pass: Callable[[PassFn, int], float], one_pass: PassFn) -> float:
    """The first call pays one-time costs (thread pools, cuBLAS handles): the faster of two."""
    return min(seconds_per_pass(one_pass, 1), seconds_per_pass(one_pass, 1))


def _method(operation: str, dtype: str, run: _Run, device: str) -> str:
    shape = run.shape
    text = f"{operation} {dtype} {shape.m}x{shape.k} @ {shape.k}x{shape.n} on {device}"
    return text + (f", {run.copies} weight copies" if run.copies > 1 else "")


# --- torch -------------------------------------------------------------------------------------


def _torch_operands(
    torch: Any, device: TorchDevice, dtype: str, shape: MatmulShape, copies: int
) -> tuple[Any, list[Any]]:
    """Activations [m, k] and weights [n, k] (the layout of a linear layer's weights)."""
    on = device.torch_device
    if dtype == "int8":
        x = torch.randint(-8, 8, (shape.m, shape.k), dtype=torch.int8, device=on)
        weights = [
            torch.randint(-8, 8, (shape.n, shape.k), dtype=torch.int8, device=on)
            for _ in range(copies)
        ]
        return x, weights
    torch_dtype = getattr(torch, TORCH_DTYPE_NAMES[dtype])
    x = torch.rand((shape.m, shape.k), device=on).to(torch_dtype)
    weights = [torch.rand((shape.n, shape.k), device=on).to(torch_dtype) for _ in range(copies)]
    return x, weights


def _torch_pass(torch: Any, dtype: str, x: Any, weights: list[Any]) -> Callable[[], None]:
    if dtype == "int8":

        def int8_pass() -> None:
            for w in weights:
                torch._int_mm(x, w.t())

        return int8_pass
    linear = torch.nn.functional.linear

    def float_pass() -> None:
        for w in weights:
            linear(x, w)

    return float_pass


@contextlib.contextmanager
def _tf32_allowed(torch: Any, device: TorchDevice, allowed: bool) -> Iterator[None]:
    """TF32 tensor cores for fp32 matmuls inside the block on CUDA/HIP, off otherwise (torch's
    default), and the caller's setting restored after."""
    if device.backend not in ("cuda", "rocm"):
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        matmul.allow_tf32 = before


def measure_torch_matmul(
    torch: Any,
    device: TorchDevice,
    dtype: str,
    shape: MatmulShape,
    *,
    budget_s: float,
    warmup_s: float,
    cache_bytes: int | None = None,
) -> Measurement:
    """GFLOP/s of torch's matmul for `dtype` on `device`; ok=False when it cannot run there."""
    on_cpu = device.backend == "cpu"
    floor = CPU_GEMV_WEIGHTS_FLOOR if on_cpu else GPU_GEMV_WEIGHTS_FLOOR
    cap = CPU_GEMV_WEIGHTS_CAP if on_cpu else None

    def prepare(shape: MatmulShape) -> tuple[PassFn, int]:
        copies = weight_copies(shape, dtype, cache_bytes or device.cache_bytes, floor, cap)
        x, weights = _torch_operands(torch, device, dtype, shape, copies)
        return _torch_pass(torch, dtype, x, weights), copies

    def seconds_per_pass(one_pass: PassFn, passes: int) -> float:
        return seconds_per_call(torch, device, one_pass, passes)

    operation = "torch._int_mm" if dtype == "int8" else "torch linear"
    try:
        with torch.inference_mode(), _tf32_allowed(torch, device, dtype == "tf32"):
            run = _measure(prepare, seconds_per_pass, shape, budget_s=budget_s, warmup_s=warmup_s)
    except Exception as error:  # an unsupported dtype or shape, or out of memory
        return Measurement.failed(
            "matmul",
            device.label,
            "GFLOP/s",
            f"{dtype} matmul did not run on {device.label}: {first_line(error)}",
            method=f"{operation} {dtype}",
            params={"library": "torch", "dtype": dtype, "m": shape.m, "n": shape.n, "k": shape.k},
        )
    finally:
        release_memory(torch, device)
    threads = int(torch.get_num_threads()) if device.backend == "cpu" else None
    method = _method(operation, dtype, run, device.label)
    return _from_gflop_samples(
        device.label, "torch", dtype, run.shape, threads, run.samples, method
    )
