"""The Plan page: how a model would run on this computer, before it is loaded.

For the chosen model (an installed one, or a catalog id as a what-if) and goal it shows the
planner's settings with one reason each, memory per device as stacked bars, predicted speed
beside the speed the autotune database measured, the runners-up and the advice. "Load with
this plan" hands the EngineConfig to the window; manual overrides are checked by the planner's
own `evaluate_config`, so a power user sees at once whether their settings fit.

The hardware is this machine or a what-if spec (the shipped examples, or a JSON spec the user
opens). A what-if with one GPU gets the normal plan for that hardware ("Load" stays off); one
with several GPUs or nodes gets the recipe view (recipe_view.py): vLLM or llama-server commands,
memory per GPU, reasons and advice.

Resolving the model (reading its GGUF header), calibration and wisdom lookups, the plan and
the recipe run on a worker thread (`compute_plan`, `compute_recipe`). This machine — its
profile and calibration figures — is the `MachineContext` of `machine` (the window's
`MachineState`, shared with the Hardware page, or the page's own); the page probes (once, in a
child process) only when it holds none and plans for this machine. Each new context (a
calibration, a tuning run, Apply) plans again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QIcon, QImage, QPainter, QPixmap, QShowEvent
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.labels import make_label
from hearthside.app.gui.machine_state import MachineState
from hearthside.app.gui.memory_bar import DeviceMemoryView
from hearthside.app.gui.plan_content import (
    GOAL_NAMES,
    HARDWARE_EXAMPLES,
    THIS_MACHINE,
    Engine,
    OverrideResult,
    PlanRequest,
    PlanView,
    RecipeOutcome,
    RecipeRequest,
    alternative_text,
    check_override,
    compute_plan,
    compute_recipe,
    confidence_text,
    default_probe,
    example_choice,
    load_hardware,
    measured_note,
    needs_recipe,
    override_summary,
    quality_note,
    setting_rows,
    speculation_rows,
    speed_rows,
    verdict,
)
from hearthside.app.gui.recipe_view import RecipeView, clear_layout, make_card
from hearthside.app.gui.workers import BackgroundTask, run_in_background
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.planner import (
    DEFAULT_FREE_MARGIN_BYTES,
    KV_CHOICES,
    Goal,
    Plan,
    decode_bound_text,
    describe_machine,
)
from hearthside.autotune.serving import describe_cluster
from hearthside.core.engine.config import MAX_PARALLEL, EngineConfig
from hearthside.core.errors import HearthsideError, describe_error
from hearthside.core.models.catalog import catalog_entry, catalog_ids
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import ClusterSpec
from hearthside.core.units import GIB

if TYPE_CHECKING:
    from hearthside.autotune.tuner import StoredSpeculation

KEEP_FREE_KEY = "plan/keep_free_gb"
WHAT_IF_PREFIX = "What if: "
WHAT_IF_NOTE = "A what-if: there is no file to load. Add or download one on the Models page."
WHAT_IF_HARDWARE_NOTE = "A plan for what-if hardware: there is nothing to load on this computer."
HARDWARE_WHAT_IF_PREFIX = "What if: "
OPEN_SPEC = "open-spec"  # the hardware list's "Open a hardware spec…" entry
KEEP_FREE_TIP = "Memory the plan leaves for your other programs."
RECIPE_IGNORES_TIP = "A serving recipe plans for a dedicated server: it uses the GPUs whole."
LOCAL_SUBTITLE = "How a model would run on this computer, before it loads."
MAX_OVERRIDE_CONTEXT = 10_000_000
PARALLEL_TIP = (
    "Requests answered at once (this window and API clients), each with its own context: the "
    "KV cache is that many times one request's. Automatic: the planner's choice, up to 4 "
    "where memory allows."
)
REPLAN_DELAY_MS = 400  # spin boxes re-plan once the user stops typing
PLAN_ICON_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" fill="none"
 stroke="currentColor" stroke-width="2" stroke-linecap="round" stroke-linejoin="round">
 <rect x="3" y="5" width="18" height="5" rx="1.5"/><path d="M9 5 V10 M14 5 V10"/>
 <rect x="3" y="14" width="18" height="5" rx="1.5"/><path d="M12 14 V19"/></svg>"""

STYLE = """
QFrame#card { background: palette(base); border: 1px solid palette(midlight);
              border-radius: 8px; }
QLabel#cardTitle { font-weight: 600; }
QLabel#pageTitle { font-size: 16pt; font-weight: 600; }
QLabel#muted { color: gray; }
QLabel#problem { color: #c62828; }
QLabel#good { color: #2e7d32; }
QLabel#settingName { font-weight: 600; }
QLabel#bigNumber { font-size: 13pt; font-weight: 600; }
QLabel#verdict { border-radius: 6px; padding: 4px 10px; font-weight: 600; color: #1f2328; }
QLabel#verdict[kind="fits"] { background: #dff3e4; border: 1px solid #9fd3ad; }
QLabel#verdict[kind="streams"] { background: #fff4e0; border: 1px solid #f0c68a; }
QLabel#verdict[kind="no"] { background: #fde8e8; border: 1px solid #f5b5b5; }
QFrame#advice { background: #fff8e1; border: 1px solid #ffe082; border-radius: 6px; }
QFrame#advice QLabel { color: #3e2f00; }
QFrame#errorBox { background: #fde8e8; border: 1px solid #f5b5b5; border-radius: 6px; }
QFrame#errorBox QLabel { color: #1f2328; }
QToolButton#overridesToggle { border: none; font-weight: 600; padding: 2px 0; }
"""


