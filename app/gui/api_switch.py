"""The toolbar's "Local API" switch: turns the OpenAI-compatible API on and off.

Starting and stopping run on a worker thread (uvicorn needs a moment to bind), so the window
never freezes. The toolbar holds only the toggle, so it never overflows into a "»" menu; the
rest is `ApiPanel`, a bar the window puts under the toolbar, full width: while the API is on
it shows the URL and the key with copy buttons, how many requests it has answered and, on
demand, a log of the latest ones (time, route, status, tokens) that the server reports from
its own thread through `RequestLogBridge` (a Qt signal, so the table is only touched on the UI
thread). While it is off the bar shows only when starting failed, with the port to change.
The key is the same per-install key `hearthside serve` uses; the chosen port is remembered in
`gui_api.json` in the data dir.

When the loaded model is a remote server, the API is a proxy over it (the server app passes
requests on) and clients see the remote's own model id. The API server (FastAPI, uvicorn) is
imported when the switch is first turned on, not when the window is built.
"""

from __future__ import annotations

import json
import logging
import time
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.workers import BackgroundTask, run_in_background
from hearthside.core.errors import EngineError, describe_error
from hearthside.core.paths import data_dir, make_private_file

if TYPE_CHECKING:
    from hearthside.core.engine.service import EngineService
    from hearthside.core.server.controller import ServerController
    from hearthside.core.server.request_log import FinishedRequest, RequestListener

log = logging.getLogger(__name__)

DEFAULT_PORT = 8765  # the same as `hearthside serve`
SETTINGS_FILE_NAME = "gui_api.json"
KEY_FILE_NAME = "api_key"
COUNT_POLL_MS = 500
STOP_WAIT_S = 15.0
LOWEST_PORT = 1024  # below this a normal user may not listen
HIGHEST_PORT = 65535
SHOWN_KEY_CHARS = 4


class SwitchState(Enum):
    OFF = "off"
    STARTING = "starting"
    ON = "on"
    STOPPING = "stopping"


BUTTON_TEXT = {
    SwitchState.OFF: "Local API: Off",
    SwitchState.STARTING: "Starting…",
    SwitchState.ON: "Local API: On",
    SwitchState.STOPPING: "Stopping…",
}

LOG_ROWS_SHOWN = 100
LOG_HEIGHT_PX = 110
LOG_COLUMNS = ("Time", "Request", "Status", "Tokens")
PANEL_HINT = "Apps on this computer reach the model at"
PANEL_HINT_TIP = (
    "Any app that speaks the OpenAI API (an editor, an agent, a script) can use the loaded "
    "model at this address with this key. Only programs on this computer can reach it."
)

STYLE = """
QPushButton#apiToggle {
    padding: 4px 12px; border-radius: 12px; border: 1px solid palette(mid);
    background: palette(button); min-width: 7.5em;
}
QPushButton#apiToggle:checked { background: #2e7d32; color: white; border-color: #1b5e20; }
"""
PANEL_STYLE = """
QFrame#apiPanel { background: #e8f5e9; border: 1px solid #a5d6a7; border-radius: 6px; }
QFrame#apiPanel QLabel { color: #1f2328; }
QFrame#apiPanel QLabel#apiError { color: #c62828; }
QFrame#apiPanel QLabel#apiCount { color: #4a5560; }
"""


# ---- the remembered port ---------------------------------------------------------------------


def settings_path() -> Path:
    return data_dir() / SETTINGS_FILE_NAME


def load_port() -> int:
    """The port chosen last time, or the default when none (or nothing sensible) is stored."""
    try:
        stored = json.loads(settings_path().read_text(encoding="utf-8")).get("port")
    except (OSError, ValueError, AttributeError):
        return DEFAULT_PORT
    valid = isinstance(stored, int) and LOWEST_PORT <= stored <= HIGHEST_PORT
    return stored if valid else DEFAULT_PORT


def save_port(port: int) -> None:
    path = settings_path()
    try:
        make_private_file(path)
        path.write_text(json.dumps({"port": port}) + "\n", encoding="utf-8")
    except OSError as exc:  # forgetting the port is no reason to fail turning the API on
        log.warning("could not remember the API port: %s", exc)


