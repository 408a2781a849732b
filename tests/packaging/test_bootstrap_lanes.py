"""`python3 bootstrap.py test` runs the tests marked `beside` in a second, lowered pytest
while the others run at the normal priority; a failure in either lane fails the run, and a
run where neither lane had a test is no success."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from bootstrap import BESIDE_NICENESS, lanes_code  # noqa: E402

MARKERS = "[pytest]\nmarkers =\n    beside: runs beside the others\n"
PLAIN = "import os\n\ndef test_plain():\n    assert os.nice(0) == {niceness}\n"
BESIDE = (
    "import os\nimport pytest\n\n"
    "@pytest.mark.beside\n"
    "def test_beside():\n"
    "    assert os.nice(0) == {niceness}\n"
)


@pytest.mark.parametrize(
    ("alone", "beside", "expected"),
    [(0, 0, 0), (1, 0, 1), (0, 1, 1), (0, 5, 0), (5, 0, 0), (5, 5, 5), (5, 2, 2)],
)
def test_one_exit_status_for_both_lanes(alone: int, beside: int, expected: int) -> None:
    assert lanes_code(alone, beside) == expected


def run_lanes(project: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys, bootstrap; sys.exit(bootstrap.run_pytest(sys.executable, ['-q']))"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=project, capture_output=True, text=True, timeout=120
    )


def make_project(tmp_path: Path, beside_niceness: int) -> Path:
    """Its plain test expects this process's priority, its beside test `beside_niceness`."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "bootstrap.py", project / "bootstrap.py")
    (project / "pytest.ini").write_text(MARKERS)
    (project / "tests" / "test_plain.py").write_text(PLAIN.format(niceness=os.nice(0)))
    (project / "tests" / "test_beside.py").write_text(BESIDE.format(niceness=beside_niceness))
    return project


def test_the_beside_lane_runs_lowered_and_its_report_is_shown(tmp_path: Path) -> None:
    done = run_lanes(make_project(tmp_path, min(19, os.nice(0) + BESIDE_NICENESS)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("1 passed, 1 deselected") == 2  # each lane ran its one test


def test_a_failure_in_the_beside_lane_fails_the_run(tmp_path: Path) -> None:
    done = run_lanes(make_project(tmp_path, os.nice(0)))  # it runs lowered: fails
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED tests/test_beside.py::test_beside" in done.stdout