def plan_icon(color: str) -> QIcon:
    renderer = QSvgRenderer(QByteArray(PLAN_ICON_SVG.replace("currentColor", color).encode()))
    result = QIcon()
    for size in (16, 24, 32, 48):
        image = QImage(QSize(size, size), QImage.Format.Format_ARGB32_Premultiplied)
        image.fill(Qt.GlobalColor.transparent)
        painter = QPainter(image)
        renderer.render(painter)
        painter.end()
        result.addPixmap(QPixmap.fromImage(image))
    return result


# ---- small widgets ---------------------------------------------------------------------------


_label = make_label
_card = make_card
_clear = clear_layout


def _labelled_row(pairs: tuple[tuple[str, QWidget], ...]) -> QHBoxLayout:
    row = QHBoxLayout()
    row.setSpacing(8)
    for text, widget in pairs:
        label = QLabel(text)
        label.setBuddy(widget)
        row.addWidget(label)
        row.addWidget(widget)
        row.addSpacing(8)
    row.addStretch(1)
    return row


# ---- the page --------------------------------------------------------------------------------


class PlanPage(QWidget):
    load_requested = Signal(object)  # EngineConfig; its model_path names the model (id or path)
    plan_ready = Signal(object)  # PlanView
    recipe_ready = Signal(object)  # RecipeOutcome
    plan_failed = Signal(object)  # Exception

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        settings: QSettings | None = None,
        probe: Callable[[], HardwareProfile] | None = None,
        machine: MachineState | None = None,
    ) -> None:
        super().__init__(parent)
        self.settings = settings
        self._probe = probe or default_probe(None)
        self.machine = machine if machine is not None else MachineState(self)
        self.machine.changed.connect(self.set_context)
        self.machine.failed.connect(self._context_failed)
        self.profile: HardwareProfile | None = None
        self.context: MachineContext | None = None
        self.view: PlanView | None = None
        self.recipe: RecipeOutcome | None = None
        self.cluster: ClusterSpec | None = None  # what-if hardware; None: this machine
        self.engine: Engine = "vllm"
        self.checkpoint: str | None = None  # the recipe's checkpoint, when the user gave one
        self._hardware_index = 0  # the last hardware choice that loaded
        self.override: OverrideResult | None = None
        self.overrides_active = False
        self.error_text = ""
        self._loaded_ref: str | None = None
        self._task: BackgroundTask[PlanView] | BackgroundTask[RecipeOutcome] | None = None
        self._probe_task: BackgroundTask[HardwareProfile] | None = None
        self._wanted = False  # a plan was asked for while busy or without a profile
        self._outdated = False  # measurements changed since the shown plan was made
        self._replan_timer = QTimer(self)
        self._replan_timer.setSingleShot(True)
        self._replan_timer.setInterval(REPLAN_DELAY_MS)
        self._replan_timer.timeout.connect(self.request_plan)
        self._build()
        self.reload_models()

    # -- inputs --

    def set_context(self, context: MachineContext) -> None:
        """This machine as it is now (its profile and calibration figures): plan again now when
        the page shows, else the next time it does."""
        self.context = context
        if context.profile is not self.profile:
            self._set_profile(context.profile)
        else:
            self.measurements_changed()

    def _set_profile(self, profile: HardwareProfile) -> None:
        """The machine to plan for; re-plans a visible page."""
        self.profile = profile
        self._update_override_limits()
        if self.cluster is None and (self._wanted or self.isVisible()):
            self.request_plan()

    def measurements_changed(self) -> None:
        """A new calibration or tuning result: plan again now when the page shows, else the
        next time it does (its shown plan is out of date either way)."""
        self._outdated = True
        if self.isVisible() and not self.busy:
            self.request_plan()

    def set_loaded_model(self, ref: str | None) -> None:
        """The model the window has loaded (an id or a path): the page's default choice."""
        self._loaded_ref = ref
        if ref is not None and self.model_box.findData(ref) < 0:
            self.model_box.insertItem(0, Path(ref).stem, ref)
        if self.view is None and ref is not None:
            self.select_model(ref)

    def reload_models(self) -> None:
        """Fill the model list: installed models, then the catalog's as what-ifs."""
        current = self.current_ref()
        self.model_box.blockSignals(True)
        self.model_box.clear()
        default_id = None
        try:
            with ModelStore(data_dir()) as store:
                records = store.list()
                default = store.default()
                default_id = default.id if default else None
        except HearthsideError as exc:
            records = []
            self._show_error(exc)
        for record in records:
            suffix = " (default)" if record.id == default_id else ""
            self.model_box.addItem(f"{record.name}{suffix}", record.id)
        if self._loaded_ref is not None and self.model_box.findData(self._loaded_ref) < 0:
            self.model_box.insertItem(0, Path(self._loaded_ref).stem, self._loaded_ref)
        if self.model_box.count():
            self.model_box.insertSeparator(self.model_box.count())
        for model_id in catalog_ids():
            self.model_box.addItem(WHAT_IF_PREFIX + catalog_entry(model_id).name, model_id)
        self.model_box.blockSignals(False)
        preferred = current or self._loaded_ref or default_id
        self.select_model(preferred or "", quiet=True)

    def select_model(self, ref: str, *, quiet: bool = False) -> bool:
        index = self.model_box.findData(ref)
        if index < 0:
            return False
        if quiet:
            self.model_box.blockSignals(True)
        self.model_box.setCurrentIndex(index)
        self.model_box.blockSignals(False)
        return True

    def set_goal(self, goal: Goal) -> None:
        self.goal_box.setCurrentIndex(self.goal_box.findData(goal))

    def current_ref(self) -> str | None:
        data = self.model_box.currentData()
        return str(data) if data else None

    def current_hardware(self) -> str:
        data = self.hardware_box.currentData()
        return str(data) if data and data != OPEN_SPEC else THIS_MACHINE

    def current_request(self) -> PlanRequest | None:
        ref = self.current_ref()
        if ref is None:
            return None
        n_ctx = self.context_box.value() or None
        margin = int(self.keep_free_box.value() * GIB)
        n_parallel = self.parallel_box.value() or None
        return PlanRequest(
            ref, self.goal_box.currentData(), n_ctx, margin, self.current_hardware(), n_parallel
        )

    def current_recipe_request(self) -> RecipeRequest | None:
        ref = self.current_ref()
        if ref is None:
            return None
        n_ctx = self.context_box.value() or None
        return RecipeRequest(ref, self.current_hardware(), self.engine, self.checkpoint, n_ctx)

    def current_key(self) -> PlanRequest | RecipeRequest | None:
        """What the page should show now: a recipe for what-if hardware with several GPUs or
        nodes, else a plan."""
        return self.current_recipe_request() if self.recipe_mode else self.current_request()

    def _shown_key(self) -> PlanRequest | RecipeRequest | None:
        if self.recipe_mode:
            return self.recipe.request if self.recipe else None
        return self.view.request if self.view else None

    @property
    def recipe_mode(self) -> bool:
        return self.cluster is not None and needs_recipe(self.cluster)

    def planning_profile(self) -> HardwareProfile | None:
        """The hardware plans are made for: the what-if spec's node, or this machine."""
        return self.cluster.node if self.cluster is not None else self.profile

    # -- hardware --

    def set_hardware(self, choice: str) -> bool:
        """Choose THIS_MACHINE, `example_choice(filename)` or an opened spec's path."""
        index = self.hardware_box.findData(choice)
        if index < 0:
            return False
        self.hardware_box.setCurrentIndex(index)
        return True

    def open_hardware_spec(self, path: Path | str) -> bool:
        """Load a what-if hardware spec file and choose it; False (with the error shown) when
        it is not a valid spec."""
        choice = str(Path(path))
        if self.hardware_box.findData(choice) < 0:
            try:
                cluster = load_hardware(choice)
            except HearthsideError as exc:
                self._show_error(exc, prefix="That hardware spec cannot be used: ")
                self.hardware_box.setCurrentIndex(self._hardware_index)
                return False
            assert cluster is not None
            name = HARDWARE_WHAT_IF_PREFIX + (cluster.name or Path(path).stem)
            self.hardware_box.insertItem(self.hardware_box.count() - 1, name, choice)
        return self.set_hardware(choice)

    def _hardware_changed(self, index: int) -> None:
        choice = self.hardware_box.itemData(index)
        if choice == OPEN_SPEC:
            self._ask_for_spec()
            return
        try:
            cluster = load_hardware(str(choice or THIS_MACHINE))
        except HearthsideError as exc:
            self._show_error(exc, prefix="That hardware spec cannot be used: ")
            self.hardware_box.setCurrentIndex(self._hardware_index)
            return
        self._hardware_index = index
        self.cluster = cluster
        self.checkpoint = None
        self._update_mode()
        self._choice_changed()

    def _ask_for_spec(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open a hardware spec", "", "Hardware spec (*.json);;All files (*)"
        )
        if path:
            self.open_hardware_spec(path)
        else:
            self.hardware_box.setCurrentIndex(self._hardware_index)

    def _update_mode(self) -> None:
        recipe = self.recipe_mode
        self.content_stack.setCurrentWidget(self.recipe_scroll if recipe else self.scroll_area)
        for box, tip in ((self.goal_box, ""), (self.keep_free_box, KEEP_FREE_TIP)):
            box.setEnabled(not recipe)
            box.setToolTip(RECIPE_IGNORES_TIP if recipe else tip)
        if self.cluster is None:
            self.subtitle.setText(LOCAL_SUBTITLE)
        else:
            self.subtitle.setText(
                f"What if you ran it on {describe_cluster(self.cluster)}? "
                "Nothing here is loaded on this computer."
            )
        self._update_override_limits()
        self._update_load_button()

    # -- recipe inputs --

    def set_engine(self, engine: Engine) -> None:
        self.recipe_view.set_engine(engine)

    def _engine_changed(self, engine: str) -> None:
        self.engine = "llama-server" if engine == "llama-server" else "vllm"
        self._choice_changed()

    def _checkpoint_chosen(self, repo: str) -> None:
        self.checkpoint = repo or None
        self._choice_changed()

    def _model_changed(self) -> None:
        self.checkpoint = None
        self._choice_changed()

    # -- planning --

    def request_plan(self) -> None:
        """Plan the current choice off the GUI thread (probing first if there is no profile)."""
        self._replan_timer.stop()
        request = self.current_key()
        if request is None:
            self._show_error(HearthsideError("Choose a model to plan for."))
            return
        profile = self.planning_profile()
        if profile is None:
            self._wanted = True
            if self.machine.profile is None:  # else its context is on its way: plan then
                self._start_probe()
            return
        if self._task is not None:
            self._wanted = True
            return
        self._wanted = False
        if isinstance(request, RecipeRequest):
            self._start_recipe(request)
            return
        self._set_busy(True, "Planning…")
        self._outdated = False
        # this machine's figures, as read once for the window; None: read with the plan
        calibration = self.context.calibration if self.context is not None else None
        self._task = run_in_background(
            lambda: compute_plan(request, profile, calibration), self._planned, self._plan_failed
        )

    def _start_recipe(self, request: RecipeRequest) -> None:
        cluster = self.cluster
        assert cluster is not None
        self._set_busy(True, "Planning the recipe…")
        self._task = run_in_background(
            lambda: compute_recipe(request, cluster), self._recipe_done, self._plan_failed
        )

    @property
    def busy(self) -> bool:
        return self._task is not None or self._probe_task is not None

    def _start_probe(self) -> None:
        if self._probe_task is not None:
            return
        self._set_busy(True, "Looking at this computer…")
        self._probe_task = run_in_background(self._probe, self._probed, self._probe_failed)

    def _probed(self, profile: HardwareProfile) -> None:
        """The page's own probe: the machine's context is read for it, and planned with."""
        self._probe_task = None
        self._set_busy(False)
        self.machine.set_profile(profile)

    def _context_failed(self, error: BaseException) -> None:
        """This machine's calibration could not be read: plan with what the plan reads."""
        profile = self.machine.profile
        if profile is not None and profile is not self.profile:
            self._set_profile(profile)

    def _probe_failed(self, error: BaseException) -> None:
        self._probe_task = None
        self._wanted = False
        self._set_busy(False)
        self._show_error(error, prefix="The hardware probe failed; there is nothing to plan for. ")

    def _planned(self, view: PlanView) -> None:
        self._task = None
        self._set_busy(False)
        if self._wanted and self.current_key() != view.request:
            self.request_plan()
            return
        self._wanted = False
        self.show_view(view)
        self.plan_ready.emit(view)

    def _recipe_done(self, outcome: RecipeOutcome) -> None:
        self._task = None
        self._set_busy(False)
        if self._wanted and self.current_key() != outcome.request:
            self.request_plan()
            return
        self._wanted = False
        self.show_recipe(outcome)
        self.recipe_ready.emit(outcome)

    def _plan_failed(self, error: BaseException) -> None:
        self._task = None
        self._set_busy(False)
        if self._wanted:
            self.request_plan()
            return
        self.view = None
        self.recipe = None
        self.load_button.setEnabled(False)
        self._show_error(error, prefix="No plan: ")
        self.plan_failed.emit(error)

    def _set_busy(self, busy: bool, text: str = "") -> None:
        self.spinner.setVisible(busy)
        self.status.setText(text)
        self.replan_button.setEnabled(not busy)

    def _schedule_replan(self) -> None:
        if self.isVisible():
            self._replan_timer.start()

    def _choice_changed(self) -> None:
        if self.isVisible():
            self.request_plan()

    def _keep_free_changed(self, value: float) -> None:
        if self.settings is not None:
            self.settings.setValue(KEEP_FREE_KEY, value)
        self._schedule_replan()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        stale = self._shown_key() is None or self._shown_key() != self.current_key()
        if (stale or self._outdated) and not self.busy:
            self.request_plan()

    # -- showing --

    def show_view(self, view: PlanView) -> None:
        self.view = view
        self.error_text = ""
        self.error_box.hide()
        plan_ = view.plan
        kind, sentence = verdict(plan_)
        self.verdict_label.setText(sentence)
        self.verdict_label.setProperty("kind", kind)
        self.verdict_label.style().unpolish(self.verdict_label)
        self.verdict_label.style().polish(self.verdict_label)
        self.model_title.setText(f"{plan_.model} · goal: {GOAL_NAMES[plan_.goal].lower()}")
        self.confidence_label.setText(confidence_text(view))
        self._show_memory(plan_)
        self._show_speed(view)
        self._show_settings(plan_, view.speculation)
        self._show_alternatives(plan_)
        self._show_advice(plan_)
        self._fill_overrides(view)
        self._update_load_button()

    def show_recipe(self, outcome: RecipeOutcome) -> None:
        self.recipe = outcome
        self.error_text = ""
        self.error_box.hide()
        gpus = self.cluster.node.gpus if self.cluster is not None else ()
        self.recipe_view.show_outcome(outcome, gpus[0].name if gpus else "GPU")

    def _show_memory(self, plan_: Plan) -> None:
        _clear(self.memory_layout)
        self.memory_views: list[DeviceMemoryView] = [DeviceMemoryView(d) for d in plan_.devices]
        for view in self.memory_views:
            self.memory_layout.addWidget(view)

    def _show_speed(self, view: PlanView) -> None:
        _clear(self.speed_grid)
        for column, heading in enumerate(("", "Predicted", "Measured")):
            self.speed_grid.addWidget(_label(heading, "muted", wrap=False), 0, column)
        self.speed_labels: dict[str, tuple[QLabel, QLabel]] = {}
        rows = speed_rows(view.plan.speed, view.measured)
        for row, (what, predicted, measured) in enumerate(rows):
            predicted_label = _label(predicted, "bigNumber", wrap=False)
            measured_label = _label(measured, "bigNumber", wrap=False)
            self.speed_grid.addWidget(_label(what, wrap=False), row + 1, 0)
            self.speed_grid.addWidget(predicted_label, row + 1, 1)
            self.speed_grid.addWidget(measured_label, row + 1, 2)
            self.speed_labels[what] = (predicted_label, measured_label)
        self.speed_grid.setColumnStretch(1, 1)
        self.speed_grid.setColumnStretch(2, 1)
        bound = decode_bound_text(view.plan)
        self.speed_note.setText(
            (bound + " " if bound else "")
            + "First token: after a 512-token prompt. "
            + measured_note(view)
            + " "
            + quality_note(view)
        )

    def _show_settings(self, plan_: Plan, speculation: Sequence[StoredSpeculation]) -> None:
        _clear(self.settings_grid)
        self.setting_labels: dict[str, tuple[QLabel, QLabel]] = {}
        rows = setting_rows(plan_) + speculation_rows(speculation) if plan_.reasons else []
        for row, setting in enumerate(rows):
            value = _label(setting.value, wrap=False)
            why = _label(setting.why)
            name = _label(setting.name, "settingName", wrap=False)
            for column, label in enumerate((name, value, why)):
                self.settings_grid.addWidget(label, row, column, Qt.AlignmentFlag.AlignTop)
            self.setting_labels[setting.name] = (value, why)
        if not rows:
            self.settings_grid.addWidget(
                _label("No settings to explain: nothing fits. See the advice below.", "muted"),
                0,
                0,
                1,
                3,
            )
        self.settings_grid.setColumnStretch(2, 1)

    def _show_alternatives(self, plan_: Plan) -> None:
        _clear(self.alternatives_layout)
        texts = [alternative_text(summary) for summary in plan_.alternatives]
        for text in texts or ["No other settings fit."]:
            self.alternatives_layout.addWidget(_label("• " + text if texts else text))

    def _show_advice(self, plan_: Plan) -> None:
        _clear(self.advice_layout)
        self.advice_card.setVisible(bool(plan_.advice))
        for line in plan_.advice:
            item = QFrame()
            item.setObjectName("advice")
            row = QHBoxLayout(item)
            row.setContentsMargins(12, 8, 12, 8)
            row.addWidget(_label(line))
            self.advice_layout.addWidget(item)

    def _update_load_button(self) -> None:
        view = self.view
        button = self.load_button
        using_override = self.overrides_active and self.override is not None
        button.setText("Load with these settings" if using_override else "Load with this plan")
        if view is None:
            enabled, why_not = False, "Plan a model first."
        elif self.cluster is not None:
            enabled, why_not = False, WHAT_IF_HARDWARE_NOTE
        elif view.what_if:
            enabled, why_not = False, WHAT_IF_NOTE
        elif using_override:
            assert self.override is not None
            enabled, why_not = self.override.ok, "These settings cannot be loaded (see below)."
        else:
            enabled, why_not = view.loadable, "This plan does not fit in memory."
        button.setEnabled(enabled)
        button.setToolTip("" if enabled else why_not)
        self.load_note.setText("" if enabled else why_not)
        self.load_note.setVisible(not enabled)

    def _show_error(self, error: BaseException, prefix: str = "") -> None:
        self.error_text = prefix + describe_error(error)
        self.error_label.setText(self.error_text)
        self.error_box.show()

    def _load_clicked(self) -> None:
        if self.view is None:
            return
        config = self.view.plan.config
        if self.overrides_active and self.override is not None and self.override.config:
            config = self.override.config
        self.load_requested.emit(config)

    # -- overrides --

    def _fill_overrides(self, view: PlanView) -> None:
        config = view.plan.config
        controls = self._override_controls()
        for control in controls:
            control.blockSignals(True)
        self.gpu_layers_box.setMaximum(view.spec.n_layers or 999)
        self.gpu_layers_box.setValue(config.n_gpu_layers)
        self.ctx_box.setValue(config.n_ctx)
        self.kv_box.setCurrentIndex(max(0, self.kv_box.findText(config.type_k)))
        self.flash_box.setChecked(config.flash_attn)
        self.threads_box.setValue(config.decode_threads)
        self.batch_box.setValue(config.n_batch)
        self.slots_box.setValue(config.n_parallel)
        for control in controls:
            control.blockSignals(False)
        self._update_override_limits()
        self.overrides_active = False
        self.override = None
        self.override_status.setText("These are the plan's settings. Change one to check it.")
        self.override_status.setObjectName("muted")
        self._repolish(self.override_status)
        _clear(self.override_memory_layout)

    def _override_controls(self) -> list[QWidget]:
        return [
            self.gpu_layers_box,
            self.ctx_box,
            self.kv_box,
            self.flash_box,
            self.threads_box,
            self.batch_box,
            self.slots_box,
        ]

    def _update_override_limits(self) -> None:
        profile = self.planning_profile()
        has_gpu = bool(profile and describe_machine(profile, {}).gpus)
        self.gpu_layers_box.setEnabled(has_gpu)
        self.gpu_layers_box.setToolTip(
            "" if has_gpu else "No GPU the engine can drive: every layer runs on the CPU."
        )

    def override_config(self) -> EngineConfig:
        """The plan's config with the override controls' values (may raise EngineConfigError)."""
        assert self.view is not None
        kv = self.kv_box.currentText()
        batch = self.batch_box.value()
        base = self.view.plan.config
        return replace(
            base,
            n_gpu_layers=self.gpu_layers_box.value(),
            n_ctx=self.ctx_box.value(),
            type_k=kv,
            type_v=kv,
            flash_attn=self.flash_box.isChecked(),
            n_threads=self.threads_box.value(),
            n_batch=batch,
            n_ubatch=min(base.n_ubatch, batch),
            n_parallel=self.slots_box.value(),
        )

    def check_overrides(self) -> None:
        """Evaluate the override controls with the planner and show the verdict."""
        profile = self.planning_profile()
        if self.view is None or profile is None:
            return
        self.overrides_active = True
        self.override = check_override(self.view, profile, self.override_config)
        self.override_status.setText(override_summary(self.override))
        self.override_status.setObjectName("good" if self.override.ok else "problem")
        self._repolish(self.override_status)
        _clear(self.override_memory_layout)
        if self.override.candidate is not None:
            for device in self.override.candidate.devices:
                self.override_memory_layout.addWidget(DeviceMemoryView(device))
        self._update_load_button()

    def reset_overrides(self) -> None:
        if self.view is not None:
            self._fill_overrides(self.view)
            self._update_load_button()

    def set_overrides_open(self, open_: bool) -> None:
        self.overrides_toggle.setChecked(open_)

    def _toggle_overrides(self, open_: bool) -> None:
        self.overrides_body.setVisible(open_)
        self.overrides_toggle.setArrowType(
            Qt.ArrowType.DownArrow if open_ else Qt.ArrowType.RightArrow
        )

    @staticmethod
    def _repolish(widget: QWidget) -> None:
        widget.style().unpolish(widget)
        widget.style().polish(widget)

    # -- layout --

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 16)
        layout.setSpacing(12)
        # The style sheet goes on the body and the header's labels, never on an ancestor of
        # the spinner: a busy bar animated by a page's style-sheet style crashed Qt (in
        # QCommonStylePrivate::removeAnimation) when the page was deleted before the
        # animation's own deferred deletion, 1 in 6-9 runs of tests/app/gui/test_plan_page.py.
        self.body = QWidget()
        layout.addLayout(self._build_header())
        body = QVBoxLayout(self.body)
        body.setContentsMargins(0, 0, 0, 0)
        body.setSpacing(12)
        layout.addWidget(self.body, 1)
        body.addLayout(self._build_choices())
        self.error_box = QFrame()
        self.error_box.setObjectName("errorBox")
        error_row = QHBoxLayout(self.error_box)
        error_row.setContentsMargins(12, 8, 12, 8)
        self.error_label = _label()
        error_row.addWidget(self.error_label)
        self.error_box.hide()
        body.addWidget(self.error_box)
        self.scroll_area = self._scroll(self._build_content())
        self.recipe_view = RecipeView()
        self.recipe_view.engine_changed.connect(self._engine_changed)
        self.recipe_view.checkpoint_chosen.connect(self._checkpoint_chosen)
        self.recipe_scroll = self._scroll(self.recipe_view)
        self.content_stack = QStackedWidget()
        self.content_stack.addWidget(self.scroll_area)
        self.content_stack.addWidget(self.recipe_scroll)
        body.addWidget(self.content_stack, 1)
        self._apply_style()

    @staticmethod
    def _scroll(content: QWidget) -> QScrollArea:
        area = QScrollArea()
        area.setWidgetResizable(True)
        area.setFrameShape(QFrame.Shape.NoFrame)
        area.setWidget(content)
        return area

    def _build_header(self) -> QHBoxLayout:
        header = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(2)
        title = _label("Plan", "pageTitle")
        titles.addWidget(title)
        self.subtitle = _label(LOCAL_SUBTITLE, "muted")
        titles.addWidget(self.subtitle)
        header.addLayout(titles, 1)
        self.status = _label("", "muted", wrap=False)
        self._styled = [self.body, title, self.subtitle, self.status]
        self.spinner = QProgressBar()
        self.spinner.setRange(0, 0)
        self.spinner.setFixedWidth(120)
        self.spinner.setTextVisible(False)
        self.spinner.hide()
        self.replan_button = QPushButton("Plan again")
        self.replan_button.clicked.connect(self.request_plan)
        for widget in (self.status, self.spinner, self.replan_button):
            header.addWidget(widget, 0, Qt.AlignmentFlag.AlignVCenter)
        return header

    def _build_hardware_box(self) -> QComboBox:
        box = QComboBox()
        box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        box.addItem("This machine", THIS_MACHINE)
        box.insertSeparator(box.count())
        for filename, name in HARDWARE_EXAMPLES.items():
            box.addItem(HARDWARE_WHAT_IF_PREFIX + name, example_choice(filename))
        box.insertSeparator(box.count())
        box.addItem("Open a hardware spec…", OPEN_SPEC)
        box.setToolTip("Plan for this computer, or for hardware you are thinking of using")
        box.currentIndexChanged.connect(self._hardware_changed)
        return box

    def _build_choices(self) -> QVBoxLayout:
        self.hardware_box = self._build_hardware_box()
        self.model_box = QComboBox()
        self.model_box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.model_box.setMinimumContentsLength(24)
        self.model_box.currentIndexChanged.connect(self._model_changed)
        self.goal_box = QComboBox()
        for goal in get_args(Goal):
            self.goal_box.addItem(GOAL_NAMES[goal], goal)
        self.goal_box.setCurrentIndex(self.goal_box.findData("balanced"))
        self.goal_box.currentIndexChanged.connect(self._choice_changed)
        self.context_box = QSpinBox()
        self.context_box.setRange(0, MAX_OVERRIDE_CONTEXT)
        self.context_box.setSingleStep(1024)
        self.context_box.setSpecialValueText("Automatic")
        self.context_box.setSuffix(" tokens")
        self.context_box.setGroupSeparatorShown(True)
        self.context_box.valueChanged.connect(self._schedule_replan)
        self.parallel_box = QSpinBox()
        self.parallel_box.setRange(0, MAX_PARALLEL)
        self.parallel_box.setSpecialValueText("Automatic")
        self.parallel_box.setToolTip(PARALLEL_TIP)
        self.parallel_box.valueChanged.connect(self._schedule_replan)
        self.keep_free_box = QDoubleSpinBox()
        self.keep_free_box.setRange(0.0, 1024.0)
        self.keep_free_box.setSingleStep(0.5)
        self.keep_free_box.setDecimals(1)
        self.keep_free_box.setSuffix(" GiB")
        self.keep_free_box.setValue(self._stored_keep_free_gb())
        self.keep_free_box.setToolTip(KEEP_FREE_TIP)
        self.keep_free_box.valueChanged.connect(self._keep_free_changed)
        rows = QVBoxLayout()
        rows.setSpacing(6)
        hardware_and_model = (("&Hardware", self.hardware_box), ("&Model", self.model_box))
        rows.addLayout(_labelled_row(hardware_and_model))
        rows.addLayout(_labelled_row((("&Goal", self.goal_box), ("C&ontext", self.context_box))))
        rows.addLayout(
            _labelled_row(
                (
                    ("&Parallel requests", self.parallel_box),
                    ("&Keep free for my other apps", self.keep_free_box),
                )
            )
        )
        return rows

    def _stored_keep_free_gb(self) -> float:
        default = DEFAULT_FREE_MARGIN_BYTES / GIB
        if self.settings is None:
            return default
        try:
            return float(self.settings.value(KEEP_FREE_KEY, default))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return default

    def _build_content(self) -> QWidget:
        content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(0, 0, 8, 0)
        column.setSpacing(12)
        column.addWidget(self._build_verdict_card())
        columns = QHBoxLayout()
        columns.setSpacing(12)
        columns.addWidget(self._build_memory_card(), 3)
        columns.addWidget(self._build_speed_card(), 2)
        column.addLayout(columns)
        column.addWidget(self._build_settings_card())
        self.advice_card, layout = _card("Advice")
        self.advice_layout = QVBoxLayout()
        layout.addLayout(self.advice_layout)
        self.advice_card.hide()
        column.addWidget(self.advice_card)
        alternatives, layout = _card("Runners-up")
        self.alternatives_layout = QVBoxLayout()
        self.alternatives_layout.setSpacing(4)
        layout.addLayout(self.alternatives_layout)
        column.addWidget(alternatives)
        column.addWidget(self._build_overrides_card())
        column.addStretch(1)
        return content

    def _build_verdict_card(self) -> QFrame:
        card = QFrame()
        card.setObjectName("card")
        row = QHBoxLayout(card)
        row.setContentsMargins(16, 12, 16, 12)
        text = QVBoxLayout()
        text.setSpacing(4)
        self.model_title = _label("No plan yet", "cardTitle")
        self.verdict_label = _label("", "verdict", wrap=False)
        self.verdict_label.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Fixed)
        self.confidence_label = _label("", "muted")
        text.addWidget(self.model_title)
        text.addWidget(self.verdict_label)
        text.addWidget(self.confidence_label)
        row.addLayout(text, 1)
        self.load_button = QPushButton("Load with this plan")
        self.load_button.setEnabled(False)
        self.load_button.setDefault(True)
        self.load_button.clicked.connect(self._load_clicked)
        self.load_note = _label("", "muted")
        self.load_note.setMaximumWidth(320)
        self.load_note.setAlignment(Qt.AlignmentFlag.AlignRight)
        action = QVBoxLayout()
        action.addWidget(self.load_button, 0, Qt.AlignmentFlag.AlignRight)
        action.addWidget(self.load_note)
        row.addLayout(action)
        return card

    def _build_memory_card(self) -> QFrame:
        card, layout = _card("Memory per device")
        self.memory_layout = QVBoxLayout()
        self.memory_layout.setSpacing(14)
        layout.addLayout(self.memory_layout)
        layout.addStretch(1)
        self.memory_views = []
        return card

    def _build_speed_card(self) -> QFrame:
        card, layout = _card("Speed")
        self.speed_grid = QGridLayout()
        self.speed_grid.setHorizontalSpacing(16)
        self.speed_grid.setVerticalSpacing(6)
        layout.addLayout(self.speed_grid)
        self.speed_note = _label("", "muted")
        layout.addWidget(self.speed_note)
        layout.addStretch(1)
        self.speed_labels = {}
        return card

    def _build_settings_card(self) -> QFrame:
        card, layout = _card("Settings, and why")
        self.settings_grid = QGridLayout()
        self.settings_grid.setHorizontalSpacing(16)
        self.settings_grid.setVerticalSpacing(8)
        layout.addLayout(self.settings_grid)
        self.setting_labels = {}
        return card

    def _build_overrides_card(self) -> QFrame:
        card = QFrame()
        card.setObjectName("card")
        layout = QVBoxLayout(card)
        layout.setContentsMargins(16, 10, 16, 12)
        self.overrides_toggle = QToolButton()
        self.overrides_toggle.setText("Manual overrides (for power users)")
        self.overrides_toggle.setCheckable(True)
        self.overrides_toggle.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.overrides_toggle.setArrowType(Qt.ArrowType.RightArrow)
        self.overrides_toggle.setObjectName("overridesToggle")
        self.overrides_toggle.toggled.connect(self._toggle_overrides)
        layout.addWidget(self.overrides_toggle)
        self.overrides_body = self._build_overrides_body()
        self.overrides_body.hide()
        layout.addWidget(self.overrides_body)
        return card

    def _build_overrides_body(self) -> QWidget:
        body = QWidget()
        column = QVBoxLayout(body)
        column.setContentsMargins(0, 4, 0, 0)
        self.gpu_layers_box = QSpinBox()
        self.gpu_layers_box.setRange(-1, 999)
        self.gpu_layers_box.setSpecialValueText("all")
        self.ctx_box = QSpinBox()
        self.ctx_box.setRange(16, MAX_OVERRIDE_CONTEXT)
        self.ctx_box.setSingleStep(1024)
        self.ctx_box.setGroupSeparatorShown(True)
        self.kv_box = QComboBox()
        self.kv_box.addItems(list(KV_CHOICES))
        self.flash_box = QCheckBox("on")
        self.threads_box = QSpinBox()
        self.threads_box.setRange(1, 512)
        self.batch_box = QSpinBox()
        self.batch_box.setRange(32, 8192)
        self.batch_box.setSingleStep(128)
        self.slots_box = QSpinBox()
        self.slots_box.setRange(1, MAX_PARALLEL)
        self.slots_box.setToolTip(PARALLEL_TIP)
        spin_boxes = (self.gpu_layers_box, self.ctx_box, self.threads_box, self.batch_box)
        for box in (*spin_boxes, self.slots_box):
            box.valueChanged.connect(self.check_overrides)
        self.kv_box.currentIndexChanged.connect(self.check_overrides)
        self.flash_box.toggled.connect(self.check_overrides)
        grid = QGridLayout()
        grid.setHorizontalSpacing(10)
        grid.setVerticalSpacing(6)
        for index, (text, widget) in enumerate(
            (
                ("GPU &layers", self.gpu_layers_box),
                ("Conte&xt", self.ctx_box),
                ("KV cache &type", self.kv_box),
                ("&Flash attention", self.flash_box),
                ("&Threads", self.threads_box),
                ("&Batch", self.batch_box),
                ("Parallel re&quests", self.slots_box),
            )
        ):
            label = QLabel(text)
            label.setBuddy(widget)
            row, pair = divmod(index, 3)
            grid.addWidget(label, row, pair * 2)
            grid.addWidget(widget, row, pair * 2 + 1)
        for pair in range(3):
            grid.setColumnStretch(pair * 2 + 1, 1)
        column.addLayout(grid)
        buttons = QHBoxLayout()
        self.override_status = _label("", "muted")
        self.reset_button = QPushButton("Reset to the plan")
        self.reset_button.clicked.connect(self.reset_overrides)
        buttons.addWidget(self.override_status, 1)
        buttons.addWidget(self.reset_button, 0, Qt.AlignmentFlag.AlignTop)
        column.addLayout(buttons)
        self.override_memory_layout = QVBoxLayout()
        self.override_memory_layout.setSpacing(10)
        column.addLayout(self.override_memory_layout)
        return body

    def apply_theme(self, dark: bool) -> None:
        """Colours follow the palette; re-applying the style sheet refreshes its `palette(...)`
        references (the verdict chips and advice keep their own light background and dark text
        in both themes)."""
        self._apply_style()

    def _apply_style(self) -> None:
        for widget in self._styled:
            widget.setStyleSheet(STYLE)
