"""A real cgroup memory limit for child processes, for the length of a test.

A fresh cgroup is made at the top of the memory hierarchy (v1's memory controller, else v2
with `memory` in the root's `cgroup.subtree_control`), a command is started in it by a shell
that moves itself in and then execs the command, and the cgroup is removed once the command
has ended. Needs root; where there is no memory controller or it is not writable, the test is
skipped with the reason.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from hearthside.core.probe.memory import CgroupMount, parse_cgroup_mounts, parse_memory_stat


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int  # 1 or 2
    swap_limited: bool  # no swap to escape to: the machine has none, or the cgroup may not use it

    def command(self, command: Sequence[str]) -> list[str]:
        """`command` run inside this cgroup (its children stay in it too)."""
        procs = shlex.quote(str(self.path / "cgroup.procs"))
        return ["sh", "-c", f'echo $$ > {procs} && exec "$@"', "sh", *command]

    def run(
        self, command: Sequence[str], *, env: dict[str, str] | None = None, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(command), capture_output=True, text=True, env=env, timeout=timeout
        )

    @property
    def peak_bytes(self) -> int | None:
        """The most this cgroup has been charged (memory.peak needs Linux 5.19 on v2)."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        text = _read(self.path / name)
        return int(text) if text.strip().isdigit() else None

    @property
    def oom_kills(self) -> int:
        """Processes the OOM killer ended in this cgroup."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        return parse_memory_stat(_read(self.path / name)).get("oom_kill", 0)


@contextmanager
def memory_limited_cgroup(limit_bytes: int) -> Iterator[MemoryCgroup]:
    """A new cgroup whose memory limit is `limit_bytes`; removed afterwards."""
    if not sys.platform.startswith("linux"):
        pytest.skip("cgroups are Linux's")
    mount = _writable_memory_mount()
    path = Path(mount.mount_point) / f"hearthside-test-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup under {mount.mount_point}: {exc}")
    try:
        limit_file = "memory.limit_in_bytes" if mount.version == 1 else "memory.max"
        _write(path / limit_file, str(limit_bytes))
        if mount.version == 1:  # no swap either, where the kernel accounts it
            swap_limited = _write_if_present(path / "memory.memsw.limit_in_bytes", str(limit_bytes))
        else:
            swap_limited = _write_if_present(path / "memory.swap.max", "0")
        yield MemoryCgroup(path, mount.version, swap_limited or not _swap_configured())
    finally:
        _remove(path)


def _writable_memory_mount() -> CgroupMount:
    try:
        mounts = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    except OSError as exc:
        pytest.skip(f"no /proc/self/mountinfo: {exc}")
    for mount in sorted(mounts, key=lambda mount: mount.version):  # v1's memory controller first
        top = Path(mount.mount_point)
        if mount.version == 2 and not _v2_memory_delegated(top):
            continue
        if os.access(top, os.W_OK):
            return mount
    pytest.skip(
        "no writable cgroup memory controller here (needs root, and v1's memory controller "
        "or v2 with memory in the root's cgroup.subtree_control)"
    )


def _v2_memory_delegated(top: Path) -> bool:
    """Children of `top` get the memory controller (not switched on here: that is the host's)."""
    return "memory" in _read(top / "cgroup.subtree_control").split()


def _remove(path: Path) -> None:
    """rmdir once the processes in it have ended (the kernel may take a moment to let go)."""
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
    path.rmdir()  # the last error, reported


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        pytest.skip(f"cannot write {path}: {exc}")


def _write_if_present(path: Path, text: str) -> bool:
    try:
        path.write_text(text)
    except OSError:  # absent where the kernel does not account swap
        return False
    return True


def _swap_configured() -> bool:
    return len(_read(Path("/proc/swaps")).splitlines()) > 1  # a header, then one line a device
