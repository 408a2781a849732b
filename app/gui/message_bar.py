"""A dismissible line for errors and notices, in plain words (window, models page, hub).

A message may carry details (an engine crash's last native lines): a "Details" button then
unfolds them under the line, read-only and selectable, without a dialog in the way.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

DETAILS_HEIGHT_PX = 160


class MessageBar(QFrame):
    """Hidden until `show_text`; its text is selectable so people can copy an error."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("messageBar")
        self.label = QLabel(self)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.details_button = QPushButton("Details", self)
        self.details_button.setFlat(True)
        self.details_button.setCheckable(True)
        self.details_button.toggled.connect(self._show_details)
        self.details_button.hide()
        self.details_view = QPlainTextEdit(self)
        self.details_view.setReadOnly(True)
        self.details_view.setAccessibleName("Details")
        self.details_view.setMaximumHeight(DETAILS_HEIGHT_PX)
        self.details_view.hide()
        self.close_button = QPushButton("Dismiss", self)
        self.close_button.setFlat(True)
        self.close_button.clicked.connect(self.hide)
        row = QHBoxLayout()
        row.addWidget(self.label, 1)
        row.addWidget(self.details_button, 0, Qt.AlignmentFlag.AlignTop)
        row.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        column = QVBoxLayout(self)
        column.setContentsMargins(12, 8, 8, 8)
        column.addLayout(row)
        column.addWidget(self.details_view)
        self.hide()

    def show_text(self, text: str, *, error: bool, details: str = "") -> None:
        """Show `text`; with `details`, offer them behind "Details" (still unfolded when the
        same details come again, as when a crash's notice is followed by its restart)."""
        self.setProperty("kind", "error" if error else "info")
        self.style().unpolish(self)
        self.style().polish(self)
        self.label.setText(text)
        if details != self.details:
            self.details_view.setPlainText(details)
            self.details_button.setChecked(False)
        self.details_button.setVisible(bool(details))
        self.show()

    @property
    def text(self) -> str:
        return self.label.text() if not self.isHidden() else ""

    @property
    def details(self) -> str:
        """The details offered with the message shown (empty: none)."""
        return self.details_view.toPlainText() if not self.details_button.isHidden() else ""

    @Slot(bool)
    def _show_details(self, shown: bool) -> None:
        self.details_view.setVisible(shown)
        self.details_button.setText("Hide details" if shown else "Details")
