"""The "Optimize for my hardware" wizard: what was found, goal and model, measuring, result.

    wizard = OptimizeWizard(service, window.machine.context, window, current_model_id=...)
    wizard.applied.connect(lambda tuning: window.load_model(tuning.model_id))
    wizard.measured.connect(window.machine.refresh)
    wizard.open()

1. What was found: the machine's `MachineContext` (the window's, or read for a profile given,
   one a callable returns, or a probe in a child process) and whether this machine was
   calibrated, with an offer to do so. A calibration, and every tuning run, changes the
   machine's figures: `measured` says so, Apply or not.
2. Goal and model: the planner's four goals; the registered models plus catalog models the
   planner says fit here (those cannot be measured: they get a plan only); the time budget,
   and under it the whole wait (a calibration first included) and what it measures, worked
   out for the chosen model from this machine's costs (`optimize.wait_text`): amber, with
   the budget that would do, when it cannot reach the defaults and the two settings the
   predictions rank best.
3. Measuring: the tuner on the chosen model, live, with a chart of its candidates and the
   time since Start against that whole wait; those the time budget cut off show as "not
   measured", never as failed.
4. Result: the chosen settings beside llama.cpp's own defaults, the measured speed-up (or,
   when candidates predicted to beat the defaults were not measured, "Measured N of M — about
   X more minutes would test the rest"), the reasons and the context check. Apply stores them
   as the model's default on this machine on a worker thread (another Hearthside may hold the
   DB's lock for seconds), then emits `applied` so the window can reload the chat engine with
   them, and closes; a failure is said on the page, which stays open to try again. When
   other programs were busy while measuring (`TuneResult.busy`), the page says so and offers
   only Close: nothing is stored.

The engine question: the tuner loads engines of its own, and two engines decoding at once on
a small machine would spoil both the chat and the measurements. So the whole measurement runs
as ONE EngineService job: the service's single thread runs it, chat replies and API requests
wait in the service's queue behind it (API clients get the queue's usual 503 once it is full),
and the job's own cancel event is the tuner's cancel event. The chat model stays loaded but
idle, so nothing has to be reloaded afterwards; Apply asks the window to reload it with the
new settings.
"""

from __future__ import annotations

import contextlib
import html
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from PySide6.QtCore import (
    QModelIndex,
    QObject,
    QPersistentModelIndex,
    QRect,
    QSize,
    Qt,
    QTimer,
    Signal,
    SignalInstance,
)
from PySide6.QtGui import QFont, QFontMetrics, QPainter
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QCheckBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSizePolicy,
    QSlider,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
    QWizard,
    QWizardPage,
)

from hearthside.app.gui.labels import make_label as _label
from hearthside.app.gui.tune_chart import TuneChart, candidate_label
from hearthside.app.gui.workers import MainThreadRelay, run_in_background
from hearthside.autotune.busy import busy_text
from hearthside.autotune.calibration_figures import describe_figures
from hearthside.autotune.goals import KLD_BUDGET, QUALITY_FLOOR
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.optimize import (
    CALIBRATION_BUDGET_S,
    TUNING_CONTEXT,
    AppliedTuning,
    MeasureRequest,
    MeasureUpdate,
    ModelChoice,
    SettingRow,
    TuneCosts,
    TuneResult,
    apply_tuning,
    audit_text,
    coverage_text,
    llama_cpp_defaults,
    machine_context,
    measure,
    measured_reasons,
    model_choices,
    plan_for_catalog,
    quality_row,
    quality_text,
    settings_rows,
    tune_costs,
    tuned_speed_of_light,
    variant_text,
    verdict,
    wait_text,
)
from hearthside.autotune.planner import GOALS, Goal, Plan, Reason
from hearthside.autotune.speed_limit import SpeedOfLight
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService, Job
from hearthside.core.errors import (
    EngineError,
    HearthsideError,
    JobCancelledError,
    describe_error,
)
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.units import format_bytes, format_duration

# What the wizard tunes for: the window's MachineContext, a profile (its context is read), a
# callable that returns one, or None (a probe in a child process).
ProfileSource = MachineContext | HardwareProfile | Callable[[], HardwareProfile] | None
PAGE_FOUND, PAGE_GOAL, PAGE_MEASURE, PAGE_RESULT = range(4)
DEFAULT_GOAL: Goal = "balanced"
GOAL_TEXT: dict[str, tuple[str, str]] = {
    "fastest": (
        "&Fastest replies",
        "The most tokens per second whose answers stay close to full precision "
        f"(mean KLD ≤ {KLD_BUDGET}).",
    ),
    "quality": (
        "Best &quality",
        f"The answers closest to full precision, at {QUALITY_FLOOR:.0%} of the fastest speed "
        "or more.",
    ),
    "longest-context": (
        "&Longest context",
        "As much conversation as memory holds; speed comes second.",
    ),
    "balanced": (
        "B&alanced (recommended)",
        "Good speed with room for long chats; a quick first reply counts too.",
    ),
}
BUDGET_MIN_S, BUDGET_MAX_S, BUDGET_STEP_S, DEFAULT_BUDGET_S = 30, 600, 15, 60
TICK_MS = 250
INDENT_PX = 24
STYLE = """
QFrame#card { background: palette(base); border: 1px solid palette(midlight);
              border-radius: 8px; }
QLabel#muted { color: palette(placeholder-text); }
QLabel#headline { font-size: 17pt; font-weight: 600; }
QLabel#status { font-weight: 600; }
QLabel#error { color: #c5221f; }
QLabel#warning { color: #8a5a00; font-weight: 600; }
QLabel#goalNote { color: palette(placeholder-text); }
"""


# ---- facts the first page shows -------------------------------------------------------------


def summary_rows(profile: HardwareProfile) -> list[tuple[str, str]]:
    cpu, memory = profile.cpu, profile.memory
    rows = [
        ("Processor", f"{cpu.model or 'Unknown'} ({cpu.arch})"),
        ("Cores", f"{cpu.physical_cores or '?'} cores, {cpu.logical_cores or '?'} threads"),
        ("Instruction sets", " · ".join(flag.upper() for flag in cpu.flags) or "none known"),
        ("Memory", _memory_text(memory.total_bytes, memory.available_bytes)),
    ]
    gpus = [f"{gpu.name}, {format_bytes(gpu.vram_total_bytes)}" for gpu in profile.gpus]
    rows.append(("Graphics", "; ".join(gpus) or "none found: the CPU runs the model"))
    engine = profile.engine
    if engine is not None:
        offload = "can use the GPU" if engine.gpu_offload else "CPU only"
        backends = ", ".join(engine.backends) or "none"
        rows.append(("Engine", f"llama.cpp ({backends}): {offload}"))
    return rows


