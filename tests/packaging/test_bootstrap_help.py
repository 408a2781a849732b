"""`python3 bootstrap.py --help` on a fresh clone says what the two commands do, at once,
instead of spending the first setup's minutes before Hearthside prints its own help."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside

ROOT = Path(__file__).resolve().parents[2]


def test_help_prints_the_commands_and_sets_nothing_up(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    shutil.copy(ROOT / "bootstrap.py", clone / "bootstrap.py")
    for flag in ("--help", "-h"):
        done = subprocess.run(
            [sys.executable, str(clone / "bootstrap.py"), flag],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "python3 bootstrap.py test" in done.stdout
        assert ".venv/bin/hearthside --help" in done.stdout
    assert sorted(p.name for p in clone.iterdir()) == ["bootstrap.py"]  # no .venv, nothing
