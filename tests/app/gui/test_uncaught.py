"""An exception nobody catches while the window runs: in the log file, in the message bar, and
the window carries on. A crash report an earlier run left is mentioned there once."""

from __future__ import annotations

import sys
import threading

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.app import GuiOptions, HearthsideApp, create_application
from hearthside.core.logs import CRASH_PREFIX, CRASH_SUFFIX, STACKS_FOLLOW, log_dir, setup_logging

pytestmark = pytest.mark.beside

SHOWN_TIMEOUT_MS = 5000


def _unbuilt_app() -> HearthsideApp:
    """The app with its window, as `run_gui` builds it, but neither started nor shown (the first
    paint would start the engine and install the default model)."""
    return HearthsideApp(create_application(), GuiOptions(probe_on_start=False))


def _raise_in_a_slot() -> None:
    raise ValueError("a bug in a slot, marker 4711")


# pytest-qt would count the exception as a test failure; here it is what is being tested.
@pytest.mark.qt_no_exception_capture
def test_an_exception_in_a_slot_is_logged_and_shown_with_the_log_location(
    qapp: QApplication, qtbot: QtBot
) -> None:
    log_path = setup_logging()  # as `hearthside gui` does before the window
    hearthside = _unbuilt_app()
    window = hearthside.window
    try:
        QTimer.singleShot(0, window, _raise_in_a_slot)
        qtbot.waitUntil(lambda: bool(window.message_bar.text), timeout=SHOWN_TIMEOUT_MS)

        shown = window.message_bar.text
        assert str(log_path) in shown and "ValueError" in shown
        assert window.message_bar.property("kind") == "error"
        assert "Traceback" not in shown and "marker 4711" not in shown
        logged = log_path.read_text(encoding="utf-8")
        assert "Traceback (most recent call last)" in logged
        assert "in _raise_in_a_slot" in logged
        assert "ValueError: a bug in a slot, marker 4711" in logged
        carried_on: list[bool] = []
        QTimer.singleShot(0, window, lambda: carried_on.append(True))
        qtbot.waitUntil(lambda: carried_on == [True], timeout=SHOWN_TIMEOUT_MS)  # loop lives on
    finally:
        hearthside.shutdown()
    assert sys.excepthook != hearthside._uncaught._on_uncaught  # put back on shutdown


@pytest.mark.qt_no_exception_capture
def test_an_exception_in_a_thread_is_shown_on_the_window(qapp: QApplication, qtbot: QtBot) -> None:
    log_path = setup_logging()
    hearthside = _unbuilt_app()
    window = hearthside.window
    try:
        worker = threading.Thread(target=_raise_in_a_slot, name="doomed-worker")
        worker.start()
        worker.join()
        qtbot.waitUntil(lambda: bool(window.message_bar.text), timeout=SHOWN_TIMEOUT_MS)
        assert str(log_path) in window.message_bar.text
        assert "marker 4711" in log_path.read_text(encoding="utf-8")
    finally:
        hearthside.shutdown()
    assert threading.excepthook != hearthside._uncaught._on_uncaught_in_thread


def test_a_crash_report_from_an_earlier_run_is_mentioned_once(qapp: QApplication) -> None:
    report = log_dir() / f"{CRASH_PREFIX}20260101-120000-1{CRASH_SUFFIX}"
    report.write_text(f"header\n{STACKS_FOLLOW}Fatal Python error: Segmentation fault\n")

    first = _unbuilt_app()
    try:
        assert str(report) in first.window.message_bar.text
        assert first.window.message_bar.property("kind") == "info"
    finally:
        first.shutdown()
    again = _unbuilt_app()
    try:
        assert str(report) not in again.window.message_bar.text
    finally:
        again.shutdown()