# ---- starting and stopping (worker thread) ---------------------------------------------------


def start_api(
    service: EngineService, port: int, on_request: RequestListener | None = None
) -> ServerController:
    """Build and start the server; returns once it accepts connections. `on_request` hears
    each finished request on the server's thread."""
    from hearthside.app.api_models import LoadKnobs, on_demand_models, probed_once, speed_meters
    from hearthside.core.server.app import ServerSettings
    from hearthside.core.server.controller import ServerController
    from hearthside.core.server.keys import load_or_create_api_key
    from hearthside.core.settings import Settings

    user = Settings()
    settings = ServerSettings(
        port=port,
        api_key=load_or_create_api_key(data_dir() / KEY_FILE_NAME),
        model_id=served_model_id(service),
        idle_unload_s=user.idle_unload_s,  # the window's own chat model is never unloaded
    )
    knobs = LoadKnobs.from_settings(user)  # models requests name load as the window's do
    hardware = probed_once(data_dir())
    on_demand = on_demand_models(data_dir(), knobs, hardware)
    controller = ServerController(
        settings,
        service,
        on_demand=on_demand,
        on_request=on_request,
        meters=speed_meters(hardware),
    )
    controller.start()
    return controller


def served_model_id(service: EngineService) -> str:
    """The file's stem for a local model, the server's own model id for a remote one."""
    from hearthside.app.serve_cli import served_model_id as model_id_for

    config = service.loaded_config
    return model_id_for(config) if config is not None else "default"


def masked(key: str) -> str:
    return "•" * 8 + key[-SHOWN_KEY_CHARS:]


def plain_error(error: BaseException, port: int) -> str:
    from hearthside.core.server.controller import ServerStartError

    if isinstance(error, ServerStartError):
        return (
            f"The API could not start on port {port}: another program is probably using it. "
            "Choose another port and turn it on again."
        )
    return describe_error(error)


# ---- the request log -------------------------------------------------------------------------


class RequestLogBridge(QObject):
    """Carries the server thread's finished requests to the UI thread as a signal."""

    finished = Signal(object)  # FinishedRequest

    def report(self, entry: FinishedRequest) -> None:  # called on the server's thread
        self.finished.emit(entry)


def log_row(entry: FinishedRequest) -> tuple[str, str, str, str]:
    """One row of the log in words: time, route, status (and the model loaded first, when
    the request waited for one), tokens ("–" when not said)."""
    when = time.strftime("%H:%M:%S", time.localtime(entry.finished_at))
    status = str(entry.status) if entry.status is not None else "closed"
    if entry.loaded_model is not None:
        status += f", after loading {entry.loaded_model} ({entry.load_wait_s or 0:.1f} s)"
    tokens = str(entry.completion_tokens) if entry.completion_tokens is not None else "–"
    return when, f"{entry.method} {entry.path}", status, tokens


def requests_text(count: int) -> str:
    return f"{count} request{'' if count == 1 else 's'}"


# ---- the widgets ------------------------------------------------------------------------------


