"""A dismissible line for errors and notices, in plain words (window, models page, hub)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget


class MessageBar(QFrame):
    """Hidden until `show_text`; its text is selectable so people can copy an error."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageBar")
        self.label = QLabel(self)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.close_button = QPushButton("Dismiss", self)
        self.close_button.setFlat(True)
        self.close_button.clicked.connect(self.hide)
        row = QHBoxLayout(self)
        row.setContentsMargins(12, 8, 8, 8)
        row.addWidget(self.label, 1)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_text(self, text: str, *, error: bool) -> None:
        self.setProperty("kind", "error" if error else "info")
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        self.show()

    @property
    def text(self) -> str:
        return self.label.text() if not self.isHidden() else ""
