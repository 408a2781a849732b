"""A real small filesystem for disk-full tests: a tmpfs mounted for the length of a test."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """Mount a `size_mib` tmpfs at `path` (needs root; where mounting is refused the test is
    skipped — the file-size-limit test in test_download.py covers the same code without it)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
