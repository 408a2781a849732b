"""The desktop app: QApplication setup, a theme that follows the OS, and `run_gui`.

`HearthsideApp` owns the one EngineService the window, the chat and the Local API share, and
the main window; closing the window turns the API off, stops the reply (saving it) and then
stops the engine thread.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from PySide6.QtCore import QCoreApplication, QObject, Qt, Slot
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication, QMessageBox, QStyleFactory

from hearthside.app.gui.icons import app_icon
from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.model_loader import LoadOptions
from hearthside.app.gui.window_state import APPLICATION, ORGANIZATION
from hearthside.core.engine.service import EngineService
from hearthside.core.errors import HearthsideError
from hearthside.core.settings import Settings

ENGINE_STOP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GuiOptions:
    model: str = "default"
    load: LoadOptions = field(default_factory=LoadOptions)
    probe_command: tuple[str, ...] | None = None  # replaces the hardware probe's command line
    probe_on_start: bool = True


# ---- application and theme --------------------------------------------------------------------


def create_application(argv: Sequence[str] | None = None) -> QApplication:
    """The QApplication (the existing one, if any), named and styled for Hearthside."""
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(list(argv or ["x"]))
    QCoreApplication.setOrganizationName(ORGANIZATION)
    QCoreApplication.setApplicationName(APPLICATION)
    QGuiApplication.setApplicationDisplayName(APPLICATION)
    QGuiApplication.setDesktopFileName("hearthside")
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


# ---- the app ----------------------------------------------------------------------------------


class HearthsideApp(QObject):
    """The engine, the window and the theme, for one run of the desktop app."""

    def __init__(self, app: QApplication, options: GuiOptions) -> None:
        super().__init__()
        self.app = app
        self.options = options
        self.service = EngineService(max_queue=Settings().max_queue).start()
        try:
            self.window = MainWindow(
                self.service, load_options=options.load, probe_command=options.probe_command
            )
        except BaseException:
            self.service.stop()
            raise
        self.window.apply_theme(os_prefers_dark(app))
        app.styleHints().colorSchemeChanged.connect(self._on_color_scheme_changed)
        self._stopped = False

    def start(self) -> None:
        self.window.show()
        self.window.start(self.options.model, probe=self.options.probe_on_start)

    def shutdown(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self.window.close()
        self.window.shutdown()
        self.service.stop(ENGINE_STOP_TIMEOUT_S)

    @Slot(Qt.ColorScheme)
    def _on_color_scheme_changed(self, scheme: Qt.ColorScheme) -> None:
        dark = scheme == Qt.ColorScheme.Dark
        apply_palette(self.app, dark)
        self.window.apply_theme(dark)


def gui_options(args: argparse.Namespace) -> GuiOptions:
    return GuiOptions(
        model=args.model,
        load=LoadOptions(
            n_ctx=args.ctx, n_threads=args.threads, n_threads_batch=args.batch_threads
        ),
    )


def run_gui(args: argparse.Namespace) -> int:
    """Open the window and run until it is closed; the exit code of the event loop."""
    app = create_application(sys.argv[:1])
    try:
        hearthside = HearthsideApp(app, gui_options(args))
    except HearthsideError as exc:
        # Nothing else is on screen yet: say what is wrong in a dialog, not a traceback.
        QMessageBox.critical(None, "Hearthside", exc.user_text())
        return 2
    hearthside.start()
    try:
        return int(app.exec())
    finally:
        hearthside.shutdown()
