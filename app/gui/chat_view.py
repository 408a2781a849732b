"""`ChatView`: a conversation rendered as rich text, with one reply streaming at its end.

Finished messages are rendered once. The streaming reply occupies the tail of the document,
from a remembered position to the end; each flush re-renders only that tail (its Markdown can
change shape as text arrives: a fence opens, a table grows), never the whole conversation.
Anchors: `copy:<n>` copies code block n, `edit:<id>` asks to edit user message `id`; links
to the web open in the browser; nothing else is followed.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import QDesktopServices, QGuiApplication, QTextCursor
from PySide6.QtWidgets import QTextBrowser, QWidget

from hearthside.app.gui.markdown import (
    COPY_SCHEME,
    DARK_CODE_THEME,
    LIGHT_CODE_THEME,
    MarkdownRenderer,
    is_safe_link,
)
from hearthside.core.history.store import StoredMessage

if TYPE_CHECKING:  # the engine module pulls in llama.cpp: not before the window shows
    from hearthside.core.engine.metrics import GenerationMetrics, SpeculationStats

EDIT_SCHEME = "edit"
USER_NAME = "You"
EMPTY_CHAT_HTML = (
    '<p align="center" style="margin-top:48px"><big>Ask anything.</big></p>'
    '<p align="center">Ctrl+Enter sends · Esc stops · Ctrl+N starts a new chat</p>'
)


def describe_metrics(metrics: GenerationMetrics) -> str:
    """`71 tok/s · first token 0.18 s · 42 tokens`, for under a reply and the status line."""
    parts = []
    if metrics.decode_tok_s:
        parts.append(f"{metrics.decode_tok_s:.0f} tok/s")
    if metrics.ttft_s is not None:
        parts.append(f"first token {metrics.ttft_s:.2f} s")
    parts.append(f"{metrics.completion_tokens} tokens")
    if metrics.speculative is not None and metrics.speculative.drafted:
        parts.append(drafts_text(metrics.speculative))
    return " · ".join(parts)


def drafts_text(stats: SpeculationStats) -> str:
    """`drafts 62% accepted (2.4 a step)`: what speculative decoding's drafts did."""
    per_step = f" ({stats.mean_accepted_length:.1f} a step)" if stats.mean_accepted_length else ""
    return f"drafts {stats.acceptance_rate or 0:.0%} accepted{per_step}"


def reply_note(metrics: GenerationMetrics | None, *, complete: bool) -> str | None:
    """The small line under a reply: its speed, whether it was stopped or cut off."""
    if not complete:
        return "interrupted: Hearthside closed while this reply was written"
    if metrics is None:
        return None
    note = describe_metrics(metrics)
    return f"stopped · {note}" if metrics.stop_reason == "cancelled" else note