def mark_quality(chart: TuneChart, result: TuneResult) -> None:
    """Each measured candidate's quality under its bar, in red when over the budget."""
    for run in result.runs:
        if run.outcome == "ok" and run is not result.python_defaults:
            over = result.quality_of(run).mean_kld > result.kld_budget
            short = quality_text(result, run).split(",")[0]
            variant = result.variant_of(run)
            label = variant.label if variant is not None else ""
            chart.mark_quality(str(run.config.get("type_k")), short, over, label)


def measured_summary(result: TuneResult) -> str:
    """The measuring page's last line: what failed, what the time cut off (not measured, never
    counted as failed) and where the pick is."""
    failed = sum(1 for run in result.runs if run.outcome not in ("ok", "timeout"))
    parts = [f"{failed} failed (kept, never retried)."] if failed else []
    coverage = coverage_text(result)
    parts += [f"{coverage}."] if coverage else []
    parts += ["The chosen one is starred."] if result.best is not None else []
    return " ".join(parts)


def applied_tuning(result: TuneResult, choice: ModelChoice) -> AppliedTuning:
    """What the window reloads after Apply: the tuned model, or the installed quant variant
    that won (its own default now holds the settings)."""
    assert result.best is not None and choice.path is not None
    variant = result.chosen_variant
    model_id, name, path = choice.ref, choice.name, str(choice.path)
    if variant is not None:
        model_id, name, path = variant.model_id, f"{choice.name} ({variant.label})", variant.path
    config = EngineConfig.from_dict({**result.best.config, "model_path": path})
    return AppliedTuning(model_id, name, config, result.speedup)


# ---- runners: where page 3's updates come from ------------------------------------------------


class RunnerSignals(QObject):
    """The signals every runner emits on the GUI thread."""

    update = Signal(object)  # MeasureUpdate
    finished = Signal(object)  # TuneResult, or None when nothing was tuned (stopped early)
    failed = Signal(object)  # BaseException


class TuneRunner(Protocol):
    """What the wizard needs of a runner. Each (`ServiceTuneRunner`, the real one, and the
    screenshots' replay, `screenshot_recording.RecordedTuneRunner`) is a `RunnerSignals`,
    starts one measurement at a time with `start(request)`, stops it with `cancel()`, and
    says whether one is `running` and has `started`."""

    @property
    def update(self) -> SignalInstance: ...
    @property
    def finished(self) -> SignalInstance: ...
    @property
    def failed(self) -> SignalInstance: ...
    @property
    def running(self) -> bool: ...
    @property
    def started(self) -> bool: ...
    def start(self, request: MeasureRequest) -> None: ...
    def cancel(self) -> None: ...


