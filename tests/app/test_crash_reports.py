"""Crash reports and unexpected errors as the `hearthside` command meets them: child processes
set up the way the CLI does and then crash for real, and the real CLI on the next start."""

from __future__ import annotations

import argparse
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hearthside.app.cli_support import EXIT_ERROR, reports_errors
from hearthside.core.errors import ModelStoreError
from hearthside.core.logs import CRASH_PREFIX, claim_new_crash_reports, crash_reports, log_file

pytestmark = pytest.mark.beside

CHILD_TIMEOUT_S = 120
# What every entry point does first (`hearthside.app.cli.main`, `gui_main`), then `ending`.
CHILD_PROGRAM = """\
import faulthandler, os, signal, sys
from hearthside.app.cli_support import start_logging
start_logging("hearthside crash-test")
{ending}
"""


def run_child(home: Path, ending: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONFAULTHANDLER"}
    env["HEARTHSIDE_HOME"] = str(home)
    program = CHILD_PROGRAM.format(ending=textwrap.dedent(ending))
    return subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def report_files(home: Path) -> list[Path]:
    return sorted((home / "logs").glob(f"{CRASH_PREFIX}*"))


def private(path: Path) -> bool:
    return os.name != "posix" or stat.S_IMODE(path.stat().st_mode) == 0o600


def run_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HEARTHSIDE_HOME=str(home))
    return subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


# ---- crash reports ---------------------------------------------------------------------------


def test_a_native_crash_leaves_a_report_with_the_signal_and_the_stacks(
    hearthside_home: Path,
) -> None:
    result = run_child(
        hearthside_home,
        """
        def crash_in_native_code():
            faulthandler._sigsegv()
        crash_in_native_code()
        """,
    )

    assert result.returncode != 0
    if os.name == "posix":
        assert result.returncode == -signal.SIGSEGV
    [report] = crash_reports()
    assert report_files(hearthside_home) == [report]
    text = report.read_text(encoding="utf-8")
    assert "Fatal Python error: Segmentation fault" in text
    assert "in crash_in_native_code" in text  # the Python stack at the crash
    assert "process: hearthside crash-test (pid " in text
    assert "version: hearthside " in text
    assert str(log_file()) in text
    assert private(report)


def test_the_next_start_mentions_a_new_crash_report_once(hearthside_home: Path) -> None:
    run_child(hearthside_home, "faulthandler._sigsegv()")
    [report] = crash_reports()

    told = run_cli(hearthside_home, "remote", "list")
    again = run_cli(hearthside_home, "remote", "list")

    assert told.returncode == 0, told.stderr
    [line] = told.stderr.splitlines()
    assert "crashed" in line and str(report) in line
    assert "No remote servers saved" in told.stdout  # and the command ran as usual
    assert again.returncode == 0 and again.stderr == ""
    assert crash_reports() == [report]  # mentioned, not deleted
    assert claim_new_crash_reports() == []


@pytest.mark.parametrize(
    "ending",
    ["print('fine')", "sys.exit(3)", "raise ValueError('a Python error is not a crash')"],
)
def test_a_run_without_a_native_crash_leaves_no_report(hearthside_home: Path, ending: str) -> None:
    result = run_child(hearthside_home, ending)

    assert result.returncode in (0, 1, 3), result.stderr
    assert report_files(hearthside_home) == []
    assert crash_reports() == []


def test_a_killed_process_leaves_no_crash_to_report(hearthside_home: Path) -> None:
    killed = run_child(hearthside_home, "os.kill(os.getpid(), signal.SIGKILL)")
    if os.name == "posix":
        assert killed.returncode == -signal.SIGKILL
    assert crash_reports() == []  # its report holds only the header

    run_child(hearthside_home, "print('fine')")

    assert report_files(hearthside_home) == []  # the next start tidied it away


# ---- unexpected errors on the terminal -------------------------------------------------------


def _unforeseen(_args: argparse.Namespace) -> int:
    raise KeyError("no such thing, marker 5150")


def _foreseen(_args: argparse.Namespace) -> int:
    raise ModelStoreError("No model called 'x'.", hint="Run `hearthside models list`.")


def _interrupted(_args: argparse.Namespace) -> int:
    raise KeyboardInterrupt


def test_an_unexpected_error_is_one_line_naming_the_log_and_its_traceback_is_there(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert reports_errors(_unforeseen)(argparse.Namespace()) == EXIT_ERROR

    captured = capsys.readouterr()
    assert captured.err == (
        f"error: Something went wrong (KeyError). The details are in {log_file()}.\n"
    )
    logged = log_file().read_text(encoding="utf-8")
    assert "Traceback (most recent call last)" in logged and "in _unforeseen" in logged
    assert "KeyError: 'no such thing, marker 5150'" in logged


def test_our_errors_keep_their_words_and_ctrl_c_stays_ctrl_c(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert reports_errors(_foreseen)(argparse.Namespace()) == EXIT_ERROR
    assert capsys.readouterr().err == (
        "error: No model called 'x'.\nRun `hearthside models list`.\n"
    )
    with pytest.raises(KeyboardInterrupt):
        reports_errors(_interrupted)(argparse.Namespace())
