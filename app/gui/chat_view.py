"""`ChatView`: a conversation rendered as rich text, with one reply streaming at its end.

Finished messages are rendered once. The streaming reply occupies the tail of the document,
from a remembered position to the end; each flush re-renders only that tail (its Markdown can
change shape as text arrives: a fence opens, a table grows), never the whole conversation.
Each reply is headed by the model that wrote it (stored with it); a reply saved before
Hearthside kept that is headed "Assistant" — no name rather than a wrong one.
Anchors: `copy:<n>` copies code block n, `edit:<id>` asks to edit user message `id`,
`version:<id>/<k>` asks to show version k of reply `id` (the ‹ 1/2 › under a regenerated
reply); links to the web open in the browser; nothing else is followed.
The line under a finished reply names its speed and, once the loaded model's limit on this
machine is known (`set_speed_limit`, autotune/speed_limit.py), the share of that limit it
reached, with a tooltip that explains the limit and, for a slow reply, the likely cause.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QUrl, Signal, Slot
from PySide6.QtGui import (
    QDesktopServices,
    QGuiApplication,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
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
    from hearthside.autotune.speed_limit import SpeedLimit, SpeedOfLight
    from hearthside.autotune.speed_meter import SpeedMeter
    from hearthside.core.engine.metrics import GenerationMetrics, SpeculationStats

EDIT_SCHEME = "edit"
VERSION_SCHEME = "version"
USER_NAME = "You"
UNKNOWN_MODEL_NAME = "Assistant"  # a reply saved before the model was kept with it
EMPTY_CHAT_HTML = (
    '<p align="center" style="margin-top:48px"><big>Ask anything.</big></p>'
    '<p align="center">Enter sends · Shift+Enter starts a new line · Esc stops · '
    "Ctrl+N starts a new chat</p>"
)


def describe_metrics(metrics: GenerationMetrics, speed: SpeedOfLight | None = None) -> str:
    """`71 tok/s · 81% of this machine's limit · first token 0.18 s · 42 tokens`, for under a
    reply and the status line (the share only with `speed`)."""
    parts = []
    if metrics.decode_tok_s:
        parts.append(f"{metrics.decode_tok_s:.0f} tok/s")
        if speed is not None:
            parts.append(speed.summary)
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


def reply_note(
    metrics: GenerationMetrics | None, *, complete: bool, speed: SpeedOfLight | None = None
) -> str | None:
    """The small line under a reply: its speed (and with `speed`, its share of this machine's
    limit), whether it was stopped or cut off."""
    if not complete:
        return "interrupted: Hearthside closed while this reply was written"
    if metrics is None:
        return None
    note = describe_metrics(metrics, speed)
    return f"stopped · {note}" if metrics.stop_reason == "cancelled" else note


def author_name(message: StoredMessage) -> str:
    """The name over a message: "You", the model that wrote the reply, or "System"."""
    if message.role == "user":
        return USER_NAME
    if message.role == "system":
        return "System"
    return message.model_name or UNKNOWN_MODEL_NAME


class ChatView(QTextBrowser):
    """Read-only view of one conversation."""

    edit_requested = Signal(int)  # the id of the user message to edit
    code_copied = Signal(int)  # the index of the code block copied
    version_requested = Signal(int, int)  # a reply's id, and which of its versions to show

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.setAccessibleName("Conversation")
        self.anchorClicked.connect(self._on_anchor)
        self._renderer = MarkdownRenderer(LIGHT_CODE_THEME)
        self._reply_name = UNKNOWN_MODEL_NAME  # the model writing the streaming reply
        self._reply_version = ""  # "2/2" while a regenerated reply streams
        self._code_blocks: list[str] = []
        self._reply_start: int | None = None
        self._reply_code_base = 0
        self._reply_text = ""
        self._reply_tooltip = ""  # the finished reply's note's tooltip (its speed's share)
        self._speed_meter: SpeedMeter | None = None
        self._empty_state = False
        self.show_messages([])

    # ---- settings ----------------------------------------------------------------------

    def set_dark(self, dark: bool) -> None:
        """Code colours for a dark or light window (takes effect at the next render)."""
        self._renderer = MarkdownRenderer(DARK_CODE_THEME if dark else LIGHT_CODE_THEME)

    def set_speed_limit(self, limit: SpeedLimit | None) -> None:
        """The loaded model's limit on this machine (None: no model, or none known): the
        next replies' notes say what share of it they reached."""
        if limit is None:
            self._speed_meter = None
            return
        from hearthside.autotune.speed_meter import SpeedMeter

        self._speed_meter = SpeedMeter()
        self._speed_meter.set_limit(limit)

    @property
    def speed_limit(self) -> SpeedLimit | None:
        return self._speed_meter.limit if self._speed_meter is not None else None

    def metered_note(self, metrics: GenerationMetrics) -> str | None:
        """The note for the reply finishing now, with its share of the limit when one is
        known; its tooltip explains the limit (and the cause, for a slow reply)."""
        meter = self._speed_meter
        speed = meter.measure(metrics) if meter is not None else None
        self._reply_tooltip = speed.tooltip() if speed is not None else ""
        return reply_note(metrics, complete=True, speed=speed)

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

    def begin_reply(self, model_name: str | None, version: tuple[int, int] = (1, 1)) -> None:
        """Start showing a reply written by `model_name` (its `version` of how many)."""
        if self._empty_state:
            self.document().clear()
            self._empty_state = False
        self._reply_name = model_name or UNKNOWN_MODEL_NAME
        shown, count = version
        self._reply_version = f"{shown}/{count}" if count > 1 else ""
        cursor = self._end_cursor()
        if not self.document().isEmpty():
            cursor.insertBlock()
        self._reply_start = cursor.position()
        self._reply_code_base = len(self._code_blocks)
        self._reply_text = ""
        self._reply_tooltip = ""
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
        _reset_block(cursor)
        body = self._header_html(self._reply_name, None) + rendered.html
        if self._reply_version:
            note = " · ".join(part for part in (self._reply_version, note) if part)
        cursor.insertHtml(body + (self._note_html(note, self._reply_tooltip) if note else ""))
        if follow:
            self.scroll_to_end()

    def _message_html(self, message: StoredMessage) -> str:
        if message.role == "user":
            text = html.escape(message.content).replace("\n", "<br>")
            return self._header_html(USER_NAME, message.id) + f"<p>{text}</p>"
        rendered = self._renderer.render(message.content, len(self._code_blocks))
        self._code_blocks.extend(rendered.code_blocks)
        note = self._note_html(reply_note(message.metrics, complete=message.complete))
        if message.version_count > 1:
            note = self._versions_html(message) + note
        return self._header_html(author_name(message), None) + rendered.html + note

    def _header_html(self, name: str, editable_id: int | None) -> str:
        edit = f'&nbsp;&nbsp;<a href="{EDIT_SCHEME}:{editable_id}">Edit</a>' if editable_id else ""
        return f'<p style="margin-top:14px"><b>{html.escape(name)}</b>{edit}</p>'

    def _versions_html(self, message: StoredMessage) -> str:
        """‹ 1/2 ›: which version of a regenerated reply this is, with links to the others."""
        shown, count = message.version, message.version_count

        def arrow(symbol: str, target: int) -> str:
            if not 1 <= target <= count:
                return f"<span>{symbol}</span>"
            return f'<a href="{VERSION_SCHEME}:{message.id}/{target}">{symbol}</a>'

        return (
            f"<p>{arrow('‹', shown - 1)}&nbsp;{shown}/{count}&nbsp;{arrow('›', shown + 1)}"
            "&nbsp;&nbsp;<small>versions of this reply</small></p>"
        )

    def _note_html(self, note: str | None, tooltip: str = "") -> str:
        if not note:
            return ""
        colour = self.palette().placeholderText().color().name()
        text = html.escape(note)
        if tooltip:  # Qt shows a span's title as the tooltip over it
            text = f'<span title="{html.escape(tooltip)}">{text}</span>'
        return f'<p style="color:{colour}"><small>{text}</small></p>'

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
        elif scheme == VERSION_SCHEME:
            message_id, _, version = target.partition("/")
            if message_id.isdigit() and version.isdigit():
                self.version_requested.emit(int(message_id), int(version))
        elif is_safe_link(url.toString()):
            QDesktopServices.openUrl(url)


def _reset_block(cursor: QTextCursor) -> None:
    """Make the block under `cursor` a plain paragraph. Removing the old reply leaves the
    block with the format of its *last* block — a list item once the reply had a list — and
    the header inserted next would be drawn as a bullet."""
    block_list = cursor.currentList()
    if block_list is not None:
        block_list.remove(cursor.block())
    cursor.setBlockFormat(QTextBlockFormat())
    cursor.setCharFormat(QTextCharFormat())