class ServiceTuneRunner(RunnerSignals):
    """The real thing: the measurement is one EngineService job (see the module docstring)."""

    def __init__(self, service: EngineService | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.service = service
        self._job: Job[TuneResult | None] | None = None
        self._serial = 0
        self._started = False

    @property
    def running(self) -> bool:
        return self._job is not None

    @property
    def started(self) -> bool:
        return self.running and self._started

    def start(self, request: MeasureRequest) -> None:
        """Queue the job; raises EngineError/QueueFullError when the engine cannot take it."""
        if self.service is None:
            raise EngineError("The engine is not running.", hint="Restart Hearthside.")
        self._serial += 1
        self._started = False
        serial = self._serial
        relay = MainThreadRelay(lambda item: self._deliver(serial, relay, item), self)
        post = _poster(relay)
        job: Job[TuneResult | None] = Job(
            lambda _engine, cancel: measure(request, cancel, post),
            description="optimize for this machine",
        )
        job.future.add_done_callback(post)
        self._job = self.service.submit(job)
        # Whatever closes the wizard, a measurement nobody watches must not run on.
        self.destroyed.connect(lambda *_: job.cancel())

    def cancel(self) -> None:
        if self._job is not None:
            self._job.cancel()

    def _deliver(
        self, serial: int, relay: QObject, item: MeasureUpdate | Future[TuneResult | None]
    ) -> None:
        current = serial == self._serial  # else a run left behind by Back; its page moved on
        if isinstance(item, MeasureUpdate):
            if current:
                self._started = True
                self.update.emit(item)
            return
        relay.deleteLater()
        if not current:
            return
        self._job = None
        error = item.exception()
        if isinstance(error, JobCancelledError):  # cancelled while it waited in the queue
            self.finished.emit(None)
        elif error is not None:
            self.failed.emit(error)
        else:
            self.finished.emit(item.result())


def _poster(relay: MainThreadRelay) -> Callable[[Any], None]:
    """`relay.post` from the engine thread, quiet once the wizard (and its relay) is gone."""

    def post(item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the C++ object was deleted: nobody to tell
            relay.post(item)

    return post


Runner = TuneRunner


# ---- small widgets ---------------------------------------------------------------------------


def _memory_text(total: int | None, available: int | None) -> str:
    text = format_bytes(total)
    return f"{text} ({format_bytes(available)} free)" if available is not None else text


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def unsteady_count_text(count: int) -> str:
    """Under the measuring bar: settings whose speed may read low, and why, in plain words."""
    speeds = "1 speed" if count == 1 else f"{count} speeds"
    return (
        f"{speeds} may read low: other programs were busy, or the speed jumped between tries "
        "(the next Optimize measures again); point at a bar for details"
    )


class ModelChoiceDelegate(QStyledItemDelegate):
    """Two lines per model (the name, then its details) and a tag: installed or plan only."""

    PADDING = 8

    def sizeHint(  # noqa: N802 (Qt's name)
        self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> QSize:
        line = QFontMetrics(option.font).height()
        return QSize(200, 2 * line + 2 * self.PADDING + 2)

    def paint(
        self,
        painter: QPainter,
        option: QStyleOptionViewItem,
        index: QModelIndex | QPersistentModelIndex,
    ) -> None:
        choice: ModelChoice = index.data(Qt.ItemDataRole.UserRole)
        widget = option.widget
        style = widget.style() if widget is not None else None
        plain = QStyleOptionViewItem(option)
        self.initStyleOption(plain, index)
        plain.text = ""
        if style is not None:
            style.drawControl(QStyle.ControlElement.CE_ItemViewItem, plain, painter, widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        palette = option.palette
        text = palette.highlightedText() if selected else palette.text()
        muted = text if selected else palette.placeholderText()
        rect: QRect = option.rect.adjusted(self.PADDING, self.PADDING, -self.PADDING, 0)
        tag = "installed" if choice.installed else "not installed: plan only"
        if not choice.available:
            tag = "file missing"
        painter.save()
        bold = QFont(option.font)
        bold.setBold(True)
        painter.setFont(bold)
        painter.setPen(text.color())
        line = QFontMetrics(bold).height()
        painter.drawText(rect, Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop, choice.name)
        painter.setFont(option.font)
        painter.setPen(muted.color())
        painter.drawText(rect.adjusted(0, line, 0, 0), Qt.AlignmentFlag.AlignLeft, choice.detail)
        painter.drawText(rect, Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignTop, tag)
        painter.restore()


# ---- page 1: what was found ------------------------------------------------------------------


class FoundPage(QWizardPage):
    def __init__(self, wizard: OptimizeWizard) -> None:
        super().__init__()
        self._wizard = wizard
        self.setTitle("What was found")
        self.setSubTitle("Hearthside looked at this computer. Nothing changes until you Apply.")
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.status = _label("Looking at this computer…", "muted")
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)
        self.busy.setFixedWidth(140)
        self.busy.setTextVisible(False)
        row.addWidget(self.status, 1)
        row.addWidget(self.busy)
        layout.addLayout(row)
        card = QFrame()
        card.setObjectName("card")
        card_layout = QVBoxLayout(card)
        card_layout.setContentsMargins(16, 12, 16, 14)
        self.form = QFormLayout()
        self.form.setHorizontalSpacing(24)
        self.form.setVerticalSpacing(8)
        card_layout.addLayout(self.form)
        layout.addWidget(card)
        layout.addSpacing(10)
        self.calibration = _label()
        layout.addWidget(self.calibration)
        self.calibrate_box = QCheckBox(
            f"&Calibrate this machine first (about {CALIBRATION_BUDGET_S / 60:.0f} min)"
        )
        self.calibrate_box.setToolTip(
            "Measures memory bandwidth, matrix speed, the disk and the engine, so the "
            "predictions fit this machine."
        )
        self.calibrate_box.hide()
        self.calibrate_box.toggled.connect(lambda _: self._wizard.refresh_wait())
        layout.addWidget(self.calibrate_box)
        layout.addStretch(1)

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        self._wizard.start_survey()

    def show_survey(self, found: MachineContext) -> None:
        self.busy.hide()
        self.status.setText("This is what Hearthside will tune for:")
        while self.form.rowCount():
            self.form.removeRow(0)
        for name, value in summary_rows(found.profile):
            key = _label(name, "muted")
            key.setWordWrap(False)
            self.form.addRow(key, _label(value))
        if found.calibration:
            self.calibration.setText(
                f"Calibrated: {describe_figures(found.calibration)}. Predictions use these figures."
            )
            self.calibrate_box.setText(
                f"&Calibrate again first (about {CALIBRATION_BUDGET_S / 60:.0f} min)"
            )
        else:
            self.calibration.setText(
                "Not calibrated yet: predictions use typical figures for this kind of machine."
            )
            self.calibrate_box.setChecked(True)
        self.calibrate_box.show()
        self.completeChanged.emit()

    def show_error(self, error: BaseException) -> None:
        self.busy.hide()
        self.status.setStyleSheet("color: #c5221f;")
        self.status.setText("The hardware probe failed. " + describe_error(error))

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name)
        return self._wizard.found is not None


# ---- page 2: goal and model ------------------------------------------------------------------


class GoalPage(QWizardPage):
    def __init__(self, wizard: OptimizeWizard) -> None:
        super().__init__()
        self._wizard = wizard
        self.setTitle("Goal and model")
        self.setSubTitle("What matters most, and which model to tune.")
        columns = QHBoxLayout(self)
        columns.setSpacing(24)
        columns.addLayout(self._build_goals(), 2)
        columns.addLayout(self._build_models(), 3)
        self.budget.valueChanged.connect(lambda _: self.show_wait())

    def _build_goals(self) -> QVBoxLayout:
        layout = QVBoxLayout()
        layout.setSpacing(4)
        layout.addWidget(_label("Goal", "status", wrap=False))
        self.goal_group = QButtonGroup(self)
        self.goal_buttons: dict[Goal, QRadioButton] = {}
        for goal in GOALS:
            title, note = GOAL_TEXT[goal]
            button = QRadioButton(title)
            button.setToolTip(note)
            self.goal_group.addButton(button)
            self.goal_buttons[goal] = button
            layout.addWidget(button)
            explanation = _label(note, "goalNote")
            explanation.setContentsMargins(INDENT_PX, 0, 0, 0)
            layout.addWidget(explanation)
            layout.addSpacing(8)
        self.goal_buttons[DEFAULT_GOAL].setChecked(True)
        layout.addSpacing(12)
        layout.addWidget(_label("Time to spend measuring", "status", wrap=False))
        row = QHBoxLayout()
        self.budget = QSlider(Qt.Orientation.Horizontal)
        self.budget.setRange(BUDGET_MIN_S, BUDGET_MAX_S)
        self.budget.setSingleStep(BUDGET_STEP_S)
        self.budget.setPageStep(60)
        self.budget.setTickInterval(60)
        self.budget.setTickPosition(QSlider.TickPosition.TicksBelow)
        self.budget.setValue(DEFAULT_BUDGET_S)
        self.budget.setAccessibleName("Time to spend measuring")
        self.budget_text = QLabel()
        self.budget_text.setMinimumWidth(80)
        self.budget.valueChanged.connect(self._show_budget)
        self._show_budget(self.budget.value())
        row.addWidget(self.budget, 1)
        row.addWidget(self.budget_text)
        layout.addLayout(row)
        layout.addWidget(
            _label("More time measures more settings; stop whenever you like.", "muted")
        )
        self.wait = _label("", "muted")
        self.wait.setAccessibleName("How long you wait")
        layout.addWidget(self.wait)
        self.goal_group.buttonToggled.connect(lambda *_: self._wizard.refresh_wait())
        layout.addStretch(1)
        return layout

    def _build_models(self) -> QVBoxLayout:
        layout = QVBoxLayout()
        layout.setSpacing(6)
        layout.addWidget(_label("Model", "status", wrap=False))
        self.models = QListWidget()
        self.models.setAccessibleName("Models")
        self.models.setItemDelegate(ModelChoiceDelegate(self.models))
        self.models.currentItemChanged.connect(lambda *_: self.completeChanged.emit())
        self.models.currentItemChanged.connect(lambda *_: self._wizard.refresh_wait())
        layout.addWidget(self.models, 1)
        self.model_note = _label(
            "Installed models are measured. Models marked “not installed” get a plan only: "
            "download them from the Models page to measure them.",
            "muted",
        )
        layout.addWidget(self.model_note)
        return layout

    def _show_budget(self, seconds: int) -> None:
        snapped = round(seconds / BUDGET_STEP_S) * BUDGET_STEP_S
        if seconds >= BUDGET_MIN_S and snapped != seconds:
            self.budget.setValue(snapped)
            return
        self.budget_text.setText(format_duration(seconds))

    def show_wait(self) -> None:
        """What the chosen budget makes a person wait in all, and what it measures, in amber
        when it is too short to measure the settings predicted best."""
        costs, choice = self._wizard.costs, self.choice()
        if choice is not None and not choice.installed:
            calibrating = self._wizard.calibrate_first
            self.wait.setText(
                f"A plan only, nothing is measured: you wait about "
                f"{format_duration(CALIBRATION_BUDGET_S)} calibrating first."
                if calibrating
                else "A plan only, nothing is measured: it is ready in seconds."
            )
            self.wait.setStyleSheet("")
            return
        if costs is None:
            self.wait.setText("")
            return
        said = wait_text(
            float(self.budget.value()), costs, step_s=BUDGET_STEP_S, max_s=BUDGET_MAX_S
        )
        self.wait.setText(said.text)
        self.wait.setStyleSheet("color: #8a5a00;" if said.too_short else "")

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        if self.models.count() == 0:
            self._wizard.load_choices()
        else:  # back from a run: it measured this model, so its costs are known better now
            self._wizard.refresh_wait()

    def show_choices(self, choices: Sequence[ModelChoice], current: str | None) -> None:
        self.models.clear()
        for choice in choices:
            item = QListWidgetItem(f"{choice.name}, {choice.detail}")
            item.setData(Qt.ItemDataRole.UserRole, choice)
            item.setToolTip(choice.detail)
            if not choice.available:
                item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEnabled)
            self.models.addItem(item)
        self.select_model(current)
        self.completeChanged.emit()

    def select_model(self, ref: str | None) -> None:
        """Select `ref`, or the default (else the first) model that can be measured."""
        for row in range(self.models.count()):
            choice = self._choice_at(row)
            if choice.available and (choice.ref == ref if ref else choice.is_default):
                self.models.setCurrentRow(row)
                return
        for row in range(self.models.count()):
            if self._choice_at(row).available:
                self.models.setCurrentRow(row)
                return

    def _choice_at(self, row: int) -> ModelChoice:
        item = self.models.item(row)
        choice: ModelChoice = item.data(Qt.ItemDataRole.UserRole)
        return choice

    def choice(self) -> ModelChoice | None:
        item = self.models.currentItem()
        if item is None or not item.flags() & Qt.ItemFlag.ItemIsEnabled:
            return None
        chosen: ModelChoice = item.data(Qt.ItemDataRole.UserRole)
        return chosen

    def goal(self) -> Goal:
        return next(goal for goal, button in self.goal_buttons.items() if button.isChecked())

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name)
        return self.choice() is not None

    def nextId(self) -> int:  # noqa: N802 (Qt's name)
        choice = self.choice()
        measuring = (choice is not None and choice.installed) or self._wizard.calibrate_first
        return PAGE_MEASURE if measuring else PAGE_RESULT


