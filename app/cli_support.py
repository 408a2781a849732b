"""Small pieces every `hearthside` subcommand module shares."""

from __future__ import annotations

import argparse
import functools
import logging
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hearthside.core.errors import describe_error
from hearthside.core.logs import (
    claim_new_crash_reports,
    crash_notice,
    enable_crash_reports,
    setup_logging,
)
from hearthside.core.paths import data_dir

EXIT_ERROR = 2
Handler = Callable[[argparse.Namespace], int]
log = logging.getLogger(__name__)


def hearthside_version() -> str:
    try:
        return version("hearthside")
    except PackageNotFoundError:
        return "unknown"


def start_logging(process: str) -> Path:
    """What an entry point does first, once per process: log to the data dir's log file and
    keep a crash report open for `process` (e.g. "hearthside chat"); the log file's path."""
    root = data_dir()
    path = setup_logging(root)
    release = hearthside_version()
    enable_crash_reports(process, release, root)
    log.info("%s %s started", process, release)
    return path


def announce_crash_reports() -> None:
    """One stderr line when an earlier run left a crash report nobody has mentioned yet."""
    reports = claim_new_crash_reports()
    if reports:
        print(crash_notice(reports), file=sys.stderr)


def error_line(error: Exception) -> str:
    """`error: ...` for stderr: our message and hint, or a sentence naming the log file (where
    the traceback of anything unexpected went)."""
    return f"error: {describe_error(error)}"


def reports_errors(handler: Handler) -> Handler:
    """Print an error as `error: message` + hint on stderr and exit with 2; an unexpected one
    leaves its traceback in the log file instead of on the terminal."""

    @functools.wraps(handler)
    def run(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except Exception as exc:
            print(error_line(exc), file=sys.stderr)
            return EXIT_ERROR

    return run


def add_thread_options(
    parser: argparse.ArgumentParser, threads: int | None, batch: int | None
) -> None:
    """`--threads` and `--batch-threads`, with the defaults from the user's settings."""
    parser.add_argument("--threads", type=int, default=threads, help="decode threads")
    parser.add_argument("--batch-threads", type=int, default=batch, help="prompt threads")


def parallel_requests(text: str) -> int:
    """argparse's type for `--parallel N`: a whole number of slots from 1 to MAX_PARALLEL."""
    from hearthside.core.engine.config import MAX_PARALLEL  # psutil: only when parsing

    value = int(text) if text.strip().isdigit() else 0
    if not 1 <= value <= MAX_PARALLEL:
        raise argparse.ArgumentTypeError(
            f"parallel requests are a whole number from 1 to {MAX_PARALLEL}, not {text!r}"
        )
    return value


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as left-aligned columns, the first row being the header."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


# Characters that steer a terminal or reorder what it shows: C0 and C1 controls (ESC starts
# CSI and OSC sequences, BEL ends OSC, newlines fake table rows), DEL, the line and paragraph
# separators, and the BiDi embeddings, overrides, isolates and marks.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def printable(text: object) -> str:
    """`text` safe to print on a terminal: every control character shown as an escape
    (`\\x1b`, `\\n`, `\\u202e`), so a string from a model file cannot move the cursor, clear
    the screen, set the window title or add lines of its own."""
    return _UNPRINTABLE.sub(_escape_character, str(text))


def _escape_character(match: re.Match[str]) -> str:
    character = match.group()
    if character in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
