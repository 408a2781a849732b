"""Sequential read speed of the drive that holds the models folder, from the disk itself.

This bounds a model bigger than memory: llama.cpp then streams weights through mmap, and decode
speed approaches (bytes read per token) / (this bandwidth). The kernel writes a file of random
bytes into the models folder (random, so a compressing filesystem cannot shrink it), makes it
durable, then before every timed read asks the kernel to drop the file's cached pages
(`posix_fadvise(POSIX_FADV_DONTNEED)`; clean pages only, hence the fsync first; `F_NOCACHE` on
macOS). On Linux `mincore` then confirms how much of the file was still cached when the read
began (`cached_fraction_before` in params): a figure served from memory says so. One more cold
pass brings the file in by page faults instead, as mmap streams weights (`fault_read_s`;
`fault_read_gb_s` in params).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hearthside.core.units import MIB
from hearthside.kernels.measurement import Measurement, measure_until_stable

FILE_BYTES = 256 * MIB
QUICK_FILE_BYTES = 64 * MIB
READ_BLOCK_BYTES = 1 * MIB  # small enough that copying a cached block out stays in the CPU cache
WRITE_BLOCK_BYTES = 4 * MIB
FREE_SPACE_MARGIN_BYTES = 1024 * MIB
TEST_FILE_PREFIX = ".calibrate-"
TEST_FILE_SUFFIX = ".tmp"
STALE_TEST_FILE_AGE_S = 10 * 60
_F_NOCACHE_DARWIN = 48  # fcntl.h; Python's fcntl module does not name it everywhere


def cache_bypass_method() -> str:
    """How this OS lets a read skip the page cache: the name goes into the measurement."""
    if hasattr(os, "posix_fadvise"):
        return "posix_fadvise(DONTNEED)"
    if sys.platform == "darwin":
        return "F_NOCACHE"
    return "none"


def remove_stale_test_files(folder: Path, now_s: float | None = None) -> None:
    """Test files a killed calibration left behind (each is hundreds of MiB)."""
    now_s = time.time() if now_s is None else now_s
    for path in folder.glob(f"{TEST_FILE_PREFIX}*{TEST_FILE_SUFFIX}"):
        with contextlib.suppress(OSError):
            if now_s - path.stat().st_mtime > STALE_TEST_FILE_AGE_S:
                path.unlink()


@contextlib.contextmanager
def scratch_file(folder: Path, nbytes: int) -> Iterator[Path]:
    """A durable file of `nbytes` random bytes in `folder`, removed afterwards."""
    fd, name = tempfile.mkstemp(prefix=TEST_FILE_PREFIX, suffix=TEST_FILE_SUFFIX, dir=folder)
    path = Path(name)
    try:
        _write_random(fd, nbytes)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
        path.unlink(missing_ok=True)


def _write_random(fd: int, nbytes: int) -> None:
    _no_cache(fd)
    block = os.urandom(WRITE_BLOCK_BYTES)
    written = 0
    while written < nbytes:
        written += os.write(fd, block[: min(len(block), nbytes - written)])
    os.fsync(fd)


def _no_cache(fd: int) -> None:
    if sys.platform == "darwin":
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_NOCACHE", _F_NOCACHE_DARWIN), 1)


def drop_cached_pages(fd: int) -> None:
    """Ask the kernel to forget the file's cached (clean) pages."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    else:
        _no_cache(fd)


def read_file_s(path: Path, *, drop_cache: bool) -> float:
    """Seconds to read `path` start to end in READ_BLOCK_BYTES blocks, optionally cold."""
    buffer = bytearray(READ_BLOCK_BYTES)
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY)
    try:
        if drop_cache:
            drop_cached_pages(fd)
        started = time.perf_counter()
        while os.readv(fd, [view]):
            pass
        return time.perf_counter() - started
    finally:
        os.close(fd)


def cached_fraction(path: Path) -> float | None:
    """The share of `path`'s pages in the page cache now (Linux `mincore`), None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    size = path.stat().st_size
    if size == 0:
        return 0.0
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vector = (ctypes.c_ubyte * pages)()
            if libc.mincore(address, size, vector) != 0:
                return None
            return sum(byte & 1 for byte in vector) / pages
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def measure_disk_read(
    folder: Path,
    *,
    file_bytes: int,
    budget_s: float,
    device: str = "disk",
) -> Measurement:
    """Cold sequential read GB/s of a file written for the purpose into `folder`."""
    params: dict[str, Any] = {
        "file_bytes": file_bytes,
        "block_bytes": READ_BLOCK_BYTES,
        "cache_bypass": cache_bypass_method(),
    }
    method = f"sequential read of a {file_bytes // MIB} MiB new file, page cache dropped"
    remove_stale_test_files(folder)
    free_bytes = shutil.disk_usage(folder).free
    if free_bytes < file_bytes + FREE_SPACE_MARGIN_BYTES:
        note = f"not measured: only {free_bytes // MIB} MiB free in the models folder"
        return Measurement.failed("disk_read", device, "GB/s", note, method=method, params=params)
    fractions: list[float] = []
    with scratch_file(folder, file_bytes) as path:
        samples = measure_until_stable(
            lambda: file_bytes / _cold_read_s(path, fractions) / 1e9,
            budget_s=budget_s,
            warmup_s=0.0,
        )
        if hasattr(os, "posix_fadvise"):  # elsewhere the mapping may read the cache
            params["fault_read_gb_s"] = round(file_bytes / fault_read_s(path) / 1e9, 4)
    if fractions:
        params["cached_fraction_before"] = round(max(fractions), 4)
    return Measurement.from_samples(
        "disk_read", device, "GB/s", samples, method=method, params=params, note=_note(params)
    )


def _cold_read_s(path: Path, fractions: list[float]) -> float:
    """One read with the cache dropped first; records how much was cached when it began."""
    fd = os.open(path, os.O_RDONLY)
    try:
        drop_cached_pages(fd)
    finally:
        os.close(fd)
    fraction = cached_fraction(path)
    if fraction is not None:
        fractions.append(fraction)
    return read_file_s(path, drop_cache=True)


def fault_read_s(path: Path) -> float:
    """Seconds to bring `path` in by page faults from a cold cache, as llama.cpp's mapped
    weights stream when they do not fit in RAM: the file advised sequential (llama.cpp does
    so: each fault then reads twice the disk's read-ahead around it), one byte read per page
    in order. On the Sapphire Rapids VM (8 MiB read-ahead) faults read 1.5-1.9 GB/s where
    read() read 0.8-1.5, and llama.cpp streamed a model at ~1.2; on a 2-core EPYC streaming
    reached 0.35 of read()'s speed."""
    with path.open("rb") as file:
        drop_cached_pages(file.fileno())
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            pages = np.frombuffer(mapped, dtype=np.uint8)[:: mmap.PAGESIZE]
            started = time.perf_counter()
            pages.sum()
            seconds = time.perf_counter() - started
            del pages  # no view may outlive the mapping
    return seconds


def _note(params: dict[str, Any]) -> str:
    if params["cache_bypass"] == "none":
        return "this OS cannot drop a file from its cache: the figure may be memory speed"
    if params.get("cached_fraction_before", 0.0) > 0.5:
        return "the file stayed in memory (a RAM-backed folder?): the figure is memory speed"
    return ""


def disk_label(device: str | None) -> str:
    """The Measurement device for a block device path: "disk:/dev/nvme0n1p2", or "disk"."""
    return f"disk:{device}" if device else "disk"
