"""The window's own settings (toolbar "Settings…"): how models load, kept in window.ini.

Per-conversation settings (system prompt, sampling) live in chat_settings_dialog.py; these
apply to every model the window loads. Each is read from and written to the window's
QSettings here, so the dialog, the window and the tests agree on the key and on what a
hand-edited value means.

"Parallel requests" is the engine's slots (`EngineConfig.n_parallel`): how many requests —
this window's chat and Local API clients — the model answers at once, each with its own
context. Auto leaves the number to the planner (up to 4 where memory allows,
autotune/planner.py). The KV cache is allocated when a model loads, so a change applies at the
next load.
"""

from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QComboBox, QDialog, QDialogButtonBox, QFormLayout, QLabel, QWidget

from hearthside.app.gui.window_state import PARALLEL_KEY, read_int

MAX_WINDOW_PARALLEL = 8  # the window offers 1..8; `hearthside serve --parallel` goes to 64
AUTO_TEXT = "Auto (the planner's choice)"
APPLIES_NOTE = "Applies the next time a model loads."
PARALLEL_TIP = (
    "How many requests — this window's chat and Local API clients — the model answers at "
    "once. Each has its own context, so the KV cache takes that many times one request's "
    "memory; the others wait their turn. Auto: the planner gives up to 4 where memory allows "
    "and 1 when it is tight, never a shorter context. " + APPLIES_NOTE
)


def read_parallel(settings: QSettings) -> int | None:
    """The stored number of parallel requests; None for Auto (also for a missing or
    hand-edited value out of range)."""
    value = read_int(settings, PARALLEL_KEY)
    return value if value is not None and 1 <= value <= MAX_WINDOW_PARALLEL else None


def write_parallel(settings: QSettings, value: int | None) -> None:
    settings.setValue(PARALLEL_KEY, value or 0)  # 0: Auto


def parallel_text(value: int | None) -> str:
    """The setting in words, for the dialog's list and the window's message."""
    if value is None:
        return "Auto"
    return "1 (one at a time)" if value == 1 else str(value)


class SettingsDialog(QDialog):
    """Edits the window's loading settings; `parallel()` reads the choice."""

    def __init__(self, parallel: int | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self.parallel_box = QComboBox(self)
        self.parallel_box.addItem(AUTO_TEXT, 0)
        for count in range(1, MAX_WINDOW_PARALLEL + 1):
            self.parallel_box.addItem(parallel_text(count), count)
        self.parallel_box.setCurrentIndex(max(0, self.parallel_box.findData(parallel or 0)))
        self.parallel_box.setToolTip(PARALLEL_TIP)
        self.note = QLabel(APPLIES_NOTE, self)
        self.note.setWordWrap(True)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        label = QLabel("&Parallel requests:", self)
        label.setBuddy(self.parallel_box)
        label.setToolTip(PARALLEL_TIP)
        form.addRow(label, self.parallel_box)
        form.addRow("", self.note)
        form.addRow(buttons)

    def parallel(self) -> int | None:
        return int(self.parallel_box.currentData()) or None