# ---- page 3: measuring -----------------------------------------------------------------------


class MeasurePage(QWizardPage):
    def __init__(self, wizard: OptimizeWizard) -> None:
        super().__init__()
        self._wizard = wizard
        self.setTitle("Measuring")
        self.setSubTitle("Each candidate is loaded and timed with the real engine.")
        layout = QVBoxLayout(self)
        row = QHBoxLayout()
        self.status = _label("", "status")
        self.stop_button = QPushButton("&Stop measuring")
        self.stop_button.setToolTip("Stops after the candidate being measured now.")
        self.stop_button.clicked.connect(self.stop)
        row.addWidget(self.status, 1)
        row.addWidget(self.stop_button)
        layout.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        layout.addWidget(self.progress)
        self.detail = _label("", "muted")
        layout.addWidget(self.detail)
        self.chart = TuneChart()
        layout.addWidget(self.chart, 1)
        self.error = _label("", "error")
        self.error.hide()
        layout.addWidget(self.error)
        self.timer = QTimer(self)
        self.timer.setInterval(TICK_MS)
        self.timer.timeout.connect(self._tick)
        self._clock = Stopwatch()
        self._reset()

    def _reset(self) -> None:
        self.chart.clear()
        self.finished = False
        self.stopping = False
        self.failed_error: BaseException | None = None
        self.total = 0
        self.done_count = 0
        self.disturbed_count = 0  # measured beside busy programs or with repeats that disagreed
        self.error.hide()
        self.progress.setRange(0, 0)
        self.stop_button.setEnabled(True)
        self.status.setText("Waiting for the engine to finish what it is doing…")
        self.detail.setText("")

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        self._reset()
        try:
            self._wizard.start_measuring()
        except HearthsideError as exc:
            self.show_failure(exc)

    def cleanupPage(self) -> None:  # noqa: N802 (Qt's name): Back stops the run
        self._wizard.runner.cancel()
        self.timer.stop()

    def stop(self) -> None:
        if self.finished or self.stopping:
            return
        self.stopping = True
        self.stop_button.setEnabled(False)
        self._wizard.runner.cancel()
        self.status.setText("Stopping… (after the candidate being measured)")

    # -- updates --

    def show_update(self, update: MeasureUpdate) -> None:
        if update.kind == "started":
            self._clock.restart()
            self.timer.start()
            if not self.stopping:
                self.status.setText("Preparing…")
        elif update.kind == "calibrating":
            if not self.stopping:
                self.status.setText("Calibrating this machine…")
            self.progress.setRange(0, 100)
            self.progress.setValue(int((update.fraction or 0) * 100))
            self.detail.setText(f"Calibrating: {update.text}")
        elif update.kind == "calibrated":
            self.detail.setText("Calibration stored.")
        elif update.event is not None:
            self._candidate(update)

    def _candidate(self, update: MeasureUpdate) -> None:
        event = update.event
        assert event is not None
        if event.kind == "done":
            return
        if event.kind == "quality":
            kv_type = str(event.config.get("type_k"))
            self.detail.setText(f"Quality measured: {event.message}.")
            self.chart.mark_quality(kv_type, event.message.split(": ", 1)[-1], False)
            return
        if event.kind == "confirm":  # a gain measured again: not a candidate of its own
            if not self.stopping:
                self.status.setText(
                    "Measuring llama.cpp's defaults and the pick again, back to back, to confirm "
                    "the gain…"
                )
            return
        if event.workload is not None:  # speculation measured on the winner, not a candidate
            if not self.stopping:
                self.status.setText(f"Trying speculative decoding on the {event.workload} prompts…")
            return
        self.total = event.total
        self.chart.add_event(event)
        if event.kind == "start" and not self.stopping:
            first, second = candidate_label(event.config, event.baseline, event.variant)
            self.status.setText(f"Measuring {first}, {second} ({event.index} of {event.total})…")
        elif event.kind != "unmeasured":
            self.done_count += 1
        if event.kind == "measured" and event.message:  # a disturbed run's note
            self.disturbed_count += 1
        self._tick()

    def _tick(self) -> None:
        if self.total == 0:
            return
        elapsed = self._clock.seconds()  # since Start: the calibration first counts too
        wait = self._wizard.stated_wait_s
        share = max(self.done_count / self.total, min(elapsed / wait, 1.0))
        self.progress.setRange(0, 100)
        self.progress.setValue(min(99, int(share * 100)))
        text = (
            f"{self.done_count} of {self.total} candidates · {elapsed:.0f} s of about {wait:.0f} s"
        )
        if self.disturbed_count:
            text += " · " + unsteady_count_text(self.disturbed_count)
        if elapsed > wait and not self.stopping:
            text += " · time is up: finishing the candidate, then checking the winner's context"
        self.detail.setText(text)

    def show_result(self, result: TuneResult | None) -> None:
        self.timer.stop()
        self.finished = True
        self.stop_button.setEnabled(False)
        self.chart.stop_pending()
        self.progress.setRange(0, 100)
        self.progress.setValue(100)
        runs = result.runs if result is not None else ()
        if result is not None and result.best is not None:
            winner = result.chosen_variant
            self.chart.mark_chosen(result.best.config, winner.label if winner else "")
        if result is not None:
            mark_quality(self.chart, result)
        measured = _count(sum(1 for run in runs if run.outcome == "ok"), "setting")
        if self.stopping:
            self.status.setText(f"Stopped: {measured} measured.")
        else:
            self.status.setText(f"Done: {measured} measured. Press Next for the result.")
        self.detail.setText(measured_summary(result) if result is not None else "")
        self.completeChanged.emit()

    def show_failure(self, error: BaseException) -> None:
        self.timer.stop()
        self.failed_error = error
        self.stop_button.setEnabled(False)
        self.progress.setRange(0, 100)
        self.progress.setValue(0)
        self.status.setText("Measuring failed.")
        self.error.setText(describe_error(error))
        self.error.show()
        self.completeChanged.emit()

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name)
        return self.finished and self.failed_error is None


