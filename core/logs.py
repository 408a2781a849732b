"""Hearthside's log file and crash reports, both in `<data dir>/logs/`.

`setup_logging` sends every logger's records to `hearthside.log` (rotating, 0600), llama.cpp's
own lines (`hearthside.llama_cpp`, DEBUG) included; nothing logged goes to the terminal.
`enable_crash_reports` opens `crash-<time>-<pid>.txt` and points `faulthandler` at it, so a
native crash leaves the Python stacks there; on a clean exit the report, still holding only its
header, is removed. The entry points call both once per process; `crash_reports` lists what
real crashes left, and `claim_new_crash_reports` hands each one out once, for the next start to
mention.
"""

from __future__ import annotations

import atexit
import faulthandler
import logging
import os
import platform
import sys
import threading
import time
from io import TextIOWrapper
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import TextIO

from hearthside.core.paths import data_dir, ensure_private_dir, make_private_file

LOG_FILE_NAME = "hearthside.log"
LOG_MAX_BYTES = 4 * 1024 * 1024
LOG_BACKUPS = 3
LOG_FORMAT = "%(asctime)s %(process)d %(threadName)s %(levelname)s %(name)s: %(message)s"
CRASH_PREFIX = "crash-"
CRASH_SUFFIX = ".txt"
STACKS_FOLLOW = "--- Python stacks at the crash (faulthandler) ---\n"
ANNOUNCED_FILE_NAME = "crash-reports-announced.txt"
NATIVE_LOGGER = "hearthside.llama_cpp"

_lock = threading.Lock()
_handler: RotatingFileHandler | None = None
_crash_report: tuple[Path, TextIO] | None = None


def log_dir(root: Path | None = None) -> Path:
    """The folder holding the log file and the crash reports (created private)."""
    return ensure_private_dir((root if root is not None else data_dir()) / "logs")


def log_file(root: Path | None = None) -> Path:
    return log_dir(root) / LOG_FILE_NAME


# ---- the log file ----------------------------------------------------------------------------


class _PrivateRotatingFileHandler(RotatingFileHandler):
    """Rotates like its parent, but every file it opens (the first and each fresh one after a
    rotation) is readable by this user only: logs name model paths and errors."""

    def _open(self) -> TextIOWrapper:
        make_private_file(Path(self.baseFilename))
        return super()._open()

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not Path(self.baseFilename).parent.is_dir():
            return  # the data dir was removed (by hand, or a finished test's): nowhere to log
        super().emit(record)


def setup_logging(root: Path | None = None) -> Path:
    """Send all logging to the data dir's log file and return its path.

    Idempotent: a second call for the same data dir changes nothing; for another one (tests
    give each test its own `HEARTHSIDE_HOME`) the log moves there.
    """
    path = log_file(root)
    global _handler
    with _lock:
        if _handler is not None and _handler.baseFilename == os.path.abspath(path):
            return path
        handler = _PrivateRotatingFileHandler(
            path, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS, encoding="utf-8", delay=True
        )
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.setLevel(logging.DEBUG)
        top = logging.getLogger()
        if _handler is not None:
            top.removeHandler(_handler)
            _handler.close()
        top.addHandler(handler)
        _handler = handler
    logging.getLogger("hearthside").setLevel(logging.INFO)
    logging.getLogger(NATIVE_LOGGER).setLevel(logging.DEBUG)  # the loader's lines explain loads
    return path


# ---- crash reports ---------------------------------------------------------------------------


def enable_crash_reports(process: str, version: str, root: Path | None = None) -> Path | None:
    """Open this process's crash report and have `faulthandler` write to it; its path.

    None when faulthandler was already on (`python -X faulthandler`, pytest): whoever turned it
    on wants the stacks where they put them. Calling it again moves the report to `root`.
    """
    folder = log_dir(root)
    global _crash_report
    with _lock:
        if _crash_report is None and faulthandler.is_enabled():
            return None
        if _crash_report is not None and _crash_report[0].parent == folder:
            return _crash_report[0]
        _close_crash_report()
        _remove_reports_of_ended_processes(folder)
        path = folder / _report_name()
        make_private_file(path)
        report = path.open("w", encoding="utf-8")
        report.write(_crash_header(process, version, root))
        report.flush()
        faulthandler.enable(file=report, all_threads=True)
        _crash_report = (path, report)
    return path


def _report_name() -> str:
    return f"{CRASH_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}{CRASH_SUFFIX}"


def _crash_header(process: str, version: str, root: Path | None) -> str:
    return (
        "Hearthside crash report\n"
        f"process: {process} (pid {os.getpid()})\n"
        f"version: hearthside {version}, Python {platform.python_version()}, "
        f"{platform.platform()}\n"
        f"started: {time.strftime('%Y-%m-%d %H:%M:%S %z')}\n"
        f"log: {log_file(root)}\n\n"
        f"{STACKS_FOLLOW}"
    )


@atexit.register
def _close_crash_report() -> None:
    """On a clean exit there was no crash: the report holds only its header, so it goes."""
    global _crash_report
    if _crash_report is None:
        return
    path, report = _crash_report
    _crash_report = None
    faulthandler.disable()
    report.close()
    if not _holds_a_crash(path):
        path.unlink(missing_ok=True)


def _holds_a_crash(path: Path) -> bool:
    """True when faulthandler wrote anything after the header."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    _header, found, stacks = text.partition(STACKS_FOLLOW)
    return bool(found) and bool(stacks.strip())


def _remove_reports_of_ended_processes(folder: Path) -> None:
    """Header-only reports of processes that are gone were killed (SIGKILL, power loss), not
    crashed: nothing in them to read."""
    for path in _report_files(folder):
        pid = _pid_of(path)
        if pid is not None and not _process_exists(pid) and not _holds_a_crash(path):
            path.unlink(missing_ok=True)


def _report_files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"{CRASH_PREFIX}*{CRASH_SUFFIX}"))


def _pid_of(path: Path) -> int | None:
    tail = path.name.removesuffix(CRASH_SUFFIX).rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _process_exists(pid: int) -> bool:
    if pid == os.getpid():
        return True
    if sys.platform == "win32":
        return True  # os.kill(pid, 0) would terminate it there; keep the file
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def crash_reports(root: Path | None = None) -> list[Path]:
    """The reports that hold a crash, oldest first (names sort by time)."""
    return [path for path in _report_files(log_dir(root)) if _holds_a_crash(path)]


def claim_new_crash_reports(root: Path | None = None) -> list[Path]:
    """The crash reports no earlier start has mentioned yet; each is handed out only once."""
    announced_file = log_dir(root) / ANNOUNCED_FILE_NAME
    try:
        announced = set(announced_file.read_text(encoding="utf-8").split())
    except FileNotFoundError:
        announced = set()
    new = [path for path in crash_reports(root) if path.name not in announced]
    if new:
        make_private_file(announced_file)
        with announced_file.open("a", encoding="utf-8") as record:
            record.writelines(f"{path.name}\n" for path in new)
    return new


def crash_notice(reports: list[Path]) -> str:
    """One line telling the user that Hearthside crashed and where the report is."""
    latest = reports[-1]
    if len(reports) == 1:
        return f"Hearthside crashed on an earlier run; the crash report is {latest}"
    return f"Hearthside crashed on {len(reports)} earlier runs; the latest crash report is {latest}"
