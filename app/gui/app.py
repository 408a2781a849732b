"""The desktop app: QApplication setup, a theme that follows the OS, and `run_gui`.

`HearthsideApp` owns the one EngineService the window, the chat and the Local API share, and
the main window; closing the window turns the API off, stops the reply (saving it) and then
stops the engine thread.

Only one app runs per user and data dir (`single_instance`): a second launch raises this
window and exits. The window and the engine module are imported inside `HearthsideApp`, after
that check, so a second launch never pays for them.

While the app runs, an exception nobody caught is logged and shown in the message bar
(`uncaught`), and a crash report an earlier run left is mentioned there once.

The window is shown before the engine exists: importing the engine (llama_cpp, numpy) and the
model store takes seconds on a slow machine, so `HearthsideApp` builds the window without an
EngineService, and once the window has been painted it imports and starts the engine, attaches
it and starts loading the model. Nothing imported before the first paint may import the
engine, the API server or the HTTP client at module level.

Two hooks for tests and benchmarks, invisible to users:
- `HEARTHSIDE_STARTUP_MARKER=PATH` appends `<event> <unix time>` lines to PATH: `qt-ready`
  (QApplication made), `window-built` (the window and engine thread exist), `shown` when the
  window is first painted, `engine-ready` when the model has loaded, `activated` when a
  second launch handed over.
- `hearthside gui --smoke` opens the window, sends one prompt once the model is loaded,
  prints the reply and quits (exit 0, or 1 when no reply came) — the bundle's smoke run.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QCoreApplication, QEvent, QObject, Qt, QTimer, Slot
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QMessageBox, QStyleFactory

from hearthside.app.gui.icons import app_icon
from hearthside.app.gui.single_instance import ActivationRequest, claim_instance, instance_key
from hearthside.app.gui.uncaught import UncaughtErrorReporter
from hearthside.app.gui.window_state import APPLICATION, ORGANIZATION
from hearthside.app.gui_cli import ALREADY_RUNNING_NOTICE
from hearthside.app.launcher import APP_ID
from hearthside.core.errors import HearthsideError
from hearthside.core.logs import claim_new_crash_reports, crash_notice
from hearthside.core.paths import data_dir

if TYPE_CHECKING:
    from hearthside.app.gui.main_window import MainWindow
    from hearthside.app.gui.model_loader import LoadOptions
    from hearthside.core.engine.engine import GenerationResult
    from hearthside.core.engine.service import EngineService

ENGINE_STOP_TIMEOUT_S = 10.0
STARTUP_MARKER_ENV = "HEARTHSIDE_STARTUP_MARKER"
SMOKE_PROMPT = "What is the capital of France?"
SMOKE_MAX_TOKENS = 24
SMOKE_TIMEOUT_MS = 10 * 60 * 1000  # a first run installs the default model first
SMOKE_POLL_MS = 250
SIGNAL_CHECK_MS = 500
# Starts the engine even if no paint event ever arrives (a window shown minimised).
ENGINE_START_FALLBACK_MS = 1000


def _default_load_options() -> LoadOptions:
    from hearthside.app.gui.model_loader import LoadOptions

    return LoadOptions()


@dataclass(frozen=True)
class GuiOptions:
    model: str = "default"
    load: LoadOptions = field(default_factory=_default_load_options)
    probe_command: tuple[str, ...] | None = None  # replaces the hardware probe's command line
    probe_on_start: bool = True
    smoke: bool = False  # send one prompt, print the reply, quit
    model_named: bool = False  # the user named `model` (a second launch forwards it)


# ---- application and theme --------------------------------------------------------------------


def create_application(argv: Sequence[str] | None = None) -> QApplication:
    """The QApplication (the existing one, if any), named and styled for Hearthside."""
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(list(argv or ["x"]))
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    QGuiApplication.setApplicationDisplayName(APPLICATION)
    QGuiApplication.setDesktopFileName(APP_ID)  # the launcher's desktop entry
    app.setWindowIcon(app_icon())
    fusion = QStyleFactory.create("Fusion")
    if fusion is not None:
        app.setStyle(fusion)
    apply_palette(app, os_prefers_dark(app))
    return app


def os_prefers_dark(app: QGuiApplication) -> bool:
    return app.styleHints().colorScheme() == Qt.ColorScheme.Dark


def dark_palette() -> QPalette:
    palette = QPalette()
    colours = {
        QPalette.ColorRole.Window: "#202124",
        QPalette.ColorRole.WindowText: "#e8eaed",
        QPalette.ColorRole.Base: "#17181a",
        QPalette.ColorRole.AlternateBase: "#26272b",
        QPalette.ColorRole.ToolTipBase: "#2d2e31",
        QPalette.ColorRole.ToolTipText: "#e8eaed",
        QPalette.ColorRole.PlaceholderText: "#9aa0a6",
        QPalette.ColorRole.Text: "#e8eaed",
        QPalette.ColorRole.Button: "#2d2e31",
        QPalette.ColorRole.ButtonText: "#e8eaed",
        QPalette.ColorRole.BrightText: "#ff6b6b",
        QPalette.ColorRole.Link: "#8ab4f8",
        QPalette.ColorRole.LinkVisited: "#c58af9",
        QPalette.ColorRole.Highlight: "#8ab4f8",
        QPalette.ColorRole.HighlightedText: "#202124",
        QPalette.ColorRole.Mid: "#3c4043",
    }
    for role, colour in colours.items():
        palette.setColor(role, QColor(colour))
    disabled = QColor("#6f7378")
    for role in (
        QPalette.ColorRole.Text,
        QPalette.ColorRole.ButtonText,
        QPalette.ColorRole.WindowText,
    ):
        palette.setColor(QPalette.ColorGroup.Disabled, role, disabled)
    return palette


def apply_palette(app: QApplication, dark: bool) -> None:
    app.setPalette(dark_palette() if dark else app.style().standardPalette())


# ---- startup marker ---------------------------------------------------------------------------


def mark_startup_event(event: str, path: str | None = None) -> None:
    """Append `<event> <unix time>` to the file HEARTHSIDE_STARTUP_MARKER names, if any."""
    target = path if path is not None else os.environ.get(STARTUP_MARKER_ENV)
    if not target:
        return
    try:
        with Path(target).open("a", encoding="utf-8") as marker:
            marker.write(f"{event} {time.time():.6f}\n")
    except OSError:
        pass  # a diagnostics hook must never stop the app


class _FirstPaintWatcher(QObject):
    """Marks `shown` when the window is first painted (the user can see it from then on) and
    calls `on_shown` once that paint is done."""

    def __init__(self, window: QObject, on_shown: Callable[[], None] | None = None) -> None:
        super().__init__(window)
        self._window = window
        self._on_shown = on_shown
        window.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 (Qt's name)
        if watched is self._window and event.type() == QEvent.Type.Paint:
            self._window.removeEventFilter(self)
            mark_startup_event("shown")
            if self._on_shown is not None:
                QTimer.singleShot(0, self, self._on_shown)  # after this paint has finished
        return False


# ---- the app ----------------------------------------------------------------------------------


class HearthsideApp(QObject):
    """The engine, the window and the theme, for one run of the desktop app."""

    def __init__(self, app: QApplication, options: GuiOptions) -> None:
        super().__init__()
        # Imported here, not at the top: a second launch stops before needing it.
        from hearthside.app.gui.main_window import MainWindow

        self.app = app
        self.options = options
        self.service: EngineService | None = None  # started once the window is on screen
        self.window: MainWindow = MainWindow(
            None, load_options=options.load, probe_command=options.probe_command
        )
        self.window.apply_theme(os_prefers_dark(app))
        app.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)
        self.window.bridge.load_finished.connect(lambda _loaded: mark_startup_event("engine-ready"))
        self._first_paint = _FirstPaintWatcher(self.window, self._start_engine)
        self._smoke = SmokeRun(self) if options.smoke else None
        self._stopped = False
        self._uncaught = UncaughtErrorReporter(self._show_error_text, self)
        self._uncaught.install()
        self._mention_crash_reports()

    def _show_error_text(self, text: str) -> None:
        self.window.message_bar.show_text(text, error=True)

    def _mention_crash_reports(self) -> None:
        reports = claim_new_crash_reports()
        if reports:
            self.window.message_bar.show_text(crash_notice(reports), error=False)

    def start(self) -> None:
        """Show the window with the last chat; the engine starts once it has been painted."""
        self.window.open_history()
        self.window.show()
        QTimer.singleShot(ENGINE_START_FALLBACK_MS, self, self._start_engine)

    @Slot()
    def _start_engine(self) -> None:
        if self.service is not None or self._stopped:
            return
        from hearthside.core.engine.service import EngineService
        from hearthside.core.settings import Settings

        self.service = EngineService(max_queue=Settings().max_queue).start()
        self.window.attach_service(self.service)
        self.window.start_model(self.options.model, probe=self.options.probe_on_start)

    @Slot(object)
    def activate(self, request: ActivationRequest) -> None:
        """A second launch asked for this window: bring it to the front (and load its model)."""
        window = self.window
        if window.isMinimized():
            window.showNormal()
        window.show()
        window.raise_()
        window.activateWindow()
        mark_startup_event("activated")
        if request.model is not None:
            window.load_model(request.model)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.window.close()
        self.window.shutdown()
        if self.service is not None:
            self.service.stop(ENGINE_STOP_TIMEOUT_S)
        self._uncaught.uninstall()

    @Slot(Qt.ColorScheme)
    def _on_color_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        dark = scheme == Qt.ColorScheme.Dark
        apply_palette(self.app, dark)
        self.window.apply_theme(dark)


class SmokeRun(QObject):
    """`--smoke`: once the model is loaded, ask one question through the chat, print the reply
    and quit; exit code 1 if loading or answering fails or takes too long."""

    def __init__(self, owner: HearthsideApp) -> None:
        super().__init__(owner)
        self.owner = owner
        bridge = owner.window.bridge
        bridge.load_finished.connect(self._ask)
        bridge.load_failed.connect(self._fail)
        bridge.reply_finished.connect(self._answered)
        bridge.reply_failed.connect(self._fail)
        QTimer.singleShot(SMOKE_TIMEOUT_MS, self, lambda: self._fail(TimeoutError("no reply")))
        # Preparing a model (installing the default one) fails into the window's message bar,
        # not a signal; any error shown there fails the smoke run.
        self._watch = QTimer(self)
        self._watch.timeout.connect(self._check_message_bar)
        self._watch.start(SMOKE_POLL_MS)
        self._done = False

    @Slot()
    def _check_message_bar(self) -> None:
        bar = self.owner.window.message_bar
        if bar.text and bar.property("kind") == "error":
            self._fail(RuntimeError(bar.text))

    @Slot(object)
    def _ask(self, _loaded: object) -> None:
        session = self.owner.window.session
        settings = session.settings()
        # Greedy and short: a quick, repeatable answer (this only touches the smoke run's chat).
        sampling = replace(settings.sampling, temperature=0.0, max_tokens=SMOKE_MAX_TOKENS)
        session.apply_settings(replace(settings, sampling=sampling))
        if not session.send(SMOKE_PROMPT):
            self._fail(RuntimeError("the chat refused the prompt"))

    @Slot(object)
    def _answered(self, result: GenerationResult) -> None:
        text = result.text.strip()
        print(f"smoke: prompt: {SMOKE_PROMPT}", flush=True)
        print(f"smoke: reply: {text}", flush=True)
        print(f"smoke: decode {result.metrics.decode_tok_s or 0:.1f} tok/s", flush=True)
        self._finish(0 if text else 1)

    @Slot(object)
    def _fail(self, error: BaseException) -> None:
        if self._done:
            return
        message = error.user_text() if isinstance(error, HearthsideError) else str(error)
        print(f"smoke: failed: {message or repr(error)}", file=sys.stderr, flush=True)
        self._finish(1)

    def _finish(self, code: int) -> None:
        self._done = True
        self._watch.stop()
        self.owner.app.exit(code)


def gui_options(args: argparse.Namespace) -> GuiOptions:
    from hearthside.app.gui.model_loader import LoadOptions

    return GuiOptions(
        model=args.model,
        load=LoadOptions(
            n_ctx=args.ctx,
            n_threads=args.threads,
            n_threads_batch=args.batch_threads,
            n_parallel=getattr(args, "parallel", None),
        ),
        probe_on_start=not getattr(args, "no_probe", False),
        smoke=getattr(args, "smoke", False),
        model_named=args.model != "default",
    )


def activation_request(options: GuiOptions) -> ActivationRequest:
    return ActivationRequest(model=options.model if options.model_named else None)


def _quit_on_sigterm(app: QApplication) -> None:
    """A session logout (SIGTERM) closes the window properly: state saved, reply kept, engine
    stopped, the instance socket removed. Python only runs signal handlers between bytecodes,
    so a timer hands it control twice a second while Qt's loop waits."""
    signal.signal(signal.SIGTERM, lambda _signum, _frame: app.quit())
    ticker = QTimer(app)
    ticker.timeout.connect(lambda: None)
    ticker.start(SIGNAL_CHECK_MS)


def run_gui(args: argparse.Namespace) -> int:
    """Open the window and run until it is closed; the exit code of the event loop.

    When Hearthside already runs for this user and data dir, raise that window instead and
    return 0 at once.
    """
    options = gui_options(args)
    app = create_application(sys.argv[:1])
    mark_startup_event("qt-ready")
    instance = claim_instance(instance_key(data_dir()), activation_request(options), app)
    if instance is None:
        if options.smoke:
            print("smoke: failed: Hearthside already runs on this data dir", file=sys.stderr)
            return 1
        print(ALREADY_RUNNING_NOTICE, file=sys.stderr)
        return 0
    try:
        hearthside = HearthsideApp(app, options)
    except HearthsideError as exc:
        # Nothing else is on screen yet: say what is wrong in a dialog, not a traceback.
        QMessageBox.critical(None, "Hearthside", exc.user_text())
        return 2
    mark_startup_event("window-built")
    instance.activation_requested.connect(hearthside.activate)
    _quit_on_sigterm(app)
    hearthside.start()
    try:
        return int(app.exec())
    finally:
        hearthside.shutdown()
        instance.close()
