"""Disk read: the kernel reads a file it wrote, with the page cache really dropped."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import pytest

from hearthside.kernels.disk import (
    MIB,
    STALE_TEST_FILE_AGE_S,
    TEST_FILE_PREFIX,
    TEST_FILE_SUFFIX,
    cached_fraction,
    drop_cached_pages,
    fault_read_s,
    measure_disk_read,
    read_file_s,
    remove_stale_test_files,
    scratch_file,
)

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="mincore and posix_fadvise are Linux-only"
)


def leftover_test_files(folder: Path) -> list[Path]:
    return list(folder.glob(f"{TEST_FILE_PREFIX}*{TEST_FILE_SUFFIX}"))


def test_the_kernel_reports_a_plausible_cold_read_and_cleans_up(tmp_path: Path) -> None:
    measurement = measure_disk_read(
        tmp_path, file_bytes=64 * MIB, budget_s=0.5, device="disk:/dev/test"
    )
    assert measurement.ok and measurement.kind == "disk_read"
    assert measurement.device == "disk:/dev/test"
    assert 0.01 < measurement.value < 100.0, measurement
    assert measurement.params["file_bytes"] == 64 * MIB
    assert leftover_test_files(tmp_path) == []
    if sys.platform.startswith("linux"):
        assert measurement.params["cache_bypass"] == "posix_fadvise(DONTNEED)"
        # mincore saw (almost) nothing of the file cached when each timed read began
        assert measurement.params["cached_fraction_before"] < 0.05
        # and one more cold pass by page faults, as mmap streams weights
        assert 0.01 < measurement.params["fault_read_gb_s"] < 100.0, measurement


@linux_only
def test_a_fault_read_brings_the_whole_cold_file_in_through_the_mapping(tmp_path: Path) -> None:
    with scratch_file(tmp_path, 32 * MIB) as path:
        read_file_s(path, drop_cache=False)  # cached: the pass must drop it first
        before = bytes_read_from_storage()
        assert fault_read_s(path) > 0
        # the whole file came from the disk, not from the cache, and stays cached after
        assert bytes_read_from_storage() - before >= 0.95 * 32 * MIB
        assert cached_fraction(path) == pytest.approx(1.0, abs=0.05)


def bytes_read_from_storage() -> int:
    """What this process had the kernel fetch from storage (Linux /proc/self/io)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise AssertionError("no read_bytes in /proc/self/io")


@linux_only
def test_dropping_the_cache_really_evicts_the_file(tmp_path: Path) -> None:
    with scratch_file(tmp_path, 16 * MIB) as path:
        read_file_s(path, drop_cache=False)
        assert cached_fraction(path) == pytest.approx(1.0, abs=0.05)
        fd = os.open(path, os.O_RDONLY)
        try:
            drop_cached_pages(fd)
        finally:
            os.close(fd)
        assert cached_fraction(path) == pytest.approx(0.0, abs=0.05)


def median_read_s(path: Path, *, drop_cache: bool, repetitions: int = 3) -> float:
    return statistics.median(read_file_s(path, drop_cache=drop_cache) for _ in range(repetitions))


@linux_only
def test_a_cold_read_is_slower_than_a_cached_one(tmp_path: Path) -> None:
    with scratch_file(tmp_path, 64 * MIB) as path:
        observed = []
        for _attempt in range(2):  # one retry: a neighbour's burst can slow the cached read
            read_file_s(path, drop_cache=False)  # into the cache
            cached_s = median_read_s(path, drop_cache=False)
            cold_s = median_read_s(path, drop_cache=True)
            observed.append((cold_s, cached_s))
            if cold_s > 1.2 * cached_s:
                return
    raise AssertionError(f"cold vs cached read seconds: {observed}")


def test_too_little_free_space_is_reported_not_filled(tmp_path: Path) -> None:
    measurement = measure_disk_read(tmp_path, file_bytes=2**60, budget_s=0.1)
    assert not measurement.ok
    assert "free in the models folder" in measurement.note
    assert leftover_test_files(tmp_path) == []


def test_files_left_by_a_killed_calibration_are_removed(tmp_path: Path) -> None:
    stale = tmp_path / f"{TEST_FILE_PREFIX}old{TEST_FILE_SUFFIX}"
    fresh = tmp_path / f"{TEST_FILE_PREFIX}running{TEST_FILE_SUFFIX}"
    model = tmp_path / "model.gguf"
    for path in (stale, fresh, model):
        path.write_bytes(b"x")
    long_ago = time.time() - STALE_TEST_FILE_AGE_S - 60
    os.utime(stale, (long_ago, long_ago))
    os.utime(model, (long_ago, long_ago))
    remove_stale_test_files(tmp_path)
    assert not stale.exists()
    assert fresh.exists() and model.exists()
