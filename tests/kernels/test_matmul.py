"""Matmul throughput: numpy (BLAS) and torch on the CPU, GEMV and GEMM, per dtype."""

from __future__ import annotations

from typing import Any

import pytest

from hearthside.kernels.matmul import (
    CPU_SHAPES,
    MIB,
    MatmulShape,
    measure_numpy_matmul,
    measure_torch_matmul,
    weight_copies,
)
from hearthside.kernels.torch_support import cpu_device, import_torch
from tests.kernels.stability import two_agreeing_runs

GEMV, GEMM = CPU_SHAPES
L3_BYTES = 32 * MIB  # this machine's; the figure only sizes the GEMV working set


@pytest.fixture(scope="module")
def torch() -> Any:
    module = import_torch()
    assert module is not None, "torch is a dev dependency: the torch CPU path must be tested"
    return module


def test_gemv_weights_rotate_over_copies_that_exceed_the_cache() -> None:
    assert weight_copies(GEMV, "fp32", L3_BYTES, 64 * MIB) == 1  # 64 MiB of weights already
    assert weight_copies(GEMV, "bf16", L3_BYTES, 64 * MIB) == 2
    assert weight_copies(GEMV, "int8", L3_BYTES, 64 * MIB) == 4
    assert weight_copies(GEMV, "fp32", 384 * MIB, 64 * MIB) == 12  # a big server L3
    # capped on a CPU: a VM reports its host's L3 (480 MiB) and making 2x that took seconds
    assert weight_copies(GEMV, "fp32", 480 * MIB, 64 * MIB, 512 * MIB) == 8
    assert weight_copies(GEMM, "int8", L3_BYTES, 64 * MIB) == 1  # compute-bound: no rotation


@pytest.mark.parametrize("dtype", ["fp32", "fp64"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=["gemv", "gemm"])
def test_numpy_matmul_is_plausible(dtype: str, shape: MatmulShape) -> None:
    measurement = measure_numpy_matmul(
        dtype, shape, budget_s=0.4, warmup_s=0.1, cache_bytes=L3_BYTES
    )
    assert measurement.ok and measurement.kind == "matmul" and measurement.device == "cpu"
    assert measurement.unit == "GFLOP/s"
    assert 0.5 < measurement.value < 100_000
    assert measurement.params["library"] == "numpy" and measurement.params["dtype"] == dtype
    if shape.m == 1:
        # decode-like: the weights stream from memory at a plausible bandwidth
        assert 0.5 < measurement.params["weights_gb_s"] < 500


def test_numpy_gemm_is_stable_across_two_runs() -> None:
    def run() -> float:
        return measure_numpy_matmul("fp32", GEMM, budget_s=0.8, warmup_s=0.2).value

    two_agreeing_runs(run)


def test_a_gemm_too_slow_for_its_budget_is_shrunk_and_says_so() -> None:
    measurement = measure_numpy_matmul(
        "fp32", MatmulShape(512, 2048, 2048), budget_s=0.03, warmup_s=0.0
    )
    assert measurement.ok
    assert measurement.params["m"] == 512
    assert measurement.params["n"] == measurement.params["k"] < 2048
    assert f"{measurement.params['n']}x{measurement.params['n']}" in measurement.method


@pytest.mark.parametrize(("dtype", "shape"), [("fp32", GEMM), ("bf16", GEMM), ("bf16", GEMV)])
def test_torch_cpu_matmul_is_plausible(torch: Any, dtype: str, shape: MatmulShape) -> None:
    measurement = measure_torch_matmul(
        torch, cpu_device(), dtype, shape, budget_s=0.5, warmup_s=0.1, cache_bytes=L3_BYTES
    )
    assert measurement.ok, measurement.note
    assert measurement.params["library"] == "torch" and measurement.params["dtype"] == dtype
    assert measurement.params["threads"] == torch.get_num_threads()
    assert 0.5 < measurement.value < 100_000


def test_torch_cpu_int8_runs_through_int_mm(torch: Any) -> None:
    measurement = measure_torch_matmul(
        torch, cpu_device(), "int8", GEMV, budget_s=0.5, warmup_s=0.1, cache_bytes=L3_BYTES
    )
    assert measurement.ok, measurement.note
    assert "_int_mm" in measurement.method
    assert measurement.value > 0.05  # torch's CPU int8 path is slow, but it runs


def test_torch_gemm_is_stable_across_two_runs(torch: Any) -> None:
    def run() -> float:
        return measure_torch_matmul(
            torch, cpu_device(), "fp32", GEMM, budget_s=0.8, warmup_s=0.2
        ).value

    two_agreeing_runs(run)


def test_a_matmul_that_cannot_run_is_reported_not_raised(torch: Any) -> None:
    # 4 TiB of fp32 weights: the allocation fails at once, as it would on a small GPU.
    huge = MatmulShape(1, 2**20, 2**20)
    measurement = measure_torch_matmul(
        torch, cpu_device(), "fp32", huge, budget_s=0.3, warmup_s=0.0
    )
    assert not measurement.ok
    assert measurement.note.startswith("fp32 matmul did not run on cpu: RuntimeError")
    assert measurement.params["n"] == 2**20
