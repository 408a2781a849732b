"""The window's own chat model unloads after the idle time when the user asked for it
(Settings: "Also the model you chat with here"), so its memory returns; sending a message
loads it again and the message is answered. It stays loaded without that choice, and while
the Local API is on. A real window (offscreen), the real default chat model, real workers."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import MainWindow
from hearthside.core.settings import save_user_settings
from tests.app.gui.window_helpers import open_window, use_settings

pytestmark = pytest.mark.gui

IDLE_S = 2
LOAD_TIMEOUT_MS = 60_000
REPLY_TIMEOUT_MS = 120_000


def idle_settings(home: Path, *, chat_too: bool) -> None:
    home.mkdir(parents=True, exist_ok=True)
    save_user_settings({"idle_unload_s": IDLE_S, "idle_unload_chat": chat_too or None}, home)


def worker_of(window: MainWindow) -> psutil.Process:
    pid = window.service.worker_pid
    assert pid is not None, "no engine worker: the model is not loaded"
    return psutil.Process(pid)


def test_an_idle_chat_model_unloads_frees_its_process_and_loads_again_on_send(
    qapp: object, qtbot: QtBot, hearthside_home: Path, chat_model_file: Path
) -> None:
    idle_settings(hearthside_home, chat_too=True)
    with open_window(hearthside_home, str(chat_model_file)) as window:
        worker = worker_of(window)
        assert worker.memory_info().rss > 0
        qtbot.waitUntil(lambda: window.bridge.asleep is not None, timeout=IDLE_S * 1000 + 10_000)
        worker.wait(timeout=10)  # the worker ended: its memory is back with the system
        assert window.service.worker_pid is None and window.bridge.loaded_model is None
        assert window.model_label.text().endswith("(unloaded while idle)")
        assert "loads again when you send a message" in window.message_bar.text
        assert window.session.mode == "idle" and window.chat_pane.send_button.isEnabled()

        use_settings(window, max_tokens=8)
        window.chat_pane.input.setPlainText("Name a colour.")
        with qtbot.waitSignal(window.bridge.reply_finished, timeout=REPLY_TIMEOUT_MS):
            window.chat_pane.submit()
            assert window.session.mode == "unavailable"  # loading first, then the reply
        qtbot.waitUntil(lambda: window.session.mode == "idle", timeout=10_000)  # reply saved
        assert window.bridge.asleep is None and window.bridge.loaded_model is not None
        assert window.model_label.text() == window.bridge.loaded_model.name
        conversation = window.session.current_id
        assert conversation is not None
        user, reply = window.store.messages(conversation)
        assert user.content == "Name a colour." and reply.content.strip()
        assert worker_of(window).pid != worker.pid


def test_without_the_choice_the_chat_model_stays_loaded(
    qapp: object, qtbot: QtBot, hearthside_home: Path, chat_model_file: Path
) -> None:
    idle_settings(hearthside_home, chat_too=False)
    with open_window(hearthside_home, str(chat_model_file)) as window:
        worker = worker_of(window)
        qtbot.wait(IDLE_S * 1000 + 1500)
        assert window.bridge.asleep is None and worker.is_running()
        assert worker_of(window).pid == worker.pid


def test_while_the_local_api_is_on_the_chat_model_stays_loaded(
    qapp: object, qtbot: QtBot, hearthside_home: Path, chat_model_file: Path
) -> None:
    from tests.core.server.test_api import free_port

    idle_settings(hearthside_home, chat_too=True)
    with open_window(hearthside_home, str(chat_model_file)) as window:
        worker = worker_of(window)
        window.api_switch.set_port(free_port())
        window.api_switch.toggle.click()
        qtbot.waitUntil(lambda: window.api_switch.running, timeout=LOAD_TIMEOUT_MS)
        qtbot.wait(IDLE_S * 1000 + 1500)
        assert window.bridge.asleep is None and worker.is_running()
        window.api_switch.toggle.click()  # off: the idle time counts from now
        qtbot.waitUntil(lambda: not window.api_switch.running, timeout=LOAD_TIMEOUT_MS)
        qtbot.waitUntil(lambda: window.bridge.asleep is not None, timeout=IDLE_S * 1000 + 10_000)
