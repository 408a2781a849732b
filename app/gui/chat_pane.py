"""`ChatPane`: the model picker, the conversation view, and the message box with its buttons.

Enter sends and Shift+Enter starts a new line, as in every chat app (Ctrl+Enter sends too).
The pane's mode is the open chat's: "busy" means a reply is being written in another chat —
its Stop lives there; this chat can be read and typed in, and sends once that reply is done.
"""

from __future__ import annotations

from typing import Literal

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QKeyEvent, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.chat_view import ChatView
from hearthside.app.gui.icons import icon
from hearthside.app.gui.model_picker import ModelPicker

PaneMode = Literal["idle", "generating", "busy", "unavailable"]
INPUT_HINT = "Message the model — Enter sends, Shift+Enter starts a new line"
BUSY_TOOLTIP = "A reply is being written in another chat: wait for it, or stop it there"
_SUBMIT_KEYS = (Qt.Key.Key_Return, Qt.Key.Key_Enter)


class MessageInput(QPlainTextEdit):
    """A multi-line message box: Enter (or Ctrl+Enter) sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText(INPUT_HINT)
        self.setAccessibleName("Message")
        self.setAccessibleDescription(INPUT_HINT)
        self.setTabChangesFocus(True)

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 (Qt's name)
        shift = event.modifiers() & Qt.KeyboardModifier.ShiftModifier
        if event.key() in _SUBMIT_KEYS and not shift:
            self.submitted.emit()
            return
        if event.key() in _SUBMIT_KEYS:  # Shift+Enter: a plain new line, not a line separator
            self.textCursor().insertText("\n")
            self.ensureCursorVisible()
            return
        super().keyPressEvent(event)


class ChatPane(QWidget):
    send_requested = Signal(str)
    stop_requested = Signal()
    regenerate_requested = Signal()
    settings_requested = Signal()
    edit_cancelled = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model_picker = ModelPicker(self)
        self.view = ChatView(self)
        self.input = MessageInput(self)
        self.input.submitted.connect(self.submit)
        self.editing_label = QLabel(self)
        self.editing_label.hide()
        self.cancel_edit_button = QPushButton("Cancel edit", self)
        self.cancel_edit_button.hide()
        self.cancel_edit_button.clicked.connect(self.edit_cancelled)
        self.send_button = QPushButton("Send", self)
        self.send_button.setDefault(False)
        self.send_button.clicked.connect(self._on_send_button)
        self.regenerate_button = QPushButton("Regenerate", self)
        self.regenerate_button.setToolTip("Write the last reply again")
        self.regenerate_button.clicked.connect(self.regenerate_requested)
        self.settings_button = QPushButton("Chat settings…", self)
        self.settings_button.setToolTip("System prompt, temperature, reply length and seed")
        self.settings_button.clicked.connect(self.settings_requested)
        self.mode: PaneMode = "unavailable"
        self._layout()
        self.set_mode("unavailable")

    def _layout(self) -> None:
        buttons = QHBoxLayout()
        buttons.addWidget(self.editing_label, 1)
        buttons.addWidget(self.cancel_edit_button)
        buttons.addStretch(0)
        buttons.addWidget(self.settings_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addWidget(self.send_button)
        composer = QWidget(self)
        column = QVBoxLayout(composer)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.input, 1)
        column.addLayout(buttons)
        self.splitter = QSplitter(Qt.Orientation.Vertical, self)
        self.splitter.addWidget(self.view)
        self.splitter.addWidget(composer)
        self.splitter.setStretchFactor(0, 4)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setSizes([640, 110])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        layout.addWidget(self.model_picker)
        layout.addWidget(self.splitter)
        self.setTabOrder(self.input, self.send_button)
        self.setTabOrder(self.send_button, self.regenerate_button)
        self.setTabOrder(self.regenerate_button, self.settings_button)
        self.setTabOrder(self.settings_button, self.view)

    def set_icon_color(self, color: str) -> None:
        self._icon_color = color
        self.regenerate_button.setIcon(icon("regenerate", color))
        self.settings_button.setIcon(icon("settings", color))
        self._refresh_send_button()

    # ---- state -------------------------------------------------------------------------

    def set_mode(self, mode: PaneMode) -> None:
        """idle: ready to send; generating: this chat's reply streams; busy: another chat's
        does; unavailable: no model yet."""
        self.mode = mode
        self.regenerate_button.setEnabled(mode == "idle")
        self._refresh_send_button()

    def _refresh_send_button(self) -> None:
        generating = self.mode == "generating"
        self.send_button.setText("Stop" if generating else "Send")
        tooltip = "Stop the reply (Esc)" if generating else "Send (Enter)"
        self.send_button.setToolTip(BUSY_TOOLTIP if self.mode == "busy" else tooltip)
        self.send_button.setEnabled(self.mode in ("idle", "generating"))
        color = getattr(self, "_icon_color", None)
        if color is not None:
            self.send_button.setIcon(icon("stop" if generating else "send", color))

    def begin_edit(self, text: str) -> None:
        self.input.setPlainText(text)
        self.editing_label.setText("Editing a message: sending replaces it and what followed.")
        self.editing_label.show()
        self.cancel_edit_button.show()
        self.input.setFocus()
        self.input.moveCursor(QTextCursor.MoveOperation.End)

    def end_edit(self) -> None:
        self.editing_label.hide()
        self.cancel_edit_button.hide()

    # ---- actions -----------------------------------------------------------------------

    @Slot()
    def submit(self) -> None:
        if self.mode != "idle":
            return
        text = self.input.toPlainText().strip()
        if text:
            self.send_requested.emit(text)

    @Slot()
    def _on_send_button(self) -> None:
        if self.mode == "generating":
            self.stop_requested.emit()
        else:
            self.submit()
