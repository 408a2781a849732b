"""The model picker at the top of the chat: the installed models, each with its size and the
plan's one-line verdict for this machine ("fits · ~95 tok/s"); choosing one loads it.

`ModelPicker` is the widget and only asks through `model_chosen`; `ModelPickerController`
fills it from the model registry and keeps it in step with the loading. The verdicts are the
Plan page's own (`plan_content.compute_plan`, at the context the chat loads models with):
planning reads the autotune database and may probe the hardware, so it runs on a worker
thread, once per model and hardware profile, and the list shows "planning…" meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QWidget,
)

from hearthside.app.gui.workers import BackgroundTask, run_in_background
from hearthside.core.errors import HearthsideError
from hearthside.core.units import format_bytes

if TYPE_CHECKING:
    from hearthside.app.gui.chat_session import ChatSession
    from hearthside.app.gui.engine_bridge import EngineBridge, LoadedModel
    from hearthside.app.gui.plan_content import PlanView
    from hearthside.core.probe.profile import HardwareProfile

PLANNING_TEXT = "planning…"
NO_MODELS_TEXT = "No models installed: add one on the Models page"
CHOOSE_TEXT = "Choose a model to chat with"
PICKER_TOOLTIP = (
    "The model this chat talks to. Choosing another loads it; the verdict is the Plan page's "
    "estimate for this computer."
)
_VERDICT_WORDS = {"fits": "fits", "streams": "streams from disk (slow)", "no": "won't fit"}


PICKER_LETTERS = 44


@dataclass(frozen=True)
class PickerEntry:
    model_id: str
    name: str
    size_bytes: int
    verdict: str | None = None  # "fits · ~95 tok/s"; None until planned

    def text(self) -> str:
        return f"{self.name} · {format_bytes(self.size_bytes)} · {self.verdict or PLANNING_TEXT}"


def verdict_line(view: PlanView) -> str:
    """The plan in a few words: "fits · ~95 tok/s" (measured here when it was), or why not."""
    from hearthside.app.gui.plan_content import verdict

    kind, _sentence = verdict(view.plan)
    words = _VERDICT_WORDS[kind]
    if kind == "no":
        return words
    measured = view.measured.decode_tps if view.measured is not None else None
    speed = measured or view.plan.speed.decode_tps
    how = "measured" if measured else "~"
    return f"{words} · {how}{' ' if measured else ''}{speed:.0f} tok/s"


def installed_entries() -> list[PickerEntry]:
    """The registered models, the default first (blocking: opens the model registry)."""
    from hearthside.core.models.store import ModelStore
    from hearthside.core.paths import data_dir

    with ModelStore(data_dir()) as store:
        records = sorted(store.list(), key=lambda record: not record.is_default)
    return [PickerEntry(r.id, r.name, r.size_bytes) for r in records]


def plan_verdicts(model_ids: Sequence[str], profile: HardwareProfile, n_ctx: int) -> dict[str, str]:
    """Each model's verdict on this machine (blocking); a model that cannot be planned says
    so instead of failing the others."""
    from hearthside.app.gui.plan_content import THIS_MACHINE, PlanRequest, compute_plan

    verdicts = {}
    for model_id in model_ids:
        try:
            view = compute_plan(PlanRequest(model_id, n_ctx=n_ctx, hardware=THIS_MACHINE), profile)
        except HearthsideError:
            verdicts[model_id] = "no plan: see the Plan page"
            continue
        verdicts[model_id] = verdict_line(view)
    return verdicts


class ModelPicker(QWidget):
    """ "Model: [SmolLM2 · 96 MiB · fits · ~95 tok/s ▾]" and a busy bar while one loads."""

    model_chosen = Signal(str)  # the id of the model the user picked

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel("Model:", self)
        self.box = QComboBox(self)
        self.box.setAccessibleName("Model")
        self.box.setToolTip(PICKER_TOOLTIP)
        # a fixed width in letters: a long model name and verdict must not widen the window
        # past small screens (the list that opens is as wide as its longest entry)
        self.box.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.box.setMinimumContentsLength(PICKER_LETTERS)
        self.box.view().setTextElideMode(Qt.TextElideMode.ElideNone)
        self.label.setBuddy(self.box)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 0)  # busy: llama.cpp does not report load progress
        self.progress.setMaximumWidth(160)
        # the bar and its text take only room that is free: a load must not widen the chat
        # pane and squeeze the conversation list the user sized
        self.progress.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.status = QLabel("", self)
        self.status.setTextFormat(Qt.TextFormat.PlainText)  # a name from a model file
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label)
        row.addWidget(self.box)
        row.addWidget(self.progress)
        row.addWidget(self.status)
        row.addStretch(1)
        self._entries: list[PickerEntry] = []
        self._loaded_id: str | None = None
        self._loaded_name: str | None = None
        self.box.activated.connect(self._on_activated)

    @property
    def entries(self) -> list[PickerEntry]:
        return list(self._entries)

    def set_entries(self, entries: Sequence[PickerEntry]) -> None:
        self._entries = list(entries)
        self.box.blockSignals(True)
        try:
            self.box.clear()
            for entry in self._entries:
                self.box.addItem(entry.text(), entry.model_id)
        finally:
            self.box.blockSignals(False)
        self._select(self._loaded_id)

    def set_loaded(self, model_id: str | None, name: str | None = None) -> None:
        """The model the chat talks to now; `name` is shown when it is not in the list (a
        GGUF file that is not registered, a remote server)."""
        self._loaded_id = model_id
        self._loaded_name = name
        self._select(model_id)

    def set_loading(self, what: str | None) -> None:
        """Show `what` ("Loading Gemma…") with a busy bar; None when nothing is loading."""
        self.progress.setVisible(what is not None)
        self.status.setText(what or "")
        self.box.setEnabled(what is None)

    def choose(self, model_id: str) -> bool:
        """Pick `model_id` as the user would; False if it is not in the list."""
        index = self.box.findData(model_id)
        if index < 0:
            return False
        self.box.setCurrentIndex(index)
        self._on_activated(index)
        return True

    def _select(self, model_id: str | None) -> None:
        index = self.box.findData(model_id) if model_id is not None else -1
        self.box.setPlaceholderText(
            self._loaded_name or (CHOOSE_TEXT if self._entries else NO_MODELS_TEXT)
        )
        self.box.blockSignals(True)
        self.box.setCurrentIndex(index)
        self.box.blockSignals(False)

    @Slot(int)
    def _on_activated(self, index: int) -> None:
        model_id = self.box.itemData(index)
        if isinstance(model_id, str) and model_id != self._loaded_id:
            self.model_chosen.emit(model_id)


class ModelPickerController(QObject):
    """Fills the picker from the registry, plans each model once, and mirrors the loading."""

    error = Signal(object)  # a HearthsideError to show

    def __init__(
        self,
        picker: ModelPicker,
        bridge: EngineBridge,
        session: ChatSession,
        profile_source: Callable[[], Callable[[], HardwareProfile]],
        n_ctx: Callable[[], int],
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.picker = picker
        self.bridge = bridge
        self.session = session
        self._profile_source = profile_source
        self._n_ctx = n_ctx
        self._verdicts: dict[str, str] = {}
        self._listing: BackgroundTask[list[PickerEntry]] | None = None
        self._planning: BackgroundTask[dict[str, str]] | None = None
        bridge.load_started.connect(self._on_load_started)
        bridge.load_finished.connect(self._on_loaded)
        session.state_changed.connect(self._on_state_changed)

    @property
    def planning(self) -> bool:
        return self._planning is not None

    @Slot()
    def reload(self) -> None:
        """Read the installed models again (after one was added or removed)."""
        self._listing = run_in_background(installed_entries, self._on_listed, self._on_failed)

    def _on_listed(self, entries: list[PickerEntry]) -> None:
        self._listing = None
        self._show(entries)
        if self.bridge.loaded_model is not None:
            self._plan_unplanned()

    def _plan_unplanned(self) -> None:
        """Plan the models without a verdict — after a model has loaded, so that planning
        (which may probe the hardware) never competes with the first load."""
        unplanned = [e.model_id for e in self.picker.entries if e.model_id not in self._verdicts]
        if unplanned and self._planning is None:
            profile, n_ctx = self._profile_source(), self._n_ctx()
            self._planning = run_in_background(
                lambda: plan_verdicts(unplanned, profile(), n_ctx),
                self._on_planned,
                self._on_plan_failed,
            )

    def _show(self, entries: Sequence[PickerEntry]) -> None:
        self.picker.set_entries(
            [replace(e, verdict=self._verdicts.get(e.model_id)) for e in entries]
        )

    def _on_planned(self, verdicts: dict[str, str]) -> None:
        self._planning = None
        self._verdicts.update(verdicts)
        self._show(self.picker.entries)
        self._plan_unplanned()  # models added while these were planned

    def _on_plan_failed(self, error: BaseException) -> None:
        self._planning = None  # the list stays usable without verdicts
        if isinstance(error, HearthsideError):
            self.error.emit(error)

    def _on_failed(self, error: BaseException) -> None:
        self._listing = None
        if isinstance(error, HearthsideError):
            self.error.emit(error)

    @Slot(str)
    def _on_load_started(self, name: str) -> None:
        self.picker.set_loading(f"Loading {name}…")

    @Slot(object)
    def _on_loaded(self, loaded: LoadedModel) -> None:
        self.picker.set_loaded(loaded.model_id, loaded.name)
        if loaded.model_id is not None and loaded.model_id not in self._ids():
            self.reload()  # installed just now (the first run's default model)
        else:
            self._plan_unplanned()

    @Slot(str)
    def _on_state_changed(self, _mode: str) -> None:
        if self.session.model_pending and not self.bridge.loading:
            self.picker.set_loading("Preparing the model…")
        elif not self.session.model_pending and not self.bridge.loading:
            self.picker.set_loading(None)
            loaded = self.bridge.loaded_model
            if loaded is None:
                self.picker.set_loaded(None)
            else:
                self.picker.set_loaded(loaded.model_id, loaded.name)

    def _ids(self) -> list[str]:
        return [entry.model_id for entry in self.picker.entries]
