"""The chat's widgets on their own, offscreen and without a model: the message box's keys,
replies headed by their own model, the ‹ 1/2 › of regenerated replies, a streaming list
under its header, and the dates in the chat list."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from PySide6.QtCore import Qt, QUrl
from pytestqt.qtbot import QtBot

from hearthside.app.gui.chat_pane import INPUT_HINT, ChatPane
from hearthside.app.gui.chat_view import UNKNOWN_MODEL_NAME, ChatView
from hearthside.app.gui.conversation_list import ConversationList, when_text, when_texts
from hearthside.core.engine.config import SamplingParams
from hearthside.core.history.store import Conversation, StoredMessage

pytestmark = [pytest.mark.gui, pytest.mark.beside]

SHIFT = Qt.KeyboardModifier.ShiftModifier
CTRL = Qt.KeyboardModifier.ControlModifier
BERLIN_WINTER = timezone(timedelta(hours=1))
NOW = datetime(2026, 12, 3, 17, 30, tzinfo=BERLIN_WINTER)


def message(id_: int, role: str, content: str, **extra: object) -> StoredMessage:
    return StoredMessage(
        id=id_, conversation_id=1, position=id_, role=role, content=content,  # type: ignore[arg-type]
        created_at="2026-12-03T10:00:00+00:00", complete=True, metrics=None, **extra,  # type: ignore[arg-type]
    )  # fmt: skip


def conversation(id_: int, title: str, updated_at: datetime) -> Conversation:
    return Conversation(
        id_, title, updated_at.isoformat(), updated_at.astimezone(UTC).isoformat(), "",
        SamplingParams(), None,
    )  # fmt: skip


# ---- the message box ------------------------------------------------------------------------


def test_enter_sends_shift_enter_starts_a_line_and_ctrl_enter_sends(qtbot: QtBot) -> None:
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.set_mode("idle")
    sent: list[str] = []
    pane.send_requested.connect(sent.append)
    assert pane.input.placeholderText() == INPUT_HINT and "Shift+Enter" in INPUT_HINT
    qtbot.keyClicks(pane.input, "first line")
    qtbot.keyClick(pane.input, Qt.Key.Key_Return, SHIFT)
    qtbot.keyClicks(pane.input, "second line")
    assert sent == [] and pane.input.toPlainText() == "first line\nsecond line"
    qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    qtbot.keyClick(pane.input, Qt.Key.Key_Enter, CTRL)  # the keypad's Enter, with Ctrl
    assert sent == ["first line\nsecond line"] * 2


def test_a_chat_waiting_for_another_chats_reply_cannot_send_or_stop_it(qtbot: QtBot) -> None:
    pane = ChatPane()
    qtbot.addWidget(pane)
    pane.set_mode("busy")
    sent: list[str] = []
    pane.send_requested.connect(sent.append)
    qtbot.keyClicks(pane.input, "waiting")
    qtbot.keyClick(pane.input, Qt.Key.Key_Return)
    assert sent == [] and pane.input.toPlainText() == "waiting"  # kept for later
    assert pane.send_button.text() == "Send" and not pane.send_button.isEnabled()
    assert "another chat" in pane.send_button.toolTip()


# ---- the conversation view ------------------------------------------------------------------


def test_each_reply_is_headed_by_the_model_that_wrote_it(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_messages([
        message(1, "user", "Hi"),
        message(2, "assistant", "Old answer"),  # saved before models were kept
        message(3, "user", "Again"),
        message(4, "assistant", "Hello", model_name="SmolLM2 135M"),
    ])  # fmt: skip
    view.begin_reply("Gemma 3 270M")
    view.update_reply("Hey")
    lines = [line.removesuffix("  Edit") for line in view.toPlainText().splitlines()]
    assert [line for line in lines if line in ("You", UNKNOWN_MODEL_NAME, "SmolLM2 135M",
                                               "Gemma 3 270M")] == [
        "You", UNKNOWN_MODEL_NAME, "You", "SmolLM2 135M", "Gemma 3 270M",
    ]  # fmt: skip


def test_a_regenerated_reply_offers_its_other_versions(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_messages([
        message(1, "user", "Name a fruit."),
        message(2, "assistant", "Pear.", version=2, version_count=3),
    ])  # fmt: skip
    assert "‹ 2/3 ›" in view.toPlainText()
    html = view.toHtml()
    assert 'href="version:2/1"' in html and 'href="version:2/3"' in html
    with qtbot.waitSignal(view.version_requested) as asked:
        view.anchorClicked.emit(QUrl("version:2/1"))
    assert asked.args == [2, 1]
    with qtbot.assertNotEmitted(view.version_requested):
        view.anchorClicked.emit(QUrl("version:2/x"))


def test_a_streaming_list_leaves_the_header_a_plain_line(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.show_messages([message(1, "user", "List three fruits.")])
    view.begin_reply("SmolLM2 135M")
    text = ""
    for piece in ("- Apple", "\n- Pear", "\n- Plum", "\n\nThat's three."):
        text += piece
        view.update_reply(text)
        header = _block_with_text(view, "SmolLM2 135M")
        assert header.textList() is None, f"the header became a list item after {text!r}"
    assert len([b for b in _blocks(view) if b.textList() is not None]) == 3


def _blocks(view: ChatView) -> list:  # type: ignore[type-arg]
    block, found = view.document().begin(), []
    while block.isValid():
        found.append(block)
        block = block.next()
    return found


def _block_with_text(view: ChatView, text: str):  # type: ignore[no-untyped-def]
    return next(block for block in _blocks(view) if block.text() == text)


# ---- the chat list --------------------------------------------------------------------------


def test_when_a_chat_was_active_reads_like_a_person_would_say_it() -> None:
    assert when_text(NOW.replace(hour=14, minute=2).isoformat(), NOW) == "Today 14:02"
    utc_evening = datetime(2026, 12, 2, 22, 30, tzinfo=UTC)  # 23:30 yesterday here
    assert when_text(utc_evening.isoformat(), NOW) == "Yesterday"
    assert when_text(utc_evening.isoformat(), NOW, detailed=1) == "Yesterday 23:30"
    assert when_text("2026-12-01T09:00:00+01:00", NOW) == "1 Dec"
    assert when_text("2025-12-01T09:00:00+01:00", NOW) == "1 Dec 2025"
    assert when_text("2026-11-03T08:05:00+01:00", NOW, detailed=1) == "3 Nov 2026 08:05"


def test_same_titled_chats_are_told_apart_by_their_time(qtbot: QtBot) -> None:
    chats = [
        conversation(1, "Plan a trip", NOW - timedelta(days=3, hours=2)),
        conversation(2, "Plan a trip", NOW - timedelta(days=3, hours=5)),
        conversation(3, "Other", NOW - timedelta(days=3, hours=5)),
    ]
    assert when_texts(chats, NOW) == ["30 Nov 2026 15:30", "30 Nov 2026 12:30", "30 Nov"]
    same_minute = [
        conversation(4, "New chat", NOW - timedelta(seconds=40)),
        conversation(5, "New chat", NOW - timedelta(seconds=50)),
    ]
    assert when_texts(same_minute, NOW) == ["Today 17:29:20", "Today 17:29:10"]
    shown = ConversationList()
    qtbot.addWidget(shown)
    shown.set_conversations(chats, 1, replying_id=3, now=NOW)
    assert shown.titles() == ["Plan a trip", "Plan a trip", "Other"]
    assert shown.when_shown() == ["30 Nov 2026 15:30", "30 Nov 2026 12:30", "writing a reply…"]
    assert shown.current_id() == 1
