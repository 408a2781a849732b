"""A ProbeContext that replays a recorded machine: its file tree, and its `sysctl -a` text."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hearthside.core.probe.base import ProbeContext


def recorded_context(root: Path, platform: str, machine: str) -> ProbeContext:
    sysctl_text = (root / "sysctl.txt").read_text() if platform == "darwin" else None

    def recorded_command(command: Sequence[str]) -> str | None:
        return sysctl_text if list(command) == ["sysctl", "-a"] else None

    return ProbeContext(root=root, platform=platform, machine=machine, run_command=recorded_command)
