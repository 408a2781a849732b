"""The chat as people expect it from LM Studio, Jan or GPT4All, in the real window (offscreen)
with the two shipped models, registered as a user would: Enter sends, a reply keeps streaming
in its own chat after a switch, regenerate keeps versions, and the picker at the top of the
chat switches models while earlier replies keep their own model's name."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot
from pytestqt.wait_signal import SignalBlocker

from hearthside.app.gui.main_window import MainWindow
from hearthside.core.history.store import ConversationStore, StoredMessage
from hearthside.core.models.store import ModelRecord, ModelStore
from tests.app.gui.window_helpers import open_window, use_settings

pytestmark = [pytest.mark.gui, pytest.mark.slow]

REPLY_TIMEOUT_MS = 60_000
SHIFT = Qt.KeyboardModifier.ShiftModifier
LEFT = Qt.MouseButton.LeftButton
LONG_PROMPT = "Write a very long story about a dragon who learns to bake bread."


@dataclass(frozen=True)
class Models:
    smol: ModelRecord  # SmolLM2 135M, loaded first
    gemma: ModelRecord  # Gemma 3 270M


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat-home")


@pytest.fixture(autouse=True)
def hearthside_home(module_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEARTHSIDE_HOME", str(module_home))
    return module_home


@pytest.fixture(scope="module")
def models(chat_model_file: Path, default_model_file: Path, module_home: Path) -> Models:
    with ModelStore(module_home) as store:
        return Models(
            store.add(chat_model_file, link=True), store.add(default_model_file, link=True)
        )


@pytest.fixture(scope="module")
def window(qapp: QApplication, models: Models, module_home: Path) -> Iterator[MainWindow]:
    with open_window(module_home, models.smol.id, threads=1) as opened:
        yield opened


@pytest.fixture
def chat(window: MainWindow, qtbot: QtBot) -> MainWindow:
    qtbot.waitUntil(lambda: window.session.replying_to is None, timeout=REPLY_TIMEOUT_MS)
    window.show_page(0)
    window.message_bar.hide()
    window.new_chat()
    use_settings(window, max_tokens=16)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5_000)
    return window


@contextmanager
def replied(qtbot: QtBot, window: MainWindow) -> Iterator[SignalBlocker]:
    with qtbot.waitSignal(window.bridge.reply_finished, timeout=REPLY_TIMEOUT_MS) as finished:
        yield finished
    qtbot.waitUntil(lambda: window.session.replying_to is None, timeout=10_000)


def messages(window: MainWindow, conversation_id: int | None = None) -> list[StoredMessage]:
    chosen = conversation_id if conversation_id is not None else window.session.current_id
    assert chosen is not None
    return window.store.messages(chosen)


def send(qtbot: QtBot, window: MainWindow, text: str) -> None:
    window.chat_pane.input.setPlainText(text)
    qtbot.keyClick(window.chat_pane.input, Qt.Key.Key_Return)


def select_chat(window: MainWindow, conversation_id: int) -> None:
    """Click a chat in the list, as the user does."""
    chats = window.conversation_list
    chats.list.setCurrentRow(chats.ids().index(conversation_id))


def test_enter_sends_and_shift_enter_starts_a_new_line(chat: MainWindow, qtbot: QtBot) -> None:
    box = chat.chat_pane.input
    qtbot.keyClicks(box, "Name a colour.")
    qtbot.keyClick(box, Qt.Key.Key_Return, SHIFT)
    qtbot.keyClicks(box, "Just one word.")
    assert messages(chat) == [] and chat.session.mode == "idle"
    with replied(qtbot, chat) as finished:
        qtbot.keyClick(box, Qt.Key.Key_Return)
        assert box.toPlainText() == ""
    stored = messages(chat)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "Name a colour.\nJust one word."),
        ("assistant", finished.args[0].text),
    ]
    assert stored[1].model_id == chat.bridge.loaded_model.model_id  # type: ignore[union-attr]


def test_a_reply_keeps_streaming_in_its_own_chat_after_a_switch(
    chat: MainWindow, qtbot: QtBot
) -> None:
    other = chat.store.create(title="Somewhere else")
    chat.store.add_message(other.id, "user", "An older question")
    writing = chat.session.current_id
    assert writing is not None
    use_settings(chat, max_tokens=48)
    with replied(qtbot, chat) as finished:
        send(qtbot, chat, LONG_PROMPT)
        qtbot.waitUntil(lambda: bool(chat.session.reply_text), timeout=REPLY_TIMEOUT_MS)
        chat.refresh_conversations()
        select_chat(chat, other.id)
        assert chat.session.current_id == other.id
        assert chat.session.mode == "busy" and not chat.chat_pane.send_button.isEnabled()
        assert "An older question" in chat.chat_pane.view.toPlainText()
        chats = chat.conversation_list
        listed = dict(zip(chats.ids(), chats.when_shown(), strict=True))
        assert listed[writing] == "writing a reply…"
        qtbot.keyClick(chat.chat_pane.input, Qt.Key.Key_Escape)  # Esc here stops nothing
    result = finished.args[0]
    assert result.metrics.stop_reason != "cancelled"
    assert "dragon" not in chat.chat_pane.view.toPlainText()  # it never landed here
    assert [m.role for m in messages(chat, other.id)] == ["user"]
    reply = messages(chat, writing)[-1]
    assert (reply.content, reply.complete) == (result.text, True)
    select_chat(chat, writing)
    assert result.text.split()[0] in chat.chat_pane.view.toPlainText()
    assert chat.session.mode == "idle"


def test_stop_belongs_to_the_chat_whose_reply_streams(chat: MainWindow, qtbot: QtBot) -> None:
    writing = chat.session.current_id
    assert writing is not None
    use_settings(chat, max_tokens=400)
    send(qtbot, chat, LONG_PROMPT)
    qtbot.waitUntil(lambda: bool(chat.session.reply_text), timeout=REPLY_TIMEOUT_MS)
    chat.new_chat()  # a new, empty chat while the reply streams
    assert chat.session.current_id != writing and chat.session.mode == "busy"
    with replied(qtbot, chat) as finished:
        chat.refresh_conversations()
        select_chat(chat, writing)  # back again: still streaming, with what it wrote so far
        assert chat.session.mode == "generating"
        assert chat.chat_pane.send_button.text() == "Stop"
        assert chat.chat_pane.view.streaming
        qtbot.mouseClick(chat.chat_pane.send_button, LEFT)
    assert finished.args[0].metrics.stop_reason == "cancelled"
    assert messages(chat)[-1].stopped


def test_regenerate_keeps_both_versions_across_a_restart(chat: MainWindow, qtbot: QtBot) -> None:
    with replied(qtbot, chat) as first:
        send(qtbot, chat, "Name a fruit.")
    use_settings(chat, max_tokens=16, temperature=0.9, seed=1234)
    with replied(qtbot, chat) as second:
        qtbot.mouseClick(chat.chat_pane.regenerate_button, LEFT)
    reply = messages(chat)[-1]
    assert (reply.content, reply.version, reply.version_count) == (second.args[0].text, 2, 2)
    view = chat.chat_pane.view
    assert "‹ 2/2 ›" in view.toPlainText()
    view.anchorClicked.emit(QUrl(f"version:{reply.id}/1"))  # the ‹ under the reply
    assert "‹ 1/2 ›" in view.toPlainText()
    with ConversationStore(chat.root) as reopened:  # what the next start reads
        kept = reopened.message(reply.id)
    assert (kept.content, kept.version, kept.version_count) == (first.args[0].text, 1, 2)
    assert [m.role for m in messages(chat)] == ["user", "assistant"]


def test_the_picker_switches_models_and_earlier_replies_keep_their_name(
    chat: MainWindow, qtbot: QtBot, models: Models
) -> None:
    picker = chat.chat_pane.model_picker
    with replied(qtbot, chat):
        send(qtbot, chat, "Say hello.")
    qtbot.waitUntil(lambda: not chat.model_picker.planning and len(picker.entries) == 2,
                    timeout=REPLY_TIMEOUT_MS)  # fmt: skip
    shown = [picker.box.itemText(i) for i in range(picker.box.count())]
    print("picker:", shown)
    assert all(e.verdict and ("tok/s" in e.verdict or "fit" in e.verdict) for e in picker.entries)
    assert any(text.startswith(f"{models.gemma.name} · ") for text in shown), shown
    assert picker.box.currentData() == models.smol.id
    try:
        with qtbot.waitSignal(chat.bridge.load_finished, timeout=REPLY_TIMEOUT_MS) as loaded:
            assert picker.choose(models.gemma.id)
            assert picker.progress.isVisibleTo(chat) and not picker.box.isEnabled()
        assert loaded.args[0].model_id == models.gemma.id
        qtbot.waitUntil(lambda: chat.session.mode == "idle", timeout=10_000)
        assert picker.box.currentData() == models.gemma.id and not picker.progress.isVisibleTo(chat)
        with replied(qtbot, chat):
            send(qtbot, chat, "Say goodbye.")
        names = [m.model_name for m in messages(chat) if m.role == "assistant"]
        assert names == [models.smol.name, models.gemma.name]
        headers = [line for line in chat.chat_pane.view.toPlainText().splitlines()
                   if line in (models.smol.name, models.gemma.name)]  # fmt: skip
        assert headers == names
    finally:
        with qtbot.waitSignal(chat.bridge.load_finished, timeout=REPLY_TIMEOUT_MS):
            chat.load_model(models.smol.id)
