"""The per-conversation settings: system prompt, temperature, top_p, reply length and seed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QPlainTextEdit,
    QSpinBox,
    QWidget,
)

from hearthside.core.engine.config import SamplingParams

MAX_REPLY_TOKENS = 32768
MAX_SEED = 2**31 - 1


@dataclass(frozen=True)
class ChatSettings:
    system_prompt: str
    sampling: SamplingParams


class ChatSettingsDialog(QDialog):
    """Edits one conversation's ChatSettings; `settings()` reads the result."""

    def __init__(self, settings: ChatSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self._sampling = settings.sampling
        self.system_prompt = QPlainTextEdit(settings.system_prompt, self)
        self.system_prompt.setPlaceholderText("e.g. You are a concise assistant.")
        self.system_prompt.setTabChangesFocus(True)
        self.temperature = _spin(0.0, 2.0, 0.05, settings.sampling.temperature)
        self.temperature.setToolTip("0 always picks the likeliest word; higher is more varied.")
        self.top_p = _spin(0.01, 1.0, 0.01, settings.sampling.top_p)
        self.max_tokens, self.limit_length = _optional_int(
            1, MAX_REPLY_TOKENS, settings.sampling.max_tokens, 512
        )
        self.seed, self.fixed_seed = _optional_int(0, MAX_SEED, settings.sampling.seed, 42)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form = QFormLayout(self)
        form.addRow("System prompt:", self.system_prompt)
        form.addRow("Temperature:", self.temperature)
        form.addRow("Top p:", self.top_p)
        form.addRow("Longest reply:", _pair(self.limit_length, self.max_tokens))
        form.addRow("Seed:", _pair(self.fixed_seed, self.seed))
        form.addRow(buttons)

    def settings(self) -> ChatSettings:
        sampling = dataclasses.replace(
            self._sampling,
            temperature=round(self.temperature.value(), 4),
            top_p=round(self.top_p.value(), 4),
            max_tokens=self.max_tokens.value() if self.limit_length.isChecked() else None,
            seed=self.seed.value() if self.fixed_seed.isChecked() else None,
        )
        return ChatSettings(self.system_prompt.toPlainText().strip(), sampling)


def _spin(low: float, high: float, step: float, value: float) -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setDecimals(2)
    spin.setValue(value)
    return spin


def _optional_int(
    low: int, high: int, value: int | None, fallback: int
) -> tuple[QSpinBox, QCheckBox]:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value if value is not None else fallback)
    check = QCheckBox("limit" if high == MAX_REPLY_TOKENS else "fixed")
    check.setChecked(value is not None)
    spin.setEnabled(value is not None)
    check.toggled.connect(spin.setEnabled)
    return spin, check


def _pair(check: QCheckBox, spin: QSpinBox) -> QWidget:
    holder = QWidget()
    row = QHBoxLayout(holder)
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(check)
    row.addWidget(spin, 1)
    return holder