class ChatView(QTextBrowser):
    """Read-only view of one conversation."""

    edit_requested = Signal(int)  # the id of the user message to edit
    code_copied = Signal(int)  # the index of the code block copied

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setAccessibleName("Conversation")
        self.anchorClicked.connect(self._on_anchor)
        self._renderer = MarkdownRenderer(LIGHT_CODE_THEME)
        self._assistant_name = "Assistant"
        self._code_blocks: list[str] = []
        self._reply_start: int | None = None
        self._reply_code_base = 0
        self._reply_text = ""
        self._empty_state = False
        self.show_messages([])

    # ---- settings ----------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        """Code colours for a dark or light window (takes effect at the next render)."""
        self._renderer = MarkdownRenderer(DARK_CODE_THEME if dark else LIGHT_CODE_THEME)

    def set_assistant_name(self, name: str) -> None:
        self._assistant_name = name

    # ---- whole conversations -----------------------------------------------------------

    def show_messages(self, messages: Sequence[StoredMessage]) -> None:
        self._code_blocks = []
        self._reply_start = None
        self._empty_state = not messages
        if not messages:
            self.setHtml(EMPTY_CHAT_HTML)
            return
        self.setHtml("".join(self._message_html(message) for message in messages))
        self.scroll_to_end()

    def append_message(self, message: StoredMessage) -> None:
        """Add a finished message at the end (the user's, just sent)."""
        if self._empty_state:
            self.document().clear()
            self._empty_state = False
        self._insert_at_end(self._message_html(message))
        self.scroll_to_end()

    # ---- the streaming reply -----------------------------------------------------------

    def begin_reply(self) -> None:
        cursor = self._end_cursor()
        if not self.document().isEmpty():
            cursor.insertBlock()
        self._reply_start = cursor.position()
        self._reply_code_base = len(self._code_blocks)
        self._reply_text = ""
        self._render_reply("", note="writing…")

    def update_reply(self, text: str) -> None:
        """Show `text` as the reply so far (the whole reply, not the newest piece)."""
        if self._reply_start is None:
            return
        self._reply_text = text
        self._render_reply(text, note=None)

    def finish_reply(self, text: str, note: str | None) -> None:
        if self._reply_start is None:
            return
        self._reply_text = text
        self._render_reply(text, note=note)
        self._reply_start = None

    def discard_reply(self) -> None:
        """Take the reply away again (it failed before any text arrived)."""
        if self._reply_start is None:
            return
        cursor = self._end_cursor()
        cursor.setPosition(self._reply_start, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        del self._code_blocks[self._reply_code_base :]
        self._reply_start = None

    @property
    def streaming(self) -> bool:
        return self._reply_start is not None

    # ---- code blocks -------------------------------------------------------------------

    @property
    def code_block_count(self) -> int:
        return len(self._code_blocks)

    def code_block(self, index: int) -> str:
        return self._code_blocks[index]

    def copy_code_block(self, index: int) -> None:
        QGuiApplication.clipboard().setText(self._code_blocks[index])
        self.code_copied.emit(index)

    def scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    # ---- rendering ---------------------------------------------------------------------

    def _render_reply(self, text: str, note: str | None) -> None:
        assert self._reply_start is not None
        follow = self._at_bottom()
        rendered = self._renderer.render(text, self._reply_code_base)
        del self._code_blocks[self._reply_code_base :]
        self._code_blocks.extend(rendered.code_blocks)
        cursor = self._end_cursor()
        cursor.setPosition(self._reply_start, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        body = self._header_html(self._assistant_name, None) + rendered.html
        cursor.insertHtml(body + (self._note_html(note) if note else ""))
        if follow:
            self.scroll_to_end()

    def _message_html(self, message: StoredMessage) -> str:
        if message.role == "user":
            text = html.escape(message.content).replace("\n", "<br>")
            return self._header_html(USER_NAME, message.id) + f"<p>{text}</p>"
        rendered = self._renderer.render(message.content, len(self._code_blocks))
        self._code_blocks.extend(rendered.code_blocks)
        note = reply_note(message.metrics, complete=message.complete)
        name = self._assistant_name if message.role == "assistant" else "System"
        return self._header_html(name, None) + rendered.html + (self._note_html(note) or "")

    def _header_html(self, name: str, editable_id: int | None) -> str:
        edit = f'&nbsp;&nbsp;<a href="{EDIT_SCHEME}:{editable_id}">Edit</a>' if editable_id else ""
        return f'<p style="margin-top:14px"><b>{html.escape(name)}</b>{edit}</p>'

    def _note_html(self, note: str | None) -> str:
        if not note:
            return ""
        colour = self.palette().placeholderText().color().name()
        return f'<p style="color:{colour}"><small>{html.escape(note)}</small></p>'

    def _insert_at_end(self, fragment: str) -> None:
        cursor = self._end_cursor()
        if not self.document().isEmpty():
            cursor.insertBlock()
        cursor.insertHtml(fragment)

    def _end_cursor(self) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        return cursor

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum() - 4

    @Slot(QUrl)
    def _on_anchor(self, url: QUrl) -> None:
        scheme, target = url.scheme(), url.path()
        if scheme == COPY_SCHEME and target.isdigit() and int(target) < len(self._code_blocks):
            self.copy_code_block(int(target))
        elif scheme == EDIT_SCHEME and target.isdigit():
            self.edit_requested.emit(int(target))
        elif is_safe_link(url.toString()):
            QDesktopServices.openUrl(url)
