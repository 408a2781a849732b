"""CPU memory bandwidth: plausible, stable across runs, and in line with a plain numpy sum."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from hearthside.kernels.measurement import Budget
from hearthside.kernels.memory import (
    BYTES_PER_PASS,
    MIB,
    MemoryArrays,
    array_bytes_for,
    measure_cpu_memory,
    measure_memory,
    memory_weight,
    thread_counts,
)
from tests.kernels.stability import relative_difference, two_agreeing_runs


@pytest.fixture(scope="module")
def arrays() -> MemoryArrays:
    return MemoryArrays.allocate(256 * MIB)


@pytest.fixture(scope="module")
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=max(all_threads())) as executor:
        yield executor


def all_threads() -> tuple[int, ...]:
    return thread_counts(os.cpu_count(), os.cpu_count())


def test_thread_counts_cover_one_to_all_cores_in_powers_of_two() -> None:
    assert thread_counts(2, 2) == (1, 2)
    assert thread_counts(6, 12) == (1, 2, 4, 6, 12)
    assert thread_counts(8, 16) == (1, 2, 4, 8, 16)
    assert thread_counts(None, None) == (1,)


def test_arrays_are_several_times_the_l3_cache_within_free_memory() -> None:
    assert array_bytes_for(32 * MIB, 24 * 1024 * MIB, quick=False) == 256 * MIB
    assert array_bytes_for(32 * MIB, 24 * 1024 * MIB, quick=True) == 64 * MIB
    assert array_bytes_for(96 * MIB, 512 * 1024 * MIB, quick=False) == 4 * 96 * MIB
    # a VM reporting its host's 480 MiB L3: capped, not 3 arrays of 1.9 GB
    assert array_bytes_for(480 * MIB, 24 * 1024 * MIB, quick=False) == 512 * MIB
    assert array_bytes_for(480 * MIB, 24 * 1024 * MIB, quick=True) == 256 * MIB
    assert array_bytes_for(384 * MIB, 2048 * MIB, quick=False) == 256 * MIB  # 1/8 of free


@pytest.mark.parametrize("kind", list(BYTES_PER_PASS))
def test_every_kernel_reports_plausible_bandwidth_on_one_and_all_cores(
    kind: str, arrays: MemoryArrays, pool: ThreadPoolExecutor
) -> None:
    for threads in (1, max(all_threads())):
        measurement = measure_memory(kind, arrays, threads, pool, budget_s=0.4, warmup_s=0.1)
        assert measurement.ok and measurement.kind == kind and measurement.device == "cpu"
        assert 1.0 < measurement.value < 500.0, measurement
        assert measurement.unit == "GB/s"
        params = dict(measurement.params)
        fastest = params.pop("fastest_gb_s")  # STREAM's best rate
        assert measurement.value <= fastest <= measurement.value * (1 + measurement.spread)
        assert params == {"threads": threads, "array_bytes": arrays.nbytes}
        assert measurement.repetitions >= 3


@pytest.mark.parametrize("threads", [1, max(all_threads())])
def test_read_bandwidth_is_stable_across_two_runs(
    threads: int, arrays: MemoryArrays, pool: ThreadPoolExecutor
) -> None:
    def run() -> float:
        return measure_memory(
            "memory_read", arrays, threads, pool, budget_s=0.8, warmup_s=0.2
        ).value

    two_agreeing_runs(run)


def plain_numpy_sum_gb_s(array: np.ndarray, repetitions: int = 5) -> float:
    """The independent figure: time np.sum over the whole array directly."""
    np.sum(array)
    times = []
    for _ in range(repetitions):
        started = time.perf_counter()
        np.sum(array)
        times.append(time.perf_counter() - started)
    return array.nbytes / statistics.median(times) / 1e9


def test_one_thread_read_agrees_with_a_plain_numpy_sum_over_the_same_array(
    arrays: MemoryArrays, pool: ThreadPoolExecutor
) -> None:
    # The same pages on both sides: where they sit decides the figure, not the timing. On the
    # CI VM a separate 1 GB mapping summed at 14.9 GB/s against 10.0 for the kernel's arrays, on
    # both tries; here 15.0 against 12.4, while np.sum over the kernel's own array gave 12.7.
    differences = []
    for _attempt in range(2):  # one retry: a neighbour's burst can hit either figure alone
        independent = plain_numpy_sum_gb_s(arrays.a)
        kernel = measure_memory("memory_read", arrays, 1, pool, budget_s=1.0, warmup_s=0.2)
        differences.append((kernel.value, independent))
        if relative_difference(kernel.value, independent) < 0.20:
            return
    raise AssertionError(f"kernel vs plain np.sum GB/s: {differences}")


def test_the_group_runs_every_kind_and_thread_count_and_skips_past_the_deadline() -> None:
    threads = (1, 2)
    budget = Budget(1.5, memory_weight(threads))
    measurements = measure_cpu_memory(
        array_bytes=64 * MIB, threads=threads, budget=budget, warmup_s=0.05
    )
    seen = [(m.kind, m.params["threads"]) for m in measurements]
    assert seen == [(kind, count) for kind in BYTES_PER_PASS for count in threads]
    assert all(m.ok for m in measurements)

    expired = Budget(1.0, memory_weight(threads), hard_deadline_s=0.0)
    skipped = measure_cpu_memory(
        array_bytes=16 * MIB, threads=threads, budget=expired, warmup_s=0.05
    )
    assert len(skipped) == 6 and not any(m.ok for m in skipped)
    assert all("time budget" in m.note for m in skipped)
