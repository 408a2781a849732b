"""What survives: a first run that installs the default model, a restart, and a kill -9 in
the middle of a reply. Real processes, the real default model, real SQLite."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.app import GuiOptions, HearthsideApp, create_application
from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.window_state import SETTINGS_FILE_NAME
from hearthside.core.history.store import ConversationStore
from hearthside.core.models.default_model import DEFAULT_MODEL_NAME
from tests.app.gui.window_helpers import open_window, use_settings

pytestmark = pytest.mark.gui

REPLY_TIMEOUT_MS = 120_000
STREAMING_WINDOW = Path(__file__).with_name("streaming_window.py")
SHOWN_BEFORE_KILL_CHARS = 80


def test_first_run_installs_probes_and_everything_survives_a_restart(
    qapp: QApplication, qtbot: QtBot, hearthside_home: Path
) -> None:
    progress: list[int] = []

    def watch_install(window: MainWindow) -> None:
        window.install_progress.valueChanged.connect(progress.append)

    with open_window(hearthside_home, "default", probe=True, before_start=watch_install) as first:
        assert progress and max(progress) == 100  # the install was shown in the window
        assert first.model_label.text() == DEFAULT_MODEL_NAME
        assert first.banner.isVisibleTo(first)
        qtbot.waitUntil(lambda: first.hardware_page.profile is not None, timeout=60_000)
        use_settings(first, max_tokens=16)
        first.chat_pane.input.setPlainText("Name a colour.")
        with qtbot.waitSignal(first.bridge.reply_finished, timeout=REPLY_TIMEOUT_MS):
            first.chat_pane.submit()
        qtbot.waitUntil(lambda: first.session.mode == "idle", timeout=10_000)
        conversation = first.session.current_id
        assert conversation is not None
        before = first.store.messages(conversation)
        qtbot.mouseClick(first.banner.dismiss_button, Qt.MouseButton.LeftButton)
        width = max(760, first.minimumSizeHint().width())  # the offscreen screen is 800 x 600
        first.resize(width, 560)
        first.sidebar_splitter.setSizes([250, 500])
        sidebar = first.sidebar_splitter.sizes()
        size = (first.width(), first.height())
        assert size == (width, 560)
    progress.clear()
    with open_window(hearthside_home, "default", before_start=watch_install) as second:
        assert progress == []  # installed once, not again
        assert second.session.current_id == conversation
        assert second.store.messages(conversation) == before
        assert second.conversation_list.ids() == [conversation]
        assert before[-1].content.split()[0] in second.chat_pane.view.toPlainText()
        assert not second.banner.isVisibleTo(second)
        assert (second.width(), second.height()) == size
        assert second.sidebar_splitter.sizes() == sidebar
    # The window's settings live in the data dir, not in the user's ~/.config.
    assert (hearthside_home / SETTINGS_FILE_NAME).is_file()


def _read_lines(stream: object, into: queue.Queue[str]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.put(line.decode(errors="replace").strip())


def test_kill_9_mid_reply_keeps_every_character_that_was_shown(
    hearthside_home: Path, default_model_file: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, HEARTHSIDE_HOME=str(hearthside_home), QT_QPA_PLATFORM="offscreen")
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, str(STREAMING_WINDOW), str(default_model_file)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True).start()
    shown = 0
    deadline = time.monotonic() + 180
    try:
        while shown < SHOWN_BEFORE_KILL_CHARS:
            remaining = deadline - time.monotonic()
            assert remaining > 0, "the reply never streamed: " + stderr_path.read_text()
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line != "finished", "the reply ended before the kill"
            if line.startswith("shown "):
                shown = int(line.split()[1])
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    with ConversationStore(hearthside_home) as store:
        [conversation] = store.list()
        user, reply = store.messages(conversation.id)
    assert user.content.startswith("Write a very long story")
    assert reply.role == "assistant" and not reply.complete and reply.interrupted
    assert len(reply.content) >= shown >= SHOWN_BEFORE_KILL_CHARS


def test_the_app_owns_one_engine_and_stops_it_on_close(
    qapp: QApplication, qtbot: QtBot, default_model_file: Path
) -> None:
    engines_before = set(_engine_threads())
    hearthside = HearthsideApp(
        create_application(), GuiOptions(model=str(default_model_file), probe_on_start=False)
    )
    assert hearthside.service is None  # the engine starts once the window is on screen
    hearthside.start()
    window = hearthside.window
    qtbot.waitUntil(lambda: window.bridge.loaded_model is not None, timeout=REPLY_TIMEOUT_MS)
    assert len(set(_engine_threads()) - engines_before) == 1  # one engine for the app
    assert hearthside.service is not None
    assert window.isVisible() and window.windowTitle() == "Hearthside"
    assert window.bridge.service is hearthside.service
    assert window.api_switch.parent() is window.toolbar
    hearthside.shutdown()
    assert not window.isVisible()
    assert hearthside.service.loaded_config is None  # the engine thread unloaded the model
    assert set(_engine_threads()) <= engines_before  # and it has ended


def _engine_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hearthside-engine" and t.is_alive()]


def test_bare_hearthside_opens_the_window_where_there_is_a_display(
    hearthside_home: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, HEARTHSIDE_HOME=str(hearthside_home), QT_QPA_PLATFORM="offscreen")
    stderr_path = tmp_path / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        child = subprocess.Popen(
            [sys.executable, "-m", "hearthside.app.cli"],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        deadline = time.monotonic() + 60
        # The window opens its history and settings at once; the terminal chat never does.
        while not (hearthside_home / SETTINGS_FILE_NAME).exists():
            assert child.poll() is None, stderr_path.read_text()
            assert time.monotonic() < deadline, "no window after 60 s: " + stderr_path.read_text()
            time.sleep(0.1)
        assert (hearthside_home / "history.db").exists()
        assert child.poll() is None  # the event loop is running
    finally:
        child.kill()
        child.wait()
    assert "terminal chat" not in stderr_path.read_text()
