"""The words the window and the terminal chat use for an engine crash and its restart."""

from __future__ import annotations

import pytest

from hearthside.app.engine_crash import after_crash_text, crash_details, window_crash_text
from hearthside.core.engine.service import EngineNotice
from hearthside.core.errors import EngineCrashedError
from hearthside.core.logs import log_file

pytestmark = pytest.mark.beside

CRASH = EngineCrashedError(
    "The engine crashed (SIGILL, an instruction this CPU does not have).",
    cause="SIGILL, an instruction this CPU does not have",
    native_lines=("load_tensors: CPU model buffer size = 98.00 MiB",),
)


def test_what_the_bar_says_from_the_crash_to_the_restart() -> None:
    kept = window_crash_text(CRASH, None, in_reply=True)
    assert kept == (
        "The engine crashed (SIGILL, an instruction this CPU does not have) while writing this "
        "reply; the part already written is kept. Hearthside is restarting it…"
    )
    restarted = EngineNotice("restarted", "The engine is running again, with the same settings.")
    assert window_crash_text(CRASH, restarted, in_reply=True, kept=False) == (
        "The engine crashed (SIGILL, an instruction this CPU does not have) before this reply's "
        "first words. The engine is running again, with the same settings. You can send your "
        "message again."
    )
    elsewhere = window_crash_text(CRASH, None, in_reply=False)  # an API request's, say
    assert elsewhere.endswith("does not have). Hearthside is restarting it…")


def test_a_failed_restart_says_why_and_what_next() -> None:
    failed = EngineNotice(
        "restart_failed",
        "The engine could not restart: The model file is gone.\nPut it back or load another.",
        CRASH,
    )
    assert after_crash_text(CRASH, failed) == (
        "It could not be restarted. The engine could not restart: The model file is gone.\n"
        "Put it back or load another."
    )


def test_the_details_hold_the_native_lines_and_the_log() -> None:
    details = crash_details(CRASH, log_file())
    assert "What ended the engine: SIGILL" in details
    assert "CPU model buffer size = 98.00 MiB" in details and str(log_file()) in details