class Stopwatch:
    """Seconds since `restart`, on the monotonic clock."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def restart(self) -> None:
        self._start = time.monotonic()

    def seconds(self) -> float:
        return time.monotonic() - self._start


# ---- page 4: result --------------------------------------------------------------------------


class ResultPage(QWizardPage):
    def __init__(self, wizard: OptimizeWizard) -> None:
        super().__init__()
        self._wizard = wizard
        self.setTitle("Result")
        self.setSubTitle("What measuring found, and what Apply would keep.")
        layout = QVBoxLayout(self)
        self.headline = _label("", "headline")
        self.subline = _label()
        # other programs were busy while measuring: said first, and nothing is stored
        self.busy = _label("", "warning")
        self.busy.hide()
        layout.addWidget(self.headline)
        layout.addWidget(self.subline)
        layout.addWidget(self.busy)
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Setting", "llama.cpp defaults", "Chosen"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
        self.table.setAccessibleName("Chosen settings against llama.cpp's defaults")
        self.table.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        layout.addWidget(self.table)
        self.reasons = _label()
        self.reasons.setTextFormat(Qt.TextFormat.RichText)
        layout.addWidget(self.reasons)
        self.audit = _label("", "muted")
        layout.addWidget(self.audit)
        self.speed = _label("", "muted")  # the pick's share of this machine's limit
        self.speed.hide()
        layout.addWidget(self.speed)
        self.note = _label("", "muted")
        layout.addWidget(self.note)
        self.applying_bar = QProgressBar()
        self.applying_bar.setRange(0, 0)  # busy: one write, nothing to count
        self.applying_bar.setAccessibleName("Saving the settings")
        self.applying_bar.hide()
        layout.addWidget(self.applying_bar)
        self.error = _label("", "error")
        self.error.hide()
        layout.addWidget(self.error)
        self.models_button = QPushButton("Open the &Models page")
        self.models_button.clicked.connect(self._open_models_page)
        self.models_button.hide()
        layout.addWidget(self.models_button, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addStretch(1)
        self.plan: Plan | None = None

    def initializePage(self) -> None:  # noqa: N802 (Qt's name)
        wizard = self._wizard
        self.plan = None
        self.models_button.hide()
        self.error.hide()
        if wizard.tune_result is not None:
            self.show_measured(wizard.tune_result)
        elif wizard.choice is not None and wizard.choice.installed:
            self._clear("Nothing was measured")
            self.subline.setText("Measuring stopped before the first setting finished.")
        else:
            self._clear("Planning…")
            wizard.plan_catalog_model()

    def _clear(self, text: str) -> None:
        for widget in (self.subline, self.reasons, self.audit, self.note):
            widget.setText("")
        self.speed.hide()
        self.busy.hide()
        self.headline.setText(text)
        self.table.setRowCount(0)
        self._wizard.offer_apply(False)

    def show_measured(self, result: TuneResult) -> None:
        headline, subline = verdict(result)
        self.headline.setText(headline)
        self.subline.setText(subline)
        defaults = (
            result.baseline.config
            if result.baseline is not None
            else llama_cpp_defaults("", self._wizard.found_profile(), TUNING_CONTEXT).to_dict()
        )
        chosen = result.best.config if result.best is not None else defaults
        rows = settings_rows(chosen, defaults)
        quality = quality_row(result)
        self._fill_table([*rows, quality] if quality else rows)
        self.reasons.setText(_reasons_html(measured_reasons(result)))
        self.audit.setText(f"Context check: {audit_text(result)}")
        name = self._wizard.choice.name if self._wizard.choice else "this model"
        lines = [variant_text(result, variant) for variant in result.variants]
        winner = result.chosen_variant
        if winner is not None:
            name = f"the {winner.label} variant ({winner.model_id})"
        if result.best is not None and result.busy is None:
            lines.append(
                f"Apply makes these settings {name}'s default on this machine and reloads the "
                "chat with them."
            )
        self._show_busy(result.busy)
        self.note.setText("\n".join(lines))
        self._wizard.offer_apply(result.best is not None and result.busy is None)
        self._show_speed_of_light(result)

    def _show_busy(self, busy: str | None) -> None:
        self.busy.setVisible(busy is not None)
        if busy is not None:
            self.busy.setText(f"{busy_text(busy)} Nothing from this run is stored as a default.")

    def _show_speed_of_light(self, result: TuneResult) -> None:
        """The pick's measured speed against this machine's limit, the figure `hearthside
        bench` gives for the same run; worked out off the GUI thread (it reads the model
        file). Nothing is shown when no limit is known."""
        self.speed.hide()
        profile = self._wizard.found_profile()

        def find() -> SpeedOfLight | None:
            return tuned_speed_of_light(result, profile)

        def show(reading: SpeedOfLight | None) -> None:
            if reading is None or self._wizard.tune_result is not result:
                return  # no limit known, or another run's result is shown now
            self.speed.setText(speed_of_light_line(reading))
            self.speed.setToolTip(reading.tooltip())
            self.speed.show()

        run_in_background(find, show, lambda _error: None)

    def show_plan(self, planned: Plan) -> None:
        self.plan = planned
        choice = self._wizard.choice
        name = choice.name if choice else planned.model
        self.headline.setText(f"{name}: about {planned.speed.decode_tps:.1f} tok/s here")
        used = sum(device.used_bytes for device in planned.devices)
        self.subline.setText(
            f"An estimate ({planned.confidence}): it needs about {format_bytes(used)}, "
            f"{'fits' if planned.fits else 'does not fit'} in memory, and answers the first "
            f"{TUNING_CONTEXT}-token prompt in about {planned.speed.ttft_s:.1f} s."
        )
        defaults = llama_cpp_defaults(
            planned.config.model_path, self._wizard.found_profile(), planned.config.n_ctx
        ).to_dict()
        self._fill_table(settings_rows(planned.config.to_dict(), defaults))
        self.reasons.setText(_reasons_html(planned.reasons))
        self.note.setText(
            "This model is not installed, so nothing was measured. Download it from the Models "
            "page, then run this wizard again to measure it."
        )
        self.models_button.show()
        self._wizard.offer_apply(False)

    def show_error(self, error: BaseException) -> None:
        self._clear("No plan")
        self.subline.setText(describe_error(error))

    def _fill_table(self, rows: Sequence[SettingRow]) -> None:
        self.table.setRowCount(len(rows))
        bold = QFont(self.font())
        bold.setBold(True)
        for index, row in enumerate(rows):
            for column, text in enumerate((row.name, row.default, row.chosen)):
                item = QTableWidgetItem(text)
                if row.changed and column == 2:
                    item.setFont(bold)
                    item.setText(f"{text}  ●")
                self.table.setItem(index, column, item)
        self.table.resizeRowsToContents()
        height = self.table.horizontalHeader().height() + 2 * self.table.frameWidth()
        height += sum(self.table.rowHeight(row) for row in range(len(rows)))
        self.table.setFixedHeight(height)

    def _open_models_page(self) -> None:
        self._wizard.models_page_requested.emit()
        self._wizard.reject()

    def validatePage(self) -> bool:  # noqa: N802 (Qt's name): Finish
        return self._wizard.apply()

    def isComplete(self) -> bool:  # noqa: N802 (Qt's name): no second Apply while saving
        return not self._wizard.applying

    def show_applying(self, applying: bool) -> None:
        """While Apply saves: a busy bar, and no way to leave the page half-saved."""
        self.applying_bar.setVisible(applying)
        if applying:
            self.error.hide()
            self.note.setText("Saving the settings…")
        self.completeChanged.emit()  # first: the wizard then resets Back, which comes next
        for button in (QWizard.WizardButton.BackButton, QWizard.WizardButton.CancelButton):
            self._wizard.button(button).setEnabled(not applying)

    def show_apply_failure(self, error: BaseException) -> None:
        self.note.setText("")
        self.error.setText(
            f"Could not save the settings. {describe_error(error)} Press Apply to retry."
        )
        self.error.show()


def speed_of_light_line(reading: SpeedOfLight) -> str:
    """ "With these settings it wrote 62 tok/s: 81% of this machine's limit." """
    line = f"With these settings it wrote {reading.measured_tps:.0f} tok/s: {reading.summary}."
    if reading.cause:
        line += f"\nWhy it is slower: {reading.cause}\nWhat to do: {reading.fix}"
    return line


# What each of the planner's setting names means to a person; names not here are shown as
# they are. "recipe" names a curated prior by its id: the other rows say what it set.
SETTING_WORDS = {
    "n_gpu_layers": "Layers on the graphics processor",
    "n_ctx": "Context",
    "type_k/type_v": "Conversation memory (KV cache)",
    "type_k": "Conversation memory (KV cache)",
    "flash_attn": "Flash attention",
    "n_parallel": "Parallel requests",
    "n_threads": "Threads writing the answer",
    "n_threads_batch": "Threads reading the prompt",
    "n_ubatch": "Prompt chunk",
    "use_mmap": "Reading the model file",
    "decode": "Writing speed",
    "weight costs": "Speed figures",
    "experts": "Experts",
}
HIDDEN_SETTINGS = {"recipe"}
# The planner words these for the terminal (a command that measures); the window has a button.
WINDOW_WHY = {
    "weight costs": "The speeds of weight types this machine has not measured are estimated "
    "from similar types; measuring this model (Optimize) measures them too.",
}
VALUE_WORDS = {
    ("n_gpu_layers", "0"): "none: the processor does all the work",
    ("n_gpu_layers", "all"): "all of them",
    ("type_k/type_v", "f16"): "full precision (f16)",
    ("type_k/type_v", "q8_0"): "8-bit (q8_0): half the memory, about the same quality",
    ("type_k/type_v", "q4_0"): "4-bit (q4_0): a quarter of the memory, some quality lost",
}


def plain_reason(reason: Reason) -> tuple[str, str, str] | None:
    """(what, value, why) in a person's words; None for the planner's internal rows."""
    if reason.setting in HIDDEN_SETTINGS:
        return None
    what = SETTING_WORDS.get(reason.setting, reason.setting)
    value = VALUE_WORDS.get((reason.setting, reason.value), reason.value)
    if reason.setting == "n_ctx" and reason.value.isdigit():
        value = f"{reason.value} tokens"
    return what, value, WINDOW_WHY.get(reason.setting, reason.why)


def _reasons_html(reasons: Sequence[Reason]) -> str:
    plain = [shown for shown in map(plain_reason, reasons) if shown is not None]
    items = "".join(
        f"<li><b>{html.escape(what)}: {html.escape(value)}</b>. {html.escape(why)}</li>"
        for what, value, why in plain
    )
    return f"<b>Why</b><ul style='margin-left:-20px'>{items}</ul>" if items else ""


def applied_text(tuning: AppliedTuning) -> str:
    """The window's confirmation after Apply: what changed, and what it measured."""
    config = tuning.config
    threads = config.n_threads
    parts = [f"{threads} thread{'' if threads == 1 else 's'}" if threads else "one thread per core"]
    parts.append(f"flash attention {'on' if config.flash_attn else 'off'}")
    if config.type_k != "f16":
        parts.append(f"a {config.type_k} conversation memory")
    gain = (
        f": {tuning.speedup:.1f}× faster than llama.cpp's own settings, measured here"
        if tuning.speedup is not None and tuning.speedup >= 1.05
        else ": as fast as llama.cpp's own settings, measured here"
        if tuning.speedup is not None
        else ""
    )
    return (
        f"{tuning.model_name} now runs with {', '.join(parts)}{gain}. "
        "Reloading it with these settings…"
    )


