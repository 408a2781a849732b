"""`MainWindow`: chats on the left, the conversation on the right, Models, Hardware and Plan
pages, the Local API switch in the toolbar and the model's speed and context use in the status line.

The window owns the EngineBridge (Qt side of the EngineService it is given), the chat history
and its QSettings. Everything slow — installing the default model, resolving a model file,
loading it, probing the hardware, answering — happens off the GUI thread.

"Settings…" in the toolbar holds what applies to every load (parallel requests, kept in
window.ini); a change applies at the next load, which the message bar says.

When the engine worker crashes mid-reply, the part already written stays (ChatSession) and
the message bar says what happened, then that the service restarted the engine (or what to
do when it could not), with llama.cpp's last lines behind "Details"; the next message is
answered by the restarted engine.

The model may be a saved remote server (`remote:NAME`, from the Models page's "Remote
servers"): the chat, the status line and the Local API (as a proxy) then work over it.

The window can be built before the EngineService exists (`service=None`, then
`attach_service`): the app shows it first and imports the engine (llama_cpp) afterwards, so
nothing here imports the engine or the API server at module level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QSettings, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QProgressBar,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStackedWidget,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.engine_crash import crash_details, window_crash_text
from hearthside.app.gui import window_state as keys
from hearthside.app.gui.api_switch import ApiSwitch
from hearthside.app.gui.chat_pane import ChatPane
from hearthside.app.gui.chat_session import ChatSession, ContextUse
from hearthside.app.gui.chat_settings_dialog import ChatSettingsDialog
from hearthside.app.gui.chat_view import drafts_text
from hearthside.app.gui.conversation_list import ConversationList
from hearthside.app.gui.engine_bridge import EngineBridge, LoadedModel
from hearthside.app.gui.hardware_page import HardwarePage
from hearthside.app.gui.icons import app_icon, icon
from hearthside.app.gui.labels import plain_tooltip
from hearthside.app.gui.machine_state import MachineState
from hearthside.app.gui.message_bar import MessageBar
from hearthside.app.gui.model_loader import (
    LoadOptions,
    PreparedModel,
    prepare_config,
    prepare_model,
)
from hearthside.app.gui.model_picker import ModelPickerController
from hearthside.app.gui.models_page import ModelsPage
from hearthside.app.gui.plan_content import default_probe
from hearthside.app.gui.plan_page import PlanPage, plan_icon
from hearthside.app.gui.reply_writer import ReplyWriter
from hearthside.app.gui.settings_dialog import (
    APPLIES_NOTE,
    SettingsDialog,
    WindowSettings,
    changes_message,
    gather_settings,
    idle_unload_text,
    keep_settings,
    parallel_text,
    read_parallel,
    set_outside_fields,
    write_parallel,
)
from hearthside.app.gui.workers import BackgroundTask, MainThreadRelay, run_in_background
from hearthside.core.errors import EngineCrashedError, HearthsideError, describe_error
from hearthside.core.history.store import ConversationStore
from hearthside.core.logs import log_file
from hearthside.core.paths import data_dir

if TYPE_CHECKING:
    from hearthside.app.gui.wizard import OptimizeWizard
    from hearthside.autotune.optimize import AppliedTuning
    from hearthside.autotune.speed_limit import SpeedLimit
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.metrics import GenerationMetrics, SpeculationStats
    from hearthside.core.engine.remote import RemoteConfig
    from hearthside.core.engine.service import EngineNotice, EngineService
    from hearthside.core.probe.profile import HardwareProfile

WINDOW_TITLE = "Hearthside"
CHAT_PAGE, MODELS_PAGE, HARDWARE_PAGE, PLAN_PAGE = 0, 1, 2, 3
PAGE_NAMES = {
    CHAT_PAGE: "Chat",
    MODELS_PAGE: "Models",
    HARDWARE_PAGE: "Hardware",
    PLAN_PAGE: "Plan",
}
PAGE_ICONS = {CHAT_PAGE: "chat", MODELS_PAGE: "models", HARDWARE_PAGE: "hardware"}  # + plan_icon
BAR_STYLE = """
QFrame#messageBar { border-radius: 6px; padding: 2px; }
QFrame#messageBar[kind="error"] { background: #fde8e8; border: 1px solid #f5b5b5; }
QFrame#messageBar[kind="info"] { background: #e8f0fe; border: 1px solid #b5c8f5; }
QFrame#messageBar QLabel { color: #1f2328; }
QFrame#banner { background: #fff4e0; border: 1px solid #f0c68a; border-radius: 6px; }
QFrame#banner QLabel { color: #1f2328; }
"""
REMOTE_PLAN_NOTE = (
    "The Plan page plans models that run on this computer. The model in use now runs on "
    "{where}, which chooses its own settings."
)


def _with_stored_parallel(options: LoadOptions, settings: QSettings) -> LoadOptions:
    """The window's stored parallel requests, unless the command line or the environment
    (`--parallel`, HEARTHSIDE_PARALLEL) already set them."""
    if options.n_parallel is not None:
        return options
    return replace(options, n_parallel=read_parallel(settings))


def remote_status_text(name: str, config: RemoteConfig) -> str:
    """The status line for a remote server: "Remote: NAME (model) at URL"."""
    return f"Remote: {name} ({config.model or 'its first model'}) at {config.base_url}"


def remote_config_of(loaded: LoadedModel | None) -> RemoteConfig | None:
    """The server's settings when the loaded model is a remote one, else None."""
    if loaded is None or not loaded.is_remote:
        return None
    from hearthside.core.engine.remote import RemoteConfig  # loaded with the engine by now

    return loaded.config if isinstance(loaded.config, RemoteConfig) else None


