"""The Plan page's recipe view: how to serve a model on what-if hardware with several GPUs or
nodes, as vLLM or llama-server command lines.

It shows a `RecipeOutcome` (plan_content.py): an engine toggle, the verdict, the commands in
read-only monospace boxes with a Copy button each (for several nodes: what to run on every
node, on the head and on the workers), a field for the checkpoint when the plan only has a
placeholder for it, the advice in place of the commands when the model does not fit, one
memory bar per GPU and the reason for every setting. It plans nothing itself: the page does,
off the GUI thread, when `engine_changed` or `checkpoint_chosen` asks it to.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QButtonGroup,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.labels import make_label
from hearthside.app.gui.memory_bar import DeviceMemoryView, ServingGpuView
from hearthside.app.gui.plan_content import (
    ENGINE_NAMES,
    CommandBlock,
    Engine,
    RecipeOutcome,
    reason_name,
    recipe_verdict,
)

COPIED_FOR_MS = 1500
BAR_COLUMNS = 2  # GPUs side by side: eight of them stay on one screen
BOX_PADDING_PX = 16  # the frame and the document's margins
TOO_MANY_FOR_A_COLUMN = 2


# ---- small widgets shared with the plan page ------------------------------------------------


def make_card(title: str) -> tuple[QFrame, QVBoxLayout]:
    card = QFrame()
    card.setObjectName("card")
    layout = QVBoxLayout(card)
    layout.setContentsMargins(16, 12, 16, 14)
    layout.setSpacing(8)
    layout.addWidget(make_label(title, "cardTitle"))
    return card, layout


def clear_layout(layout: QLayout) -> None:
    while layout.count():
        item = layout.takeAt(0)
        if item is None:
            break
        widget, inner = item.widget(), item.layout()
        if widget is not None:
            widget.deleteLater()
        elif inner is not None:
            clear_layout(inner)


def repolish(widget: QWidget) -> None:
    widget.style().unpolish(widget)
    widget.style().polish(widget)


# ---- one command block ------------------------------------------------------------------------


class CommandBox(QWidget):
    """A titled, read-only monospace box with a Copy button."""

    def __init__(self, block: CommandBlock, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.block = block
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(4)
        heading = QHBoxLayout()
        heading.addWidget(make_label(block.title, "settingName"), 1)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy these commands to the clipboard")
        self.copy_button.clicked.connect(self.copy)
        heading.addWidget(self.copy_button)
        column.addLayout(heading)
        self.text_box = QPlainTextEdit(block.text)
        self.text_box.setObjectName("command")
        self.text_box.setReadOnly(True)
        self.text_box.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text_box.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.text_box.setAccessibleName(block.title)
        lines = block.text.count("\n") + 1
        line_px = self.text_box.fontMetrics().lineSpacing()
        self.text_box.setFixedHeight(lines * line_px + BOX_PADDING_PX)
        column.addWidget(self.text_box)
        self._reset_timer = QTimer(self)
        self._reset_timer.setSingleShot(True)
        self._reset_timer.setInterval(COPIED_FOR_MS)
        self._reset_timer.timeout.connect(lambda: self.copy_button.setText("Copy"))

    def copy(self) -> None:
        clipboard = QGuiApplication.clipboard()
        clipboard.setText(self.block.text)
        self.copy_button.setText("Copied")
        self._reset_timer.start()


# ---- the view ---------------------------------------------------------------------------------


class RecipeView(QWidget):
    engine_changed = Signal(str)  # "vllm" | "llama-server"
    checkpoint_chosen = Signal(str)  # a Hugging Face repo; "" for the planned one

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.outcome: RecipeOutcome | None = None
        self.command_boxes: list[CommandBox] = []
        self.memory_views: list[DeviceMemoryView] = []
        self.reason_labels: dict[str, tuple[QLabel, QLabel]] = {}
        self.advice_labels: list[QLabel] = []
        self._build()

    # -- inputs --

    @property
    def engine(self) -> Engine:
        return "llama-server" if self.engine_buttons["llama-server"].isChecked() else "vllm"

    def set_engine(self, engine: Engine) -> None:
        """Select an engine (emits `engine_changed` when that changes it)."""
        self.engine_buttons[engine].setChecked(True)

    def choose_checkpoint(self, repo: str) -> None:
        self.checkpoint_edit.setText(repo)
        self._checkpoint_entered()

    def _checkpoint_entered(self) -> None:
        self.checkpoint_chosen.emit(self.checkpoint_edit.text().strip())

    def _engine_toggled(self, button_id: int, checked: bool) -> None:
        if checked:
            self.engine_changed.emit(list(ENGINE_NAMES)[button_id])

    # -- showing --

    def show_outcome(self, outcome: RecipeOutcome, gpu_name: str) -> None:
        self.outcome = outcome
        self.title.setText(f"{outcome.model} on {outcome.hardware}")
        kind, sentence = recipe_verdict(outcome)
        self.verdict_label.setText(sentence)
        self.verdict_label.setProperty("kind", kind)
        repolish(self.verdict_label)
        self._show_checkpoint(outcome)
        self._show_commands(outcome)
        self._show_advice(outcome)
        self._show_memory(outcome, gpu_name)
        self._show_reasons(outcome)

    def _show_checkpoint(self, outcome: RecipeOutcome) -> None:
        asked = outcome.request.checkpoint
        self.checkpoint_row.setVisible(outcome.checkpoint_is_placeholder or bool(asked))
        if outcome.serving is not None and not outcome.serving.checkpoint_known:
            self.checkpoint_edit.setPlaceholderText(outcome.serving.checkpoint.strip("<>"))
        if asked != (self.checkpoint_edit.text().strip() or None):
            self.checkpoint_edit.setText(asked or "")

    def _show_commands(self, outcome: RecipeOutcome) -> None:
        clear_layout(self.commands_layout)
        self.command_boxes = [CommandBox(block) for block in outcome.blocks]
        for box in self.command_boxes:
            self.commands_layout.addWidget(box)
        for note in outcome.notes:
            self.commands_layout.addWidget(make_label("• " + note, "muted"))
        self.commands_card.setVisible(outcome.fits)

    def _show_advice(self, outcome: RecipeOutcome) -> None:
        clear_layout(self.advice_layout)
        self.advice_labels = []
        for line in outcome.advice:
            item = QFrame()
            item.setObjectName("advice")
            row = QHBoxLayout(item)
            row.setContentsMargins(12, 8, 12, 8)
            label = make_label(line)
            row.addWidget(label)
            self.advice_labels.append(label)
            self.advice_layout.addWidget(item)
        self.advice_card.setVisible(bool(outcome.advice))
        self.advice_title.setText("Advice" if outcome.fits else "It does not fit: advice")

    def _show_memory(self, outcome: RecipeOutcome, gpu_name: str) -> None:
        clear_layout(self.memory_grid)
        views: list[DeviceMemoryView] = []
        if outcome.serving is not None:
            views = [ServingGpuView(gpu, gpu_name) for gpu in outcome.serving.gpus]
        elif outcome.llama is not None:
            views = [DeviceMemoryView(device) for device in outcome.llama.plan.devices]
        self.memory_views = views
        columns = BAR_COLUMNS if len(views) > TOO_MANY_FOR_A_COLUMN else 1
        for index, view in enumerate(views):
            row, column = divmod(index, columns)
            self.memory_grid.addWidget(view, row, column)
        self.memory_card.setVisible(bool(views))

    def _show_reasons(self, outcome: RecipeOutcome) -> None:
        clear_layout(self.reasons_grid)
        self.reason_labels = {}
        for row, reason in enumerate(outcome.reasons):
            name = make_label(reason_name(reason.setting), "settingName", wrap=False)
            value = make_label(str(reason.value), wrap=False)
            value.setMaximumWidth(360)
            why = make_label(reason.why)
            for column, label in enumerate((name, value, why)):
                self.reasons_grid.addWidget(label, row, column, Qt.AlignmentFlag.AlignTop)
            self.reason_labels[reason.setting] = (value, why)
        self.reasons_grid.setColumnStretch(2, 1)
        self.reasons_card.setVisible(bool(outcome.reasons))

    # -- layout --

    def _build(self) -> None:
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 8, 0)
        column.setSpacing(12)
        column.addWidget(self._build_verdict_card())
        self.commands_card, layout = make_card("Commands")
        self.commands_layout = QVBoxLayout()
        self.commands_layout.setSpacing(10)
        layout.addLayout(self.commands_layout)
        column.addWidget(self.commands_card)
        self.advice_card = QFrame()
        self.advice_card.setObjectName("card")
        layout = QVBoxLayout(self.advice_card)
        layout.setContentsMargins(16, 12, 16, 14)
        self.advice_title = make_label("Advice", "cardTitle")
        layout.addWidget(self.advice_title)
        self.advice_layout = QVBoxLayout()
        layout.addLayout(self.advice_layout)
        column.addWidget(self.advice_card)
        self.memory_card, layout = make_card("Memory per GPU")
        self.memory_grid = QGridLayout()
        self.memory_grid.setHorizontalSpacing(24)
        self.memory_grid.setVerticalSpacing(14)
        layout.addLayout(self.memory_grid)
        column.addWidget(self.memory_card)
        self.reasons_card, layout = make_card("Settings, and why")
        self.reasons_grid = QGridLayout()
        self.reasons_grid.setHorizontalSpacing(16)
        self.reasons_grid.setVerticalSpacing(8)
        layout.addLayout(self.reasons_grid)
        column.addWidget(self.reasons_card)
        column.addStretch(1)
        for card in (self.commands_card, self.advice_card, self.memory_card, self.reasons_card):
            card.hide()

    def _build_verdict_card(self) -> QFrame:
        card = QFrame()
        card.setObjectName("card")
        column = QVBoxLayout(card)
        column.setContentsMargins(16, 12, 16, 12)
        column.setSpacing(6)
        top = QHBoxLayout()
        # One line: a wrapped label beside other widgets gets too little height in a card.
        self.title = make_label("No recipe yet", "cardTitle", wrap=False)
        top.addWidget(self.title, 1)
        top.addLayout(self._build_engine_toggle(), 0)
        column.addLayout(top)
        self.verdict_label = make_label("", "verdict", wrap=False)
        self.verdict_label.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        column.addWidget(self.verdict_label)
        column.addWidget(self._build_checkpoint_row())
        return card

    def _build_engine_toggle(self) -> QHBoxLayout:
        row = QHBoxLayout()
        row.setSpacing(0)
        row.addWidget(QLabel("Serve with "))
        self.engine_group = QButtonGroup(self)
        self.engine_group.setExclusive(True)
        self.engine_buttons: dict[str, QPushButton] = {}
        for index, (engine, name) in enumerate(ENGINE_NAMES.items()):
            button = QPushButton(name)
            button.setCheckable(True)
            button.setObjectName("engineToggle")
            button.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
            self.engine_group.addButton(button, index)
            self.engine_buttons[engine] = button
            row.addWidget(button)
        self.engine_buttons["vllm"].setChecked(True)
        self.engine_buttons["vllm"].setToolTip("vLLM across the GPUs and nodes (tensor/pipeline)")
        self.engine_buttons["llama-server"].setToolTip("llama.cpp's server on one node")
        self.engine_group.idToggled.connect(self._engine_toggled)
        return row

    def _build_checkpoint_row(self) -> QWidget:
        self.checkpoint_row = QWidget()
        row = QHBoxLayout(self.checkpoint_row)
        row.setContentsMargins(0, 4, 0, 0)
        label = QLabel("&Checkpoint")
        self.checkpoint_edit = QLineEdit()
        self.checkpoint_edit.setClearButtonEnabled(True)
        self.checkpoint_edit.setToolTip(
            "The Hugging Face repo to serve, e.g. my-org/my-model-AWQ (in the planned format)"
        )
        self.checkpoint_edit.returnPressed.connect(self._checkpoint_entered)
        label.setBuddy(self.checkpoint_edit)
        self.checkpoint_button = QPushButton("Use this checkpoint")
        self.checkpoint_button.clicked.connect(self._checkpoint_entered)
        row.addWidget(label)
        row.addWidget(self.checkpoint_edit, 1)
        row.addWidget(self.checkpoint_button)
        self.checkpoint_row.hide()
        return self.checkpoint_row
