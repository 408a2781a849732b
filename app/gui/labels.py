"""The selectable, wrapping label every page builds its text from."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel


def make_label(text: str = "", name: str | None = None, *, wrap: bool = True) -> QLabel:
    """A label people can select and copy from; `name` is its style-sheet object name."""
    label = QLabel(text)
    label.setWordWrap(wrap)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    if name:
        label.setObjectName(name)
    return label


def plain_tooltip(text: str) -> str:
    """`text` for setToolTip, shown as written: Qt renders a tooltip that looks like HTML as
    rich text, and a model's name or path may hold markup (`<img src=…>`)."""
    escaped = html.escape(text).replace("\n", "<br>")
    return f"<p style='white-space:pre-wrap'>{escaped}</p>"
