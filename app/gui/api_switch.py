"""The toolbar's "Local API" switch: turns the OpenAI-compatible API on and off.

Starting and stopping run on a worker thread (uvicorn needs a moment to bind), so the window
never freezes. While the API is on, the switch shows its URL and key with copy buttons and
how many requests it has answered. The key is the same per-install key `hearthside serve`
uses; the chosen port is remembered in `gui_api.json` in the data dir.

When the loaded model is a remote server, the API is a proxy over it (the server app passes
requests on) and clients see the remote's own model id. The API server (FastAPI, uvicorn) is
imported when the switch is first turned on, not when the window is built.
"""

from __future__ import annotations

import json
import logging
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QFontDatabase, QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSpinBox,
    QWidget,
)

from hearthside.app.gui.workers import BackgroundTask, run_in_background
from hearthside.core.errors import EngineError, describe_error
from hearthside.core.paths import data_dir, make_private_file

if TYPE_CHECKING:
    from hearthside.core.engine.service import EngineService
    from hearthside.core.server.controller import ServerController

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

STYLE = """
QPushButton#apiToggle {
    padding: 4px 12px; border-radius: 12px; border: 1px solid palette(mid);
    background: palette(button); min-width: 7.5em;
}
QPushButton#apiToggle:checked { background: #2e7d32; color: white; border-color: #1b5e20; }
QLabel#apiError { color: #c62828; }
QLabel#apiCount { color: gray; }
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


def start_api(service: EngineService, port: int) -> ServerController:
    """Build and start the server; returns once it accepts connections."""
    from hearthside.core.server.app import ServerSettings
    from hearthside.core.server.controller import ServerController
    from hearthside.core.server.keys import load_or_create_api_key

    settings = ServerSettings(
        port=port,
        api_key=load_or_create_api_key(data_dir() / KEY_FILE_NAME),
        model_id=served_model_id(service),
    )
    from hearthside.app.api_models import LoadKnobs, on_demand_models
    from hearthside.core.settings import Settings

    knobs = LoadKnobs.from_settings(Settings())  # models requests name load as the window's do
    controller = ServerController(settings, service, on_demand=on_demand_models(data_dir(), knobs))
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


# ---- the widget ------------------------------------------------------------------------------


class ApiSwitch(QWidget):
    """Compact toolbar widget: on/off toggle, port, URL + key copy buttons, request count."""

    state_changed = Signal(bool)

    def __init__(self, service: EngineService | None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._service = service
        self._controller: ServerController | None = None
        self._task: BackgroundTask[ServerController] | None = None
        self._abandoned_start = False
        self._state = SwitchState.OFF
        self._build()
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
        layout.setSpacing(8)
        self.toggle = QPushButton(BUTTON_TEXT[SwitchState.OFF])
        self.toggle.setObjectName("apiToggle")
        self.toggle.setCheckable(True)
        self.toggle.setToolTip("Serve the loaded model to OpenAI-compatible apps on this computer")
        self.toggle.clicked.connect(self._on_clicked)
        layout.addWidget(self.toggle)
        layout.addWidget(QLabel("Port"))
        layout.addWidget(self._build_port_box())
        self.details = self._build_details()
        layout.addWidget(self.details)
        self.error_label = QLabel()
        self.error_label.setObjectName("apiError")
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.error_label, 1)

    def _build_port_box(self) -> QSpinBox:
        self.port_box = QSpinBox()
        self.port_box.setRange(LOWEST_PORT, HIGHEST_PORT)
        self.port_box.setValue(load_port())
        self.port_box.setToolTip("The port the API listens on (only while it is off)")
        return self.port_box

    def _build_details(self) -> QWidget:
        details = QWidget()
        row = QHBoxLayout(details)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(6)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.url_label = QLabel()
        self.url_label.setFont(mono)
        self.url_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.copy_url_button = QPushButton("Copy URL")
        self.copy_url_button.clicked.connect(lambda: self._copy(self.url))
        key_title = QLabel("Key")
        self.key_label = QLabel()
        self.key_label.setFont(mono)
        self.key_label.setToolTip("The API key: send it as 'Authorization: Bearer <key>'")
        self.copy_key_button = QPushButton("Copy key")
        self.copy_key_button.clicked.connect(lambda: self._copy(self.api_key))
        self.count_label = QLabel()
        self.count_label.setObjectName("apiCount")
        for widget in (
            self.url_label,
            self.copy_url_button,
            key_title,
            self.key_label,
            self.copy_key_button,
            self.count_label,
        ):
            row.addWidget(widget)
        return details

    # -- state --

    def _show_state(self, state: SwitchState) -> None:
        self._state = state
        self.toggle.setText(BUTTON_TEXT[state])
        self.toggle.setChecked(state in (SwitchState.ON, SwitchState.STARTING))
        self.toggle.setEnabled(state in (SwitchState.ON, SwitchState.OFF))
        self.port_box.setEnabled(state is SwitchState.OFF)
        self.details.setVisible(state is SwitchState.ON)
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
        served = self._controller.requests_served
        self.count_label.setText(f"{served} request{'' if served == 1 else 's'}")

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
            self._show_state(SwitchState.OFF)
            self.error_label.setText(
                EngineError(
                    "The engine is still starting.", hint="Turn the API on again in a moment."
                ).user_text()
            )
            return
        save_port(port)
        self.error_label.clear()
        self._abandoned_start = False
        self._show_state(SwitchState.STARTING)
        self._task = run_in_background(
            lambda: start_api(service, port), self._on_started, self._on_start_failed
        )

    def _on_started(self, controller: ServerController) -> None:
        if self._abandoned_start:  # stop() ran meanwhile and has already stopped it
            return
        self._controller = controller
        self._show_state(SwitchState.ON)
        self.state_changed.emit(True)

    def _on_start_failed(self, error: BaseException) -> None:
        if self._abandoned_start:
            return
        self.error_label.setText(plain_error(error, self.port_box.value()))
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
