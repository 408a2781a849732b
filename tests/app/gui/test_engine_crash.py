"""The engine worker crashes while the window writes a reply: a real SIGSEGV sent to the real
worker (SmolLM2 135M) once text has streamed. The part written stays in the view and the
history, the message bar says what happened and then that the engine was restarted, the crash
is in the log file, and the next message is answered."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.chat_session import CRASHED_NOTE
from hearthside.app.gui.main_window import MainWindow
from hearthside.core.errors import EngineCrashedError
from hearthside.core.logs import log_file
from tests.app.gui.window_helpers import open_window, use_settings

pytestmark = [pytest.mark.gui, pytest.mark.beside]

REPLY_TIMEOUT_MS = 120_000
STORY = "Tell me a long story about a lighthouse keeper."


@pytest.fixture
def window(
    qapp: QApplication, chat_model_file: Path, hearthside_home: Path
) -> Iterator[MainWindow]:
    with open_window(hearthside_home, str(chat_model_file), n_ctx=512, threads=1) as opened:
        yield opened


def test_a_crash_mid_reply_keeps_the_reply_says_so_and_the_chat_goes_on(
    window: MainWindow, qtbot: QtBot, hearthside_home: Path
) -> None:
    use_settings(window, max_tokens=400)
    first_pid = window.service.worker_pid if window.service else None
    assert first_pid is not None
    bar = window.message_bar

    assert window.session.send(STORY)
    qtbot.waitUntil(lambda: len(window.session.reply_text or "") >= 12, timeout=REPLY_TIMEOUT_MS)
    with qtbot.waitSignal(window.session.reply_crashed, timeout=30_000) as crashed:
        os.kill(first_pid, signal.SIGSEGV)
    crash: EngineCrashedError = crashed.args[0]
    assert crashed.args[1] is True  # some of the reply was written, and so kept
    assert crash.cause == "SIGSEGV, a segmentation fault"

    # The part written is kept: in the history, complete like a stopped reply, and on screen.
    assert window.session.current_id is not None
    stored = window.store.messages(window.session.current_id)
    assert [(m.role, m.complete) for m in stored] == [("user", True), ("assistant", True)]
    partial = stored[1].content
    assert len(partial) >= 12
    shown = window.chat_pane.view.toPlainText()
    assert partial.split()[0] in shown and CRASHED_NOTE in shown
    assert "SIGSEGV, a segmentation fault" in bar.text
    assert "while writing this reply; the part already written is kept" in bar.text

    # The service restarts the worker by itself; the bar says so, the details stay.
    qtbot.waitUntil(lambda: "send your message again" in bar.text, timeout=60_000)
    assert bar.text.startswith("The engine crashed (SIGSEGV, a segmentation fault) while")
    assert "running again, with the same settings" in bar.text
    assert window.service is not None and window.service.worker_pid not in (None, first_pid)
    assert not bar.details_button.isHidden()
    # only llama.cpp's lines from this reply are quoted (none of an earlier request's)
    if crash.native_lines:
        assert crash.native_lines[-1] in bar.details
    else:
        assert "llama.cpp wrote nothing before it crashed" in bar.details
    assert str(log_file(hearthside_home)) in bar.details
    bar.details_button.click()
    assert bar.details_view.isVisibleTo(bar)

    logged = log_file(hearthside_home).read_text(encoding="utf-8")
    assert "the engine worker crashed: SIGSEGV, a segmentation fault" in logged
    assert not crash.native_lines or crash.native_lines[-1] in logged

    # The next message is answered, with the kept reply in front of it.
    use_settings(window, max_tokens=8)
    with qtbot.waitSignal(window.bridge.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        assert window.session.send("Thank you. Say goodbye.")
    qtbot.waitUntil(lambda: window.session.mode == "idle", timeout=10_000)
    assert finished.args[0].text
    stored = window.store.messages(window.session.current_id)
    assert [m.role for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1].content == partial and stored[3].content == finished.args[0].text


def test_a_restart_that_fails_says_what_to_do_next(qtbot: QtBot) -> None:
    from hearthside.core.engine.service import EngineNotice

    window = MainWindow(None)
    qtbot.addWidget(window)
    crash = EngineCrashedError(
        "The engine crashed (SIGABRT, llama.cpp aborted, e.g. a failed GGML_ASSERT).",
        cause="SIGABRT, llama.cpp aborted, e.g. a failed GGML_ASSERT",
        native_lines=("ggml.c:1234: GGML_ASSERT(n > 0) failed",),
    )
    gave_up = (
        f"{crash.message} It crashed again with the safest settings, so Hearthside stopped "
        "restarting it. Load the model again, or run `hearthside engine selftest`."
    )
    window.model_label.setText("SmolLM2")
    window.bridge.engine_notice.emit(EngineNotice("restart_failed", gave_up, crash))
    assert window.message_bar.text == (
        "The engine crashed (SIGABRT, llama.cpp aborted, e.g. a failed GGML_ASSERT). It could "
        "not be restarted. It crashed again with the safest settings, so Hearthside stopped "
        "restarting it. Load the model again, or run `hearthside engine selftest`."
    )
    assert "GGML_ASSERT(n > 0) failed" in window.message_bar.details
    assert window.model_label.text() == "No model loaded"
    assert window.chat_pane.mode == "unavailable"