class ApiPanel(QFrame):
    """The bar under the toolbar: port and error while off, URL, key, count and log while on."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("apiPanel")
        self.setStyleSheet(PANEL_STYLE)
        column = QVBoxLayout(self)
        column.setContentsMargins(10, 6, 10, 6)
        column.setSpacing(4)
        row = QHBoxLayout()
        row.setSpacing(8)
        self.details = self._build_details()
        row.addWidget(self.details, 1)
        self.port_label = QLabel("Port")
        row.addWidget(self.port_label)
        self.port_box = QSpinBox()
        self.port_box.setRange(LOWEST_PORT, HIGHEST_PORT)
        self.port_box.setValue(load_port())
        self.port_box.setToolTip("The port the API listens on (change it while the API is off)")
        row.addWidget(self.port_box)
        column.addLayout(row)
        self.error_label = QLabel()
        self.error_label.setObjectName("apiError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.error_label.hide()
        column.addWidget(self.error_label)
        self.log_table = self._build_log()
        column.addWidget(self.log_table)

    def _build_details(self) -> QWidget:
        details = QWidget()
        row = QHBoxLayout(details)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        hint = QLabel(PANEL_HINT)
        hint.setToolTip(PANEL_HINT_TIP)
        # The hint gives way (clipped) before the URL, key and buttons do, so the bar never
        # makes the window wider than the screen at 1024 px.
        hint.setMinimumWidth(0)
        hint.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        hint.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.url_label = QLabel()
        self.url_label.setFont(mono)
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_url_button = QPushButton("Copy URL")
        key_title = QLabel("with the key")
        self.key_label = QLabel()
        self.key_label.setFont(mono)
        self.key_label.setToolTip(
            "Apps send it as 'Authorization: Bearer <key>'; Copy key copies it whole"
        )
        self.copy_key_button = QPushButton("Copy key")
        self.count_label = QLabel()
        self.count_label.setObjectName("apiCount")
        self.log_button = QPushButton("Requests")
        self.log_button.setCheckable(True)
        self.log_button.setToolTip("The latest requests: time, route, status and tokens generated")
        self.log_button.toggled.connect(lambda shown: self.log_table.setVisible(shown))
        row.addWidget(hint, 1)
        for widget in (
            self.url_label,
            self.copy_url_button,
            key_title,
            self.key_label,
            self.copy_key_button,
            self.count_label,
            self.log_button,
        ):
            row.addWidget(widget)
        return details

    def _build_log(self) -> QTableWidget:
        table = QTableWidget(0, len(LOG_COLUMNS))
        table.setHorizontalHeaderLabels(LOG_COLUMNS)
        table.verticalHeader().hide()
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        header = table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        table.setFixedHeight(LOG_HEIGHT_PX)
        table.hide()
        return table

    def add_log_row(self, entry: FinishedRequest) -> None:
        """Newest first; the oldest rows go past LOG_ROWS_SHOWN."""
        self.log_table.insertRow(0)
        for column, text in enumerate(log_row(entry)):
            self.log_table.setItem(0, column, QTableWidgetItem(text))
        if self.log_table.rowCount() > LOG_ROWS_SHOWN:
            self.log_table.removeRow(LOG_ROWS_SHOWN)

    def show_error(self, text: str) -> None:
        self.error_label.setText(text)
        self.error_label.setVisible(bool(text))


class ApiSwitch(QWidget):
    """The toolbar's on/off toggle; `panel` is its bar (the window places it, full width)."""

    state_changed = Signal(bool)

    def __init__(self, service: EngineService | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._controller: ServerController | None = None
        self._task: BackgroundTask[ServerController] | None = None
        self._abandoned_start = False
        self._state = SwitchState.OFF
        self._build()
        self._log_bridge = RequestLogBridge(self)
        self._log_bridge.finished.connect(self.panel.add_log_row)
        self._count_timer = QTimer(self)
        self._count_timer.setInterval(COUNT_POLL_MS)
        self._count_timer.timeout.connect(self._show_count)
        self._show_state(SwitchState.OFF)

    # -- public --

    def attach_service(self, service: EngineService) -> None:
        """The engine to serve (the app starts it after the window is shown)."""
        self._service = service

    @property
    def running(self) -> bool:
        return self._state is SwitchState.ON

    @property
    def url(self) -> str | None:
        return self._controller.url if self._controller is not None else None

    @property
    def api_key(self) -> str | None:
        controller = self._controller
        return controller.settings.api_key if controller is not None else None

    @property
    def error_text(self) -> str:
        return self.error_label.text()

    def set_port(self, port: int) -> None:
        """Use `port` from the next start on (Settings); remembered like the panel's choice."""
        self.port_box.setValue(port)
        save_port(self.port_box.value())

    def stop(self) -> None:
        """Turn the API off now (blocking); for closing the window."""
        if self._state is SwitchState.STARTING and self._task is not None:
            # The start may have finished with its "started" callback still queued.
            self._abandoned_start = True
            self._task.wait(STOP_WAIT_S)
            if self._task.result is not None:
                self._task.result.stop()
        was_on = self._state in (SwitchState.ON, SwitchState.STOPPING)
        if self._controller is not None:
            self._controller.stop()
            self._controller = None
        self._show_state(SwitchState.OFF)
        if was_on:
            self.state_changed.emit(False)

    # -- building --

    def _build(self) -> None:
        self.setStyleSheet(STYLE)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        self.toggle = QPushButton(BUTTON_TEXT[SwitchState.OFF])
        self.toggle.setObjectName("apiToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolTip("Serve the loaded model to OpenAI-compatible apps on this computer")
        self.toggle.clicked.connect(self._on_clicked)
        layout.addWidget(self.toggle)
        self.panel = ApiPanel()
        panel = self.panel
        self.details, self.port_box, self.error_label = (
            panel.details,
            panel.port_box,
            panel.error_label,
        )
        self.url_label, self.key_label, self.count_label = (
            panel.url_label,
            panel.key_label,
            panel.count_label,
        )
        self.copy_url_button, self.copy_key_button = panel.copy_url_button, panel.copy_key_button
        self.log_button, self.log_table = panel.log_button, panel.log_table
        self.copy_url_button.clicked.connect(lambda: self._copy(self.url))
        self.copy_key_button.clicked.connect(lambda: self._copy(self.api_key))

    # -- state --

    def _show_state(self, state: SwitchState) -> None:
        self._state = state
        self.toggle.setText(BUTTON_TEXT[state])
        self.toggle.setChecked(state in (SwitchState.ON, SwitchState.STARTING))
        self.toggle.setEnabled(state in (SwitchState.ON, SwitchState.OFF))
        self.port_box.setEnabled(state is SwitchState.OFF)
        for widget in (self.port_box, self.panel.port_label):  # while on: the URL says it
            widget.setVisible(state is not SwitchState.ON)
        self.details.setVisible(state is SwitchState.ON)
        if state is not SwitchState.ON:
            self.log_button.setChecked(False)
        self.panel.setVisible(state is SwitchState.ON or bool(self.error_label.text()))
        if state is SwitchState.ON and self._controller is not None:
            self.url_label.setText(self._controller.url)
            self.key_label.setText(masked(self.api_key or ""))
            self._show_count()
            self._count_timer.start()
        else:
            self._count_timer.stop()

    def _show_count(self) -> None:
        if self._controller is None:
            return
        self.count_label.setText(requests_text(self._controller.requests_served))

    def _copy(self, text: str | None) -> None:
        if text:
            QGuiApplication.clipboard().setText(text)

    # -- turning on and off --

    def _on_clicked(self) -> None:
        if self._state is SwitchState.OFF:
            self._start()
        elif self._state is SwitchState.ON:
            self._stop_in_background()

    def _start(self) -> None:
        port = self.port_box.value()
        service = self._service
        if service is None:
            self.panel.show_error(
                EngineError(
                    "The engine is still starting.", hint="Turn the API on again in a moment."
                ).user_text()
            )
            self._show_state(SwitchState.OFF)
            return
        save_port(port)
        self.panel.show_error("")
        self._abandoned_start = False
        self._show_state(SwitchState.STARTING)
        report = self._log_bridge.report
        self._task = run_in_background(
            lambda: start_api(service, port, report), self._on_started, self._on_start_failed
        )

    def _on_started(self, controller: ServerController) -> None:
        if self._abandoned_start:  # stop() ran meanwhile and has already stopped it
            return
        self._controller = controller
        self.log_table.setRowCount(0)
        self._show_state(SwitchState.ON)
        self.state_changed.emit(True)

    def _on_start_failed(self, error: BaseException) -> None:
        if self._abandoned_start:
            return
        self.panel.show_error(plain_error(error, self.port_box.value()))
        self._show_state(SwitchState.OFF)

    def _stop_in_background(self) -> None:
        controller = self._controller
        if controller is None:
            return
        self._show_state(SwitchState.STOPPING)
        self._task = None
        run_in_background(controller.stop, lambda _none: self._on_stopped(controller))

    def _on_stopped(self, controller: ServerController) -> None:
        if self._controller is not controller:
            return
        self._controller = None
        self._show_state(SwitchState.OFF)
        self.state_changed.emit(False)
