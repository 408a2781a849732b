"""What the window and the terminal chat say, and log, when the engine worker crashes.

The service (core/engine/service.py) restarts a crashed worker by itself and tells its
listeners; these functions turn the crash and those notices into plain words, and write what
crashed — the cause and llama.cpp's last lines — to the log file, where `hearthside doctor`
points. No Qt here: the terminal chat uses them too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from hearthside.core.errors import EngineCrashedError
from hearthside.core.logs import setup_logging

if TYPE_CHECKING:  # the service module pulls in llama.cpp: the window shows before it loads
    from hearthside.core.engine.service import EngineNotice

log = logging.getLogger(__name__)


def log_crash(crash: EngineCrashedError) -> Path:
    """Write what crashed to the log file (set up here if the entry point has not, so the
    file named really holds it); the log file's path."""
    path = setup_logging()
    lines = "\n".join(f"    {line}" for line in crash.native_lines) or "    (none)"
    log.error(
        "the engine worker crashed: %s\n  %s\n  llama.cpp's last lines:\n%s",
        crash.cause or "unknown cause",
        crash.message,
        lines,
    )
    return path


def crashed_words(crash: EngineCrashedError) -> str:
    """E.g. "The engine crashed (SIGSEGV, a segmentation fault)"."""
    return f"The engine crashed ({crash.cause})" if crash.cause else "The engine crashed"


def crash_details(crash: EngineCrashedError, log_path: Path) -> str:
    """The cause and llama.cpp's last lines, for a "Details" view."""
    lines = "\n".join(crash.native_lines) or "(llama.cpp wrote nothing before it crashed)"
    return (
        f"What ended the engine: {crash.cause or 'unknown'}\n"
        f"llama.cpp's last lines:\n{lines}\n\n"
        f"This is also in the log file: {log_path}"
    )


def after_crash_text(crash: EngineCrashedError, notice: EngineNotice | None) -> str:
    """What Hearthside did about `crash`: restarting it (no news yet), restarted, or what
    to do now that it could not."""
    if notice is None or notice.kind == "crashed":
        return "Hearthside is restarting it…"
    if notice.kind == "restarted":
        return f"{notice.message} You can send your message again."
    # The service's text may begin with the crash's own message; it is said already.
    rest = notice.message.removeprefix(crash.message).strip()
    return f"It could not be restarted. {rest}"


def window_crash_text(
    crash: EngineCrashedError,
    notice: EngineNotice | None,
    *,
    in_reply: bool,
    kept: bool = True,
) -> str:
    """The window's message bar: what crashed, whether the reply was kept, what happened next.
    `in_reply`: it ended the window's reply; `kept`: some of that reply was written."""
    if in_reply and kept:
        what = f"{crashed_words(crash)} while writing this reply; the part already written is kept."
    elif in_reply:
        what = f"{crashed_words(crash)} before this reply's first words."
    else:
        what = f"{crashed_words(crash)}."
    return f"{what} {after_crash_text(crash, notice)}"