class OptimizeBanner(QFrame):
    """The one-time offer to tune Hearthside to this machine."""

    accepted = Signal()
    dismissed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("banner")
        text = QLabel(
            "Hearthside can measure this computer and pick the fastest settings for it.", self
        )
        text.setWordWrap(True)
        self.accept_button = QPushButton("Optimize for my hardware", self)
        self.accept_button.clicked.connect(self.accepted)
        self.dismiss_button = QPushButton("Not now", self)
        self.dismiss_button.clicked.connect(self.dismissed)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 6, 6)
        row.addWidget(text, 1)
        row.addWidget(self.accept_button)
        row.addWidget(self.dismiss_button)


class MainWindow(QMainWindow):
    closed = Signal()

    def __init__(
        self,
        service: EngineService | None = None,
        *,
        settings: QSettings | None = None,
        load_options: LoadOptions | None = None,
        probe_command: Sequence[str] | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle(WINDOW_TITLE)
        self.setWindowIcon(app_icon())
        self.root: Path = data_dir()
        self.service = service
        self.optimize_wizard: OptimizeWizard | None = None
        self.settings = settings if settings is not None else keys.gui_settings(self.root)
        self.load_options = _with_stored_parallel(load_options or LoadOptions(), self.settings)
        self.settings_dialog: SettingsDialog | None = None
        self.store = ConversationStore(self.root)
        self.bridge = EngineBridge(service, parent=self)
        self.reply_writer = ReplyWriter(self.root, parent=self)
        self._preparing: BackgroundTask[PreparedModel] | None = None
        self._idle_timer = QTimer(self)  # the chat model's idle unload, when asked for
        self._idle_timer.setSingleShot(True)
        self._idle_timer.timeout.connect(self._unload_if_idle)
        self._loading_remote: str | None = None  # the remote's name while connecting to it
        self._settings_why = ""  # where the loading settings came from (model tooltip)
        self._install_progress = MainThreadRelay(self._show_install_progress, self)
        self._shut_down = False
        self._reply_crash: EngineCrashedError | None = None  # the crash that ended our reply
        self._reply_kept = False  # whether that reply had text, now kept
        self._last_notice: EngineNotice | None = None
        self._build_pages(probe_command)
        self.session = ChatSession(
            self.store, self.bridge, self.chat_pane, self.reply_writer, parent=self
        )
        self.model_picker = ModelPickerController(
            self.chat_pane.model_picker,
            self.bridge,
            self.session,
            profile_source=self._profile_source,
            n_ctx=lambda: self.load_options.n_ctx,
            parent=self,
        )
        self._build_chrome()
        self._connect()
        self.apply_theme(dark=False)
        self._restore_state()

    # ---- building ----------------------------------------------------------------------

    def _build_pages(self, probe_command: Sequence[str] | None) -> None:
        self.conversation_list = ConversationList(self)
        self.chat_pane = ChatPane(self)
        self.sidebar_splitter = QSplitter(Qt.Orientation.Horizontal, self)
        self.sidebar_splitter.addWidget(self.conversation_list)
        self.sidebar_splitter.addWidget(self.chat_pane)
        self.sidebar_splitter.setStretchFactor(1, 1)
        self.sidebar_splitter.setSizes([260, 900])
        self.models_page = ModelsPage(self.root, self)
        # This machine's context (profile, calibration, fingerprints), read once for the
        # Hardware and Plan pages and the wizard, and read again when a measurement changes it.
        self.machine = MachineState(self)
        self.hardware_page = HardwarePage(
            self, probe_command=probe_command, service=self.service, machine=self.machine
        )
        # The plan page takes the Hardware page's profile; it probes only if it has none yet.
        self._probe = default_probe(probe_command)
        self.plan_page = PlanPage(
            self, settings=self.settings, probe=self._probe, machine=self.machine
        )
        self.pages = QStackedWidget(self)
        for page in (self.sidebar_splitter, self.models_page, self.hardware_page, self.plan_page):
            self.pages.addWidget(page)

    def _build_chrome(self) -> None:
        self.message_bar = MessageBar(self)
        self.banner = OptimizeBanner(self)
        self.banner.setVisible(not keys.read_bool(self.settings, keys.BANNER_DISMISSED_KEY))
        central = QWidget(self)
        column = QVBoxLayout(central)
        column.setContentsMargins(6, 6, 6, 0)
        column.addWidget(self.banner)
        column.addWidget(self.message_bar)
        column.addWidget(self.pages, 1)
        self.setCentralWidget(central)
        self.setStyleSheet(BAR_STYLE)
        self._build_toolbar()
        column.insertWidget(0, self.api_switch.panel)  # the API's URL and key, full width
        self._build_status_bar()
        self._build_shortcuts()

    def _build_toolbar(self) -> None:
        toolbar = QToolBar("Main", self)
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        toolbar.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.page_actions: dict[int, QAction] = {}
        group = QActionGroup(self)
        group.setExclusive(True)
        for index, name in PAGE_NAMES.items():
            action = QAction(name, self, checkable=True)
            action.setShortcut(QKeySequence(f"Ctrl+{index + 1}"))
            action.setToolTip(f"{name} (Ctrl+{index + 1})")
            action.triggered.connect(lambda _checked=False, page=index: self.show_page(page))
            group.addAction(action)
            toolbar.addAction(action)
            self.page_actions[index] = action
        self.page_actions[CHAT_PAGE].setChecked(True)
        toolbar.addSeparator()
        self.new_chat_action = QAction("New chat", self)
        self.new_chat_action.setShortcut(QKeySequence("Ctrl+N"))
        self.new_chat_action.setToolTip("Start a new chat (Ctrl+N)")
        self.new_chat_action.triggered.connect(self.new_chat)
        toolbar.addAction(self.new_chat_action)
        self.optimize_action = QAction("Optimize…", self)
        self.optimize_action.setToolTip(
            "Optimize for my hardware: measure and pick the fastest settings"
        )
        self.optimize_action.triggered.connect(self._optimize)
        toolbar.addAction(self.optimize_action)
        self.settings_action = QAction("Settings…", self)
        self.settings_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Preferences))
        self.settings_action.setToolTip(
            "Default model, context, threads, parallel requests, the Local API port, the hub"
        )
        self.settings_action.triggered.connect(self.edit_settings)
        toolbar.addAction(self.settings_action)
        spacer = QWidget(toolbar)
        spacer.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        toolbar.addWidget(spacer)
        self.api_switch = ApiSwitch(self.service, toolbar)
        toolbar.addWidget(self.api_switch)
        self.addToolBar(toolbar)
        self.toolbar = toolbar

    def _build_status_bar(self) -> None:
        bar = self.statusBar()
        self.model_label = QLabel("No model loaded", self)
        self.model_label.setTextFormat(Qt.TextFormat.PlainText)  # a name from a model file
        self.install_progress = QProgressBar(self)
        self.install_progress.setMaximumWidth(200)
        self.install_progress.setTextVisible(True)
        self.install_progress.hide()
        self.speed_label = QLabel("", self)
        self.context_label = QLabel("", self)
        for label in (self.speed_label, self.context_label):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        bar.addWidget(self.model_label)
        bar.addWidget(self.install_progress)
        bar.addPermanentWidget(self.speed_label)
        bar.addPermanentWidget(self.context_label)

    def _build_shortcuts(self) -> None:
        self.stop_action = QAction("Stop", self)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.stop_action.setShortcutContext(Qt.ShortcutContext.WindowShortcut)
        self.stop_action.triggered.connect(self.escape)
        self.search_action = QAction("Search chats", self)
        self.search_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Find))
        self.search_action.triggered.connect(self._focus_search)
        for action in (self.stop_action, self.search_action):
            self.addAction(action)
        self.setTabOrder(self.conversation_list.list, self.chat_pane.input)

    def _connect(self) -> None:
        session, chats = self.session, self.conversation_list
        chats.conversation_selected.connect(self._open_conversation)
        chats.new_requested.connect(self.new_chat)
        chats.rename_requested.connect(self.rename_conversation)
        chats.delete_requested.connect(self.delete_conversation)
        chats.search_changed.connect(lambda _text: self.refresh_conversations())
        session.conversations_changed.connect(self.refresh_conversations)
        session.conversation_opened.connect(self._remember_conversation)
        session.reply_metrics.connect(self._show_metrics)
        self.bridge.speculation_live.connect(self._show_live_speculation)
        session.context_changed.connect(self._show_context)
        session.error.connect(self.show_error)
        session.reply_crashed.connect(self._on_reply_crashed)
        self.bridge.engine_notice.connect(self._on_engine_notice)
        self.chat_pane.settings_requested.connect(self.edit_chat_settings)
        self.bridge.load_started.connect(self._on_load_started)
        self.bridge.load_finished.connect(self._on_model_loaded)
        self.bridge.load_failed.connect(self._on_load_failed)
        self.bridge.load_retried.connect(self._on_load_retried)
        self.bridge.unloaded_idle.connect(self._on_unloaded_idle)
        for restart in (self.bridge.load_finished, self.bridge.reply_finished):
            restart.connect(self.restart_idle_unload)
        self.bridge.reply_failed.connect(self.restart_idle_unload)
        self.api_switch.state_changed.connect(self.restart_idle_unload)
        self.models_page.load_requested.connect(self._load_requested_model)
        self.models_page.remote_load_requested.connect(self._load_requested_remote)
        self.models_page.models_changed.connect(self.plan_page.reload_models)
        self.models_page.models_changed.connect(self.model_picker.reload)
        self.chat_pane.model_picker.model_chosen.connect(self.load_model)
        self.model_picker.error.connect(self.show_error)
        self.plan_page.load_requested.connect(self._load_planned_config)
        self.banner.accepted.connect(self._optimize)
        self.banner.dismissed.connect(self._dismiss_banner)

    # ---- starting ----------------------------------------------------------------------

    def attach_service(self, service: EngineService) -> None:
        """The engine to use when the window was built without one (the app shows the window
        before it imports and starts the engine)."""
        self.service = service
        self.bridge.attach_service(service)
        self.api_switch.attach_service(service)
        self.hardware_page.attach_service(service)

    def start(self, model_ref: str = "default", *, probe: bool = True) -> None:
        """Show the last chat, probe the hardware and get the model ready, without blocking."""
        self.open_history()
        self.start_model(model_ref, probe=probe)

    def open_history(self) -> None:
        """Open the last chat and list the others (needs no engine)."""
        self.session.open_latest_or_new(keys.read_int(self.settings, keys.LAST_CONVERSATION_KEY))
        self.refresh_conversations()

    def start_model(self, model_ref: str = "default", *, probe: bool = True) -> None:
        """Probe the hardware and get the model ready, without blocking."""
        if probe:
            self.hardware_page.refresh()
        self.load_model(model_ref)
        self.model_picker.reload()
        self.chat_pane.input.setFocus()

    def load_model(self, ref: str) -> None:
        """Resolve `ref` (installing the default model on first use) off the GUI thread, then
        load it through the engine; chatting waits until it is ready."""
        options, relay = self.load_options, self._install_progress
        profile = self._profile_source()
        self._prepare(
            lambda: prepare_model(
                ref, options, progress=lambda *done: relay.post(done), profile=profile
            )
        )

    def _profile_source(self) -> Callable[[], HardwareProfile]:
        """The Hardware page's profile when it has one, else a probe of its own (in a child
        process, like the page's), run where the model is prepared."""
        known = self.hardware_page.profile
        return (lambda: known) if known is not None else self._probe

    def load_config(self, config: EngineConfig) -> None:
        """Load exactly `config` (a plan's settings). Its `model_path` may name the model as
        the planner does — an installed id, "default" or a GGUF path — and is resolved to the
        file (and an unregistered file checked) off the GUI thread first."""
        self._prepare(lambda: prepare_config(config))

    def _prepare(self, prepare: Callable[[], PreparedModel]) -> None:
        if self._preparing is not None:
            self.show_error(HearthsideError("A model is already being prepared; please wait."))
            return
        self.bridge.stop()
        self.model_label.setText("Preparing the model…")
        self.session.set_model_pending(True)
        self._preparing = run_in_background(
            prepare, self._on_model_prepared, self._on_prepare_failed
        )

    @Slot(object)
    def _on_model_prepared(self, prepared: PreparedModel) -> None:
        self._preparing = None
        self.install_progress.hide()
        self.session.set_model_pending(False)
        self._loading_remote = prepared.name if prepared.is_remote else None
        self._settings_why = prepared.why
        if prepared.backed_off:  # the user asked for more than fits: say so where it shows
            self.message_bar.show_text(prepared.why, error=False)
        try:
            self.bridge.load(prepared.config, prepared.name, prepared.model_id)
        except HearthsideError as exc:
            self._on_load_failed(exc)

    @Slot(object)
    def _on_prepare_failed(self, error: BaseException) -> None:
        self._preparing = None
        self.install_progress.hide()
        self.session.set_model_pending(False)
        still_loaded = self.bridge.loaded_model
        if still_loaded is None:
            self._on_load_failed(error)
            return
        self._on_model_loaded(still_loaded)  # nothing was unloaded: carry on with it
        self.show_error(
            error,
            prefix=f"That model could not be loaded; still chatting with {still_loaded.name}. ",
        )

    def _show_install_progress(self, done: tuple[int, int]) -> None:
        done_bytes, total_bytes = done
        self.model_label.setText("Installing the default model…")
        self.install_progress.setRange(0, 100)
        self.install_progress.setValue(done_bytes * 100 // total_bytes if total_bytes else 0)
        self.install_progress.show()

    # ---- model events ------------------------------------------------------------------

    @Slot(str)
    def _on_load_started(self, name: str) -> None:
        verb = "Connecting to" if self._loading_remote is not None else "Loading"
        self.model_label.setText(f"{verb} {name}…")
        self.speed_label.clear()
        self.chat_pane.view.set_speed_limit(None)  # the limit was the last model's

    @Slot(object)
    def _on_model_loaded(self, loaded: LoadedModel) -> None:
        self._loading_remote = None
        self.speed_label.clear()  # the last reply's figures were another model's
        remote = remote_config_of(loaded)
        if remote is not None:
            self.model_label.setText(remote_status_text(loaded.name, remote))
            self.model_label.setToolTip(plain_tooltip(remote.model_path))
        else:
            self.model_label.setText(loaded.name)
            why = f"\n{self._settings_why}" if self._settings_why else ""
            self.model_label.setToolTip(plain_tooltip(loaded.config.model_path + why))
            self.plan_page.set_loaded_model(loaded.model_id or loaded.config.model_path)
            self._find_speed_limit(loaded)
        self.chat_pane.input.setFocus()

    def _find_speed_limit(self, loaded: LoadedModel) -> None:
        """Work out the loaded model's limit on this machine off the GUI thread (its file and
        the calibration are read); the chat's notes compare each reply's speed with it."""
        from hearthside.autotune.speed_meter import limit_for_config
        from hearthside.autotune.wisdom import WisdomDB
        from hearthside.core.engine.config import EngineConfig

        config, profile = loaded.config, self._profile_source()
        if not isinstance(config, EngineConfig):  # a remote server: its machine is not ours
            return

        def find() -> SpeedLimit | None:
            with WisdomDB() as wisdom:
                return limit_for_config(config, profile(), wisdom)

        def found(limit: SpeedLimit | None) -> None:
            if self.bridge.loaded_model == loaded:  # no other model was loaded meanwhile
                self.chat_pane.view.set_speed_limit(limit)

        run_in_background(find, found, lambda _error: None)  # no limit: notes say only tok/s

    @Slot(str)
    def _on_load_retried(self, why: str) -> None:
        self._settings_why = why
        self.message_bar.show_text(why, error=False)

    # ---- idle unload of the chat model (Settings: "Also the model you chat with here") ----

    @Slot()
    def restart_idle_unload(self) -> None:
        """Count the chat model's idle time from now, when the user asked for it to unload."""
        from hearthside.core.settings import Settings

        self._idle_timer.stop()
        if self._shut_down:
            return
        settings = Settings()
        if settings.idle_unload_chat and settings.idle_unload_s and self.bridge.loaded_model:
            self._idle_timer.start(settings.idle_unload_s * 1000)

    @Slot()
    def _unload_if_idle(self) -> None:
        # The Local API may be using the model (turning it off starts the count again); a
        # reply or a load restarts the count when it ends.
        if self.api_switch.running or self.session.mode != "idle" or self._preparing is not None:
            return
        self.bridge.unload_idle()

    @Slot(object)
    def _on_unloaded_idle(self, model: LoadedModel) -> None:
        from hearthside.core.settings import Settings

        idle = idle_unload_text(Settings().idle_unload_s)
        self.model_label.setText(f"{model.name} (unloaded while idle)")
        self.speed_label.clear()
        self.message_bar.show_text(
            f"{model.name} was unloaded {idle} without a chat, so its memory is free for other "
            "programs. It loads again when you send a message (that takes a few seconds).",
            error=False,
        )

    @Slot(object)
    def _on_load_failed(self, error: BaseException) -> None:
        remote, self._loading_remote = self._loading_remote, None
        asleep = self.bridge.asleep
        self.model_label.setText(
            f"{asleep.name} (unloaded while idle)" if asleep else "No model loaded"
        )
        self.session.refresh_state()  # unavailable, unless sending may try the idle model again
        if remote is not None:
            self.show_error(error, prefix=f"Could not connect to the server {remote}. ")
        else:
            self.show_error(error, prefix="The model could not be loaded. ")

    @Slot(object, bool)
    def _on_reply_crashed(self, crash: EngineCrashedError, kept: bool) -> None:
        self._reply_crash = crash
        self._reply_kept = kept
        last = self._last_notice
        self._show_crash(crash, last if last is not None and last.crash is crash else None)

    @Slot(object)
    def _on_engine_notice(self, notice: EngineNotice) -> None:
        self._last_notice = notice
        loaded = self.bridge.loaded_model
        if notice.kind == "crashed":
            self.model_label.setText("Restarting the engine…")
        elif notice.kind == "restarted" and loaded is not None:
            self.model_label.setText(loaded.name)
        elif notice.kind == "restart_failed":
            self.model_label.setText("No model loaded")
            self.session.refresh_state()
        if notice.crash is not None:
            self._show_crash(notice.crash, notice)
        else:
            self.message_bar.show_text(notice.message, error=notice.kind != "restarted")

    def _show_crash(self, crash: EngineCrashedError, notice: EngineNotice | None) -> None:
        """The bar: what crashed and what the service did about it, the details behind a
        button (the bridge has written them to the log file)."""
        in_reply = crash is self._reply_crash
        text = window_crash_text(crash, notice, in_reply=in_reply, kept=self._reply_kept)
        recovered = notice is not None and notice.kind == "restarted"
        details = crash_details(crash, log_file(self.root))
        self.message_bar.show_text(text, error=not recovered, details=details)

    @Slot(str)
    def _load_requested_model(self, model_id: str) -> None:
        self.show_page(CHAT_PAGE)
        self.load_model(model_id)

    @Slot(str)
    def _load_requested_remote(self, name: str) -> None:
        self.show_page(CHAT_PAGE)
        self.load_model(f"remote:{name}")

    @Slot(object)
    def _load_planned_config(self, config: EngineConfig) -> None:
        self.show_page(CHAT_PAGE)
        self.load_config(config)

    def show_plan(self, ref: str) -> None:
        """Open the Plan page on the model `ref` (an installed id, a path or a catalog id)."""
        self.plan_page.reload_models()
        self.plan_page.select_model(ref)
        self.show_page(PLAN_PAGE)

    # ---- chats -------------------------------------------------------------------------

    @Slot()
    def new_chat(self) -> None:
        self.show_page(CHAT_PAGE)
        self._guarded(self.session.new_conversation)

    @Slot(int, str)
    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self._guarded(lambda: self.session.rename(conversation_id, title))

    @Slot(int)
    def delete_conversation(self, conversation_id: int) -> None:
        self._guarded(lambda: self.session.delete(conversation_id))

    @Slot()
    def refresh_conversations(self) -> None:
        if self._shut_down:  # a late signal after closing; the history is closed
            return
        query = self.conversation_list.search_text()
        try:
            found = self.store.search(query) if query.strip() else self.store.list()
        except HearthsideError as exc:
            self.show_error(exc)
            return
        self.conversation_list.set_conversations(
            found, self.session.current_id, replying_id=self.session.replying_to
        )

    @Slot(int)
    def _open_conversation(self, conversation_id: int) -> None:
        self._guarded(lambda: self.session.open(conversation_id))

    @Slot(int)
    def _remember_conversation(self, conversation_id: int) -> None:
        self.settings.setValue(keys.LAST_CONVERSATION_KEY, conversation_id)
        self.refresh_conversations()

    @Slot()
    def edit_chat_settings(self) -> None:
        dialog = ChatSettingsDialog(self.session.settings(), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(
            lambda: self._guarded(lambda: self.session.apply_settings(dialog.settings()))
        )
        self.chat_settings_dialog = dialog
        dialog.open()

    @Slot()
    def edit_settings(self) -> None:
        """The window's settings; what changes to loading applies at the next model load."""
        options = self.load_options
        try:
            current, models = gather_settings(
                options.n_parallel,
                options.n_ctx,
                options.n_threads,
                self.api_switch.port_box.value(),
                self.root,
            )
        except HearthsideError as exc:  # the model store is locked or damaged
            self.show_error(exc)
            return
        dialog = SettingsDialog(
            options.n_parallel,
            self,
            current=current,
            models=models,
            data_folder=self.root,
            outside=set_outside_fields(),
        )
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        names = dict(models)
        dialog.accepted.connect(lambda: self.apply_window_settings(current, dialog.chosen(), names))
        self.settings_dialog = dialog
        dialog.open()

    def apply_window_settings(
        self, before: WindowSettings, after: WindowSettings, model_names: dict[str, str]
    ) -> None:
        """Keep what the Settings dialog changed and say so in the message bar."""
        try:
            keep_settings(before, after, self.root)
        except HearthsideError as exc:
            self.show_error(exc, prefix="The settings were not saved. ")
            return
        write_parallel(self.settings, after.parallel)
        if after.api_port != before.api_port:
            self.api_switch.set_port(after.api_port)
        self.load_options = replace(
            self.load_options,
            n_parallel=after.parallel,
            n_ctx=after.n_ctx,
            n_threads=after.n_threads,
        )
        self.restart_idle_unload()
        message = changes_message(before, after, model_names)
        if message:
            self.message_bar.show_text(message, error=False)

    def apply_settings(self, parallel: int | None) -> None:
        """Keep `parallel` (None: Auto) for the next loads, here and in window.ini."""
        write_parallel(self.settings, parallel)
        if parallel == self.load_options.n_parallel:
            return
        self.load_options = replace(self.load_options, n_parallel=parallel)
        note = f"Parallel requests: {parallel_text(parallel)}. {APPLIES_NOTE}"
        self.message_bar.show_text(note, error=False)

    @Slot()
    def escape(self) -> None:
        """Esc: stop the reply; otherwise leave editing a message."""
        if self.session.mode == "generating":
            self.session.stop()
        else:
            self.session.cancel_edit()

    # ---- status ------------------------------------------------------------------------

    @Slot(object)
    def _show_metrics(self, metrics: GenerationMetrics) -> None:
        parts = []
        if metrics.decode_tok_s:
            parts.append(f"{metrics.decode_tok_s:.1f} tok/s")
        if metrics.ttft_s is not None:
            parts.append(f"TTFT {metrics.ttft_s:.2f} s")
        if metrics.speculative is not None and metrics.speculative.drafted:
            parts.append(drafts_text(metrics.speculative))
        self.speed_label.setText(" · ".join(parts))

    @Slot(object)
    def _show_live_speculation(self, stats: SpeculationStats) -> None:
        self.speed_label.setText(drafts_text(stats))

    @Slot(object)
    def _show_context(self, use: ContextUse) -> None:
        if use.total_tokens is None:
            self.context_label.clear()
            return
        used = "–" if use.used_tokens is None else str(use.used_tokens)
        self.context_label.setText(f"context {used} / {use.total_tokens} tokens")

    def show_error(self, error: BaseException, prefix: str = "") -> None:
        self.message_bar.show_text(prefix + describe_error(error), error=True)

    def _guarded(self, action: object) -> None:
        try:
            action()  # type: ignore[operator]
        except HearthsideError as exc:
            self.show_error(exc)

    # ---- pages, banner, theme ----------------------------------------------------------

    def show_page(self, index: int) -> None:
        self.pages.setCurrentIndex(index)
        self.page_actions[index].setChecked(True)
        if index == CHAT_PAGE:
            self.chat_pane.input.setFocus()
        remote = remote_config_of(self.bridge.loaded_model)
        if index == PLAN_PAGE and remote is not None:
            note = REMOTE_PLAN_NOTE.format(where=remote.describe())
            self.message_bar.show_text(note, error=False)

    def _focus_search(self) -> None:
        self.show_page(CHAT_PAGE)
        self.conversation_list.search_box.setFocus()
        self.conversation_list.search_box.selectAll()

    @Slot()
    def _optimize(self) -> None:
        """Open the "Optimize for my hardware" wizard (the banner's offer and the toolbar's)."""
        from hearthside.app.gui.wizard import OptimizeWizard  # the tuner: only when asked for

        self._dismiss_banner()
        if self.optimize_wizard is not None:
            self.optimize_wizard.deleteLater()
        loaded = self.bridge.loaded_model
        self.optimize_wizard = OptimizeWizard(
            self.service,
            self.machine.context or self.hardware_page.profile,
            self,
            current_model_id=loaded.model_id if loaded else None,
        )
        self.optimize_wizard.applied.connect(self._apply_tuning)
        self.optimize_wizard.measured.connect(self.measurements_changed)
        self.optimize_wizard.models_page_requested.connect(lambda: self.show_page(MODELS_PAGE))
        self.optimize_wizard.open()

    @Slot(object)
    def _apply_tuning(self, tuning: AppliedTuning) -> None:
        """Say what changed, refresh the pages that show measurements, and reload the tuned
        model: it loads with the settings the wizard measured and saved, at the chat's own
        context length (the wizard measures at a fixed, shorter one)."""
        from hearthside.app.gui.wizard import applied_text

        self.message_bar.show_text(applied_text(tuning), error=False)
        self.measurements_changed()
        self.load_model(tuning.model_id)

    @Slot()
    def measurements_changed(self) -> None:
        """A calibration or a tuning was stored: this machine's context is read again, and the
        Hardware and Plan pages show it when it comes (`MachineState.changed`)."""
        self.machine.refresh()

    @Slot()
    def _dismiss_banner(self) -> None:
        self.banner.hide()
        self.settings.setValue(keys.BANNER_DISMISSED_KEY, True)

    def apply_theme(self, dark: bool) -> None:
        """Icons and code colours for the palette now in use."""
        color = self.palette().windowText().color().name()
        for index, action in self.page_actions.items():
            named = PAGE_ICONS.get(index)
            action.setIcon(icon(named, color) if named else plan_icon(color))
        self.new_chat_action.setIcon(icon("new-chat", color))
        self.optimize_action.setIcon(icon("optimize", color))
        self.settings_action.setIcon(icon("settings", color))
        self.chat_pane.set_icon_color(color)
        self.conversation_list.new_button.setIcon(icon("new-chat", color))
        self.message_bar.close_button.setIcon(icon("close", "#1f2328"))
        self.chat_pane.view.set_dark(dark)
        self.plan_page.apply_theme(dark)
        self.session.rerender()

    # ---- window state ------------------------------------------------------------------

    def _restore_state(self) -> None:
        settings = self.settings
        geometry = settings.value(keys.GEOMETRY_KEY)
        restored = isinstance(geometry, QByteArray) and self.restoreGeometry(geometry)
        if not restored:
            self.resize(1200, 800)
        for key, widget in (
            (keys.WINDOW_STATE_KEY, self),
            (keys.SIDEBAR_SPLITTER_KEY, self.sidebar_splitter),
            (keys.CHAT_SPLITTER_KEY, self.chat_pane.splitter),
        ):
            value = settings.value(key)
            if isinstance(value, QByteArray):
                widget.restoreState(value)
        page = keys.read_int(settings, keys.PAGE_KEY)
        self.show_page(page if page in PAGE_NAMES else CHAT_PAGE)

    def save_state(self) -> None:
        settings = self.settings
        settings.setValue(keys.GEOMETRY_KEY, self.saveGeometry())
        settings.setValue(keys.WINDOW_STATE_KEY, self.saveState())
        settings.setValue(keys.SIDEBAR_SPLITTER_KEY, self.sidebar_splitter.saveState())
        settings.setValue(keys.CHAT_SPLITTER_KEY, self.chat_pane.splitter.saveState())
        settings.setValue(keys.PAGE_KEY, self.pages.currentIndex())
        if self.session.current_id is not None:
            settings.setValue(keys.LAST_CONVERSATION_KEY, self.session.current_id)
        settings.sync()

    def shutdown(self) -> None:
        """Save the window, turn the API off and let the reply stop; idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        self.save_state()
        if self.optimize_wizard is not None:
            self.optimize_wizard.cancel_measuring()
        self.api_switch.stop()
        self._idle_timer.stop()
        self.session.stop()
        self.session.finish_pending_reply()
        self.reply_writer.close()
        self.store.close()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        self.shutdown()
        super().closeEvent(event)
        self.closed.emit()