# ---- the wizard ------------------------------------------------------------------------------


class OptimizeWizard(QWizard):
    """The four pages; `applied` carries the settings to reload the chat engine with."""

    applied = Signal(object)  # AppliedTuning
    models_page_requested = Signal()
    # a calibration or the tuner's runs were stored: this machine's figures changed (the
    # window reads its MachineContext again, Apply or not)
    measured = Signal()

    def __init__(
        self,
        service: EngineService | None,
        profile: ProfileSource = None,
        parent: QWidget | None = None,
        *,
        current_model_id: str | None = None,
        runner: Runner | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Optimize for my hardware")
        self.setWizardStyle(QWizard.WizardStyle.ModernStyle)
        self.setOption(QWizard.WizardOption.NoBackButtonOnStartPage, True)
        self.setMinimumSize(920, 660)
        self.setStyleSheet(STYLE)
        self.profile_source = profile
        self.current_model_id = current_model_id
        self.runner = runner or ServiceTuneRunner(service, self)
        self.runner.update.connect(self._on_update)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self.found: MachineContext | None = None
        self.choices: list[ModelChoice] | None = None
        self.choice: ModelChoice | None = None
        self.costs: TuneCosts | None = None  # the chosen model's, for the goal page's wait
        self._costs_asked: object = None
        self.tune_result: TuneResult | None = None
        self.applied_tuning: AppliedTuning | None = None
        self.applying = False  # Apply is saving on a worker thread
        self._apply_saved = False
        self._surveying = False
        self._close_when_stopped = False
        self.found_page = FoundPage(self)
        self.goal_page = GoalPage(self)
        self.measure_page = MeasurePage(self)
        self.result_page = ResultPage(self)
        for page_id, page in enumerate(
            (self.found_page, self.goal_page, self.measure_page, self.result_page)
        ):
            self.setPage(page_id, page)
        self.setButtonText(QWizard.WizardButton.CancelButton, "Close")
        self.currentIdChanged.connect(self._restore_close_button)

    # ---- what the pages ask for ----------------------------------------------------------

    @property
    def calibrate_first(self) -> bool:
        return self.found_page.calibrate_box.isChecked() and self.found is not None

    @property
    def budget_s(self) -> float:
        return float(self.goal_page.budget.value())

    @property
    def stated_wait_s(self) -> float:
        """The whole wait the goal page said: a calibration first, then the budget."""
        return self.budget_s + (CALIBRATION_BUDGET_S if self.calibrate_first else 0.0)

    def start_survey(self) -> None:
        if self.found is not None or self._surveying:
            return
        source = self.profile_source
        if isinstance(source, MachineContext):  # the window's: read once, passed down
            self.show_survey(source)
            return
        self._surveying = True
        run_in_background(
            lambda: machine_context(_profile_from(source)), self.show_survey, self._survey_failed
        )

    def show_survey(self, found: MachineContext) -> None:
        self._surveying = False
        self.found = found
        self.found_page.show_survey(found)

    def _survey_failed(self, error: BaseException) -> None:
        self._surveying = False
        self.found_page.show_error(error)

    def load_choices(self) -> None:
        found = self.found
        if found is None:
            return
        run_in_background(
            lambda: model_choices(found.profile, found.calibration),
            self.show_choices,
            lambda error: self.goal_page.model_note.setText(describe_error(error)),
        )

    def show_choices(self, choices: Sequence[ModelChoice]) -> None:
        self.choices = list(choices)
        self.goal_page.show_choices(choices, self.current_model_id)
        self.refresh_wait()

    def refresh_wait(self) -> None:
        """Work out (off the GUI thread) what tuning the chosen model costs here, then say
        on the goal page how long the budget makes a person wait and what it measures."""
        choice, found = self.goal_page.choice(), self.found
        self.costs = None
        self.goal_page.show_wait()
        if choice is None or choice.path is None or found is None:
            return
        asked = (choice.path, self.goal_page.goal(), self.calibrate_first)
        self._costs_asked = asked
        run_in_background(
            lambda: tune_costs(asked[0], found.profile, asked[1], calibrate_first=asked[2]),
            lambda costs: self._show_costs(asked, costs),
            lambda _error: None,  # no estimate: the page just says nothing of the wait
        )

    def _show_costs(self, asked: object, costs: TuneCosts) -> None:
        if asked != self._costs_asked:  # the choice changed meanwhile
            return
        self.costs = costs
        self.goal_page.show_wait()

    def start_measuring(self) -> None:
        choice = self.goal_page.choice()
        assert self.found is not None and choice is not None
        self.choice = choice
        self.tune_result = None
        request = MeasureRequest(
            model_path=choice.path,
            profile=self.found.profile,
            goal=self.goal_page.goal(),
            budget_s=self.budget_s,
            calibrate=self.calibrate_first,
        )
        self.runner.start(request)

    def plan_catalog_model(self) -> None:
        choice = self.goal_page.choice()
        self.choice = choice
        assert choice is not None
        goal = self.goal_page.goal()
        profile = self.found_profile()
        run_in_background(
            # read again: a calibration just now (this run's) changed the figures
            lambda: plan_for_catalog(choice, machine_context(profile), goal),
            self.result_page.show_plan,
            self.result_page.show_error,
        )

    def found_profile(self) -> HardwareProfile:
        assert self.found is not None
        return self.found.profile

    # ---- runner events -------------------------------------------------------------------

    def _on_update(self, update: MeasureUpdate) -> None:
        self.measure_page.show_update(update)
        if update.kind == "calibrated":
            self.measured.emit()

    def _on_finished(self, result: TuneResult | None) -> None:
        self.tune_result = result
        self.measure_page.show_result(result)
        if result is not None:
            self.measured.emit()
        self._close_if_asked()

    def _on_failed(self, error: BaseException) -> None:
        self.measure_page.show_failure(error)
        self._close_if_asked()

    def _close_if_asked(self) -> None:
        if self._close_when_stopped:
            self._close_when_stopped = False
            super().reject()

    # ---- closing -------------------------------------------------------------------------

    def cancel_measuring(self) -> None:
        """Ask a running measurement to stop (after its current candidate)."""
        if self.runner.running:
            self.measure_page.stop()

    def reject(self) -> None:
        """Close; a running measurement is stopped first, and the wizard closes once it has.
        While Apply saves, Esc waits for it: the page closes itself when it is saved."""
        if self.applying:
            return
        if self.runner.started:
            self._close_when_stopped = True
            self.measure_page.stop()
            return
        self.runner.cancel()  # still waiting in the engine's queue: it will never start
        super().reject()

    def offer_apply(self, can_apply: bool) -> None:
        """The last page's buttons: Apply + "Close without applying", or just Close."""
        self.setButtonText(QWizard.WizardButton.FinishButton, "Apply" if can_apply else "Close")
        self.setButtonText(
            QWizard.WizardButton.CancelButton, "Close without applying" if can_apply else "Close"
        )
        self.setOption(QWizard.WizardOption.NoCancelButtonOnLastPage, not can_apply)

    def _restore_close_button(self, page_id: int) -> None:
        if page_id != PAGE_RESULT:
            self.setButtonText(QWizard.WizardButton.CancelButton, "Close")

    def apply(self) -> bool:
        """Finish: start saving the winner (off the GUI thread) and keep the page; once it is
        saved, `_applied` closes the wizard, and this says yes."""
        result, choice = self.tune_result, self.choice
        if self._apply_saved:
            return True
        if result is None or result.best is None or choice is None or choice.path is None:
            return True  # nothing to apply: Finish just closes
        if result.busy is not None:
            return True  # other programs were busy: nothing from this run is stored
        if not self.applying:
            self.applying = True
            self.result_page.show_applying(True)
            run_in_background(lambda: apply_tuning(result), self._applied, self._apply_failed)
        return False

    def _applied(self, _saved: None) -> None:
        result, choice = self.tune_result, self.choice
        assert result is not None and result.best is not None
        assert choice is not None and choice.path is not None
        self.applying = False
        self.result_page.show_applying(False)
        self.applied_tuning = applied_tuning(result, choice)
        self.applied.emit(self.applied_tuning)
        self._apply_saved = True
        self.accept()  # validates the page again: apply() now says yes

    def _apply_failed(self, error: BaseException) -> None:
        self.applying = False
        self.result_page.show_applying(False)
        self.result_page.show_apply_failure(error)


def _profile_from(source: ProfileSource) -> HardwareProfile:
    if isinstance(source, MachineContext):
        return source.profile
    if isinstance(source, HardwareProfile):
        return source
    if source is not None:
        return source()
    return probe_in_subprocess(models_dir(data_dir()))


__all__ = [
    "AppliedTuning",
    "MeasureRequest",
    "MeasureUpdate",
    "ModelChoice",
    "OptimizeWizard",
    "RunnerSignals",
    "ServiceTuneRunner",
    "TuneRunner",
    "measure",
    "model_choices",
    "settings_rows",
    "verdict",
]
