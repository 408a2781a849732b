"""CPU memory bandwidth with numpy: read, copy and triad, on one core up to all of them.

numpy runs each operation on one core, so N Python threads each work on their own slice
(numpy releases the GIL inside its loops) and the bytes of all slices are divided by the wall
time of the pass. Bytes are counted as STREAM counts them: per pass read moves 1 array, copy 2
(read + write) and triad 3 (two reads + one write); the write-allocate read a CPU makes before
an ordinary store is not counted, so copy and triad understate the traffic the bus carried.
The arrays are several times the last-level cache, so every pass comes from DRAM, and they lie
in the pages llama.cpp's weights get (`MemoryArrays.allocate`).
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from hearthside.core.units import MIB
from hearthside.kernels.measurement import (
    FASTEST_PARAM,
    SKIPPED_NOTE,
    Budget,
    Measurement,
    measure_until_stable,
    timed_s,
)

ARRAY_BYTES_FLOOR = 256 * MIB
QUICK_ARRAY_BYTES_FLOOR = 64 * MIB
CACHE_MULTIPLE = 4  # arrays this many times the L3 cache leave nothing of the last pass there
QUICK_CACHE_MULTIPLE = 2
# At most this much per array: a VM may report its host's L3 (480 MiB on the 2-core Sapphire
# Rapids VM, whose numpy reads fall to RAM speed from 64 MiB on), and three arrays of 4x that
# took 5.7 GB and a quick calibration's whole budget before the first pass.
MAX_ARRAY_BYTES = 512 * MIB
QUICK_MAX_ARRAY_BYTES = 256 * MIB
# Triad runs through the arrays in chunks whose temporary stays in L2, so s * c never makes a
# round trip to DRAM and the pass moves exactly two reads and one write.
TRIAD_CHUNK_ELEMENTS = 32768
TRIAD_SCALAR = 3.0
BYTES_PER_PASS = {"memory_read": 1, "memory_copy": 2, "memory_triad": 3}
OPERATION_TEXT = {
    "memory_read": "add.reduce",
    "memory_copy": "copyto",
    "memory_triad": "a = b + s*c (L2-sized chunks)",
}

StepCallback = Callable[[str, float], None]  # (what runs now, fraction of this group done)


def array_bytes_for(l3_cache_bytes: int | None, available_bytes: int | None, *, quick: bool) -> int:
    """Bytes per array: several times L3, at least the floor, at most the cap, and at most
    1/8 of free memory (three arrays are live at once)."""
    floor = QUICK_ARRAY_BYTES_FLOOR if quick else ARRAY_BYTES_FLOOR
    multiple = QUICK_CACHE_MULTIPLE if quick else CACHE_MULTIPLE
    cap = QUICK_MAX_ARRAY_BYTES if quick else MAX_ARRAY_BYTES
    wanted = min(cap, max(floor, multiple * (l3_cache_bytes or 0)))
    if available_bytes:
        wanted = min(wanted, max(16 * MIB, available_bytes // 8))
    return wanted - wanted % MIB


def thread_counts(physical_cores: int | None, logical_cores: int | None) -> tuple[int, ...]:
    """1, 2, 4, … up to the physical cores, then the physical and logical counts themselves."""
    physical = max(1, physical_cores or logical_cores or 1)
    logical = max(physical, logical_cores or physical)
    counts = {1, physical, logical}
    power = 2
    while power < physical:
        counts.add(power)
        power *= 2
    return tuple(sorted(counts))


@dataclass
class MemoryArrays:
    """Three float64 arrays, touched once so their pages exist before anything is timed."""

    a: np.ndarray
    b: np.ndarray
    c: np.ndarray

    @classmethod
    def allocate(cls, array_bytes: int) -> MemoryArrays:
        return cls(mapped_ones(array_bytes), mapped_ones(array_bytes), mapped_ones(array_bytes))

    @property
    def nbytes(self) -> int:
        return int(self.a.nbytes)


def mapped_ones(array_bytes: int) -> np.ndarray:
    """float64 ones in an anonymous mapping, as llama.cpp's weights are mapped: numpy's own
    allocator asks for transparent huge pages, which llama.cpp's buffers do not get where
    THP is "madvise" (the common default). On the 2-core Sapphire Rapids VM numpy's huge pages
    read 31.8 GB/s on 2 threads and these 18.6-19.6, and three 512 MiB arrays took 1.7-4.4 s to
    allocate against 0.7-0.8."""
    count = max(1, array_bytes // 8)
    if hasattr(mmap, "MAP_PRIVATE"):  # POSIX: private, as malloc's large blocks are
        mapping = mmap.mmap(-1, count * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:  # Windows: an anonymous mapping is private already
        mapping = mmap.mmap(-1, count * 8)
    array = np.frombuffer(mapping, dtype=np.float64)
    array.fill(1.0)
    return array


def _split(array: np.ndarray, parts: int) -> list[np.ndarray]:
    return list(np.array_split(array, parts))


def _slice_work(kind: str, arrays: MemoryArrays, threads: int) -> list[Callable[[], object]]:
    """One callable per thread, each over its own slice."""
    a, b, c = (_split(x, threads) for x in (arrays.a, arrays.b, arrays.c))
    if kind == "memory_read":
        return [functools.partial(np.add.reduce, part) for part in a]
    if kind == "memory_copy":
        return [functools.partial(np.copyto, dst, src) for dst, src in zip(c, a, strict=True)]
    return [functools.partial(_triad, x, y, z) for x, y, z in zip(a, b, c, strict=True)]


def _triad(out: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
    scratch = np.empty(TRIAD_CHUNK_ELEMENTS)
    for start in range(0, len(out), TRIAD_CHUNK_ELEMENTS):
        stop = min(start + TRIAD_CHUNK_ELEMENTS, len(out))
        scaled = scratch[: stop - start]
        np.multiply(c[start:stop], TRIAD_SCALAR, out=scaled)
        np.add(b[start:stop], scaled, out=out[start:stop])


def _run_together(pool: ThreadPoolExecutor, work: list[Callable[[], object]]) -> None:
    futures = [pool.submit(item) for item in work]
    for future in futures:
        future.result()


def measure_memory(
    kind: str,
    arrays: MemoryArrays,
    threads: int,
    pool: ThreadPoolExecutor,
    *,
    budget_s: float,
    warmup_s: float,
) -> Measurement:
    """GB/s of one kernel (`memory_read`, `memory_copy` or `memory_triad`) on `threads` cores."""
    work = _slice_work(kind, arrays, threads)
    bytes_per_pass = BYTES_PER_PASS[kind] * arrays.nbytes
    samples = measure_until_stable(
        lambda: bytes_per_pass / timed_s(lambda: _run_together(pool, work)) / 1e9,
        budget_s=budget_s,
        warmup_s=warmup_s,
    )
    method = (
        f"numpy {OPERATION_TEXT[kind]} over {arrays.nbytes // MIB} MiB float64 arrays, "
        f"{threads} thread{'s' if threads > 1 else ''} on own slices"
    )
    return Measurement.from_samples(
        kind,
        "cpu",
        "GB/s",
        samples,
        method=method,
        params={
            "threads": threads,
            "array_bytes": arrays.nbytes,
            FASTEST_PARAM: round(max(samples.values), 3),
        },
    )


def measure_cpu_memory(
    *,
    array_bytes: int,
    threads: tuple[int, ...],
    budget: Budget,
    warmup_s: float,
    step: StepCallback | None = None,
) -> list[Measurement]:
    """Read, copy and triad at every thread count, within `budget` (allocation included)."""
    jobs = [(kind, count) for kind in BYTES_PER_PASS for count in threads]
    if step is not None:  # a loaded machine can spend the whole share here
        step("memory: allocating the test arrays", 0.0)
    budget.take()  # the allocation's share
    arrays = MemoryArrays.allocate(array_bytes)
    measurements = []
    with ThreadPoolExecutor(max_workers=max(threads), thread_name_prefix="membw") as pool:
        for done, (kind, count) in enumerate(jobs):
            if budget.expired():
                measurements.append(_skipped(kind, count, arrays.nbytes))
                continue
            if step is not None:
                step(f"{kind.replace('_', ' ')}, {count} thread(s)", done / len(jobs))
            share_s = budget.take()
            measurements.append(
                measure_memory(kind, arrays, count, pool, budget_s=share_s, warmup_s=warmup_s)
            )
    return measurements


def memory_weight(threads: tuple[int, ...]) -> int:
    """The number of `Budget` shares `measure_cpu_memory` takes."""
    return len(BYTES_PER_PASS) * len(threads) + 1


def _skipped(kind: str, threads: int, array_bytes: int) -> Measurement:
    params = {"threads": threads, "array_bytes": array_bytes}
    return Measurement.failed(kind, "cpu", "GB/s", SKIPPED_NOTE, params=params)
