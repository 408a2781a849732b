"""The toolbar's Local API switch: a real server on loopback, the real default model, the real
`openai` client, and Qt widgets offscreen."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.api_switch import ApiSwitch, SwitchState
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService

pytestmark = pytest.mark.gui

LEFT = Qt.MouseButton.LeftButton
START_TIMEOUT_MS = 15_000
# The UI thread only draws while the server starts on a worker; on two shared, busy cores a
# frame can still be late, so the bound is generous next to the ~10 ms ticks measured here.
MAX_EVENT_LOOP_GAP_S = 0.5


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(port: int) -> bool:
    """True when a new server could listen there (as uvicorn does, with SO_REUSEADDR: the
    closed connections' TIME_WAIT entries do not hold a port, a listening socket does)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def loaded_service(default_model_file: Path) -> Iterator[EngineService]:
    service = EngineService().start()
    service.load(EngineConfig(model_path=str(default_model_file), n_ctx=1024)).result()
    yield service
    service.stop()


@pytest.fixture()
def empty_service() -> Iterator[EngineService]:
    service = EngineService().start()
    yield service
    service.stop()


def make_switch(qtbot: QtBot, service: EngineService, port: int) -> ApiSwitch:
    switch = ApiSwitch(service)
    qtbot.addWidget(switch)
    switch.port_box.setValue(port)
    switch.show()
    return switch


class GapMeter:
    """Ticks every 10 ms on the UI thread and keeps the longest gap between two ticks."""

    def __init__(self) -> None:
        self.longest_s = 0.0
        self._last = time.monotonic()
        self._timer = QTimer()
        self._timer.setInterval(10)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    def _tick(self) -> None:
        now = time.monotonic()
        self.longest_s = max(self.longest_s, now - self._last)
        self._last = now

    def stop(self) -> float:
        self._timer.stop()
        return self.longest_s


def test_the_switch_serves_the_openai_client_and_counts_its_requests(
    qtbot: QtBot, loaded_service: EngineService, hearthside_home: Path
) -> None:
    port = free_port()
    switch = make_switch(qtbot, loaded_service, port)
    meter = GapMeter()
    with qtbot.wait_signal(switch.state_changed, timeout=START_TIMEOUT_MS) as turned_on:
        qtbot.mouseClick(switch.toggle, LEFT)
        assert switch.toggle.text() == "Starting…"  # the click returned before the server ran
        assert not switch.port_box.isEnabled()
    assert meter.stop() < MAX_EVENT_LOOP_GAP_S
    assert turned_on.args == [True]
    assert switch.running and switch.details.isVisible()
    assert switch.url == f"http://127.0.0.1:{port}/v1"
    assert switch.url_label.text() == switch.url
    stored_key = (hearthside_home / "api_key").read_text().strip()  # `hearthside serve`'s key
    assert switch.api_key == stored_key
    assert stored_key not in switch.key_label.text()  # shown masked, copied whole

    client = openai.OpenAI(base_url=switch.url, api_key=stored_key, max_retries=0)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=8,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    client.models.list()
    qtbot.waitUntil(lambda: switch.count_label.text() == "2 requests", timeout=5000)

    qtbot.mouseClick(switch.copy_key_button, LEFT)
    assert QGuiApplication.clipboard().text() == stored_key
    qtbot.mouseClick(switch.copy_url_button, LEFT)
    assert QGuiApplication.clipboard().text() == switch.url

    with qtbot.wait_signal(switch.state_changed, timeout=START_TIMEOUT_MS) as turned_off:
        qtbot.mouseClick(switch.toggle, LEFT)
    assert turned_off.args == [False]
    assert switch.toggle.text() == "Local API: Off" and switch.port_box.isEnabled()
    assert port_is_free(port)


# uvicorn ends its thread with SystemExit when it cannot bind; threading ignores that quietly.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_taken_port_is_explained_and_the_switch_goes_back_to_off(
    qtbot: QtBot, empty_service: EngineService
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        switch = make_switch(qtbot, empty_service, taken)
        with qtbot.assert_not_emitted(switch.state_changed):
            qtbot.mouseClick(switch.toggle, LEFT)
            qtbot.waitUntil(lambda: switch.error_text != "", timeout=START_TIMEOUT_MS)
    assert f"could not start on port {taken}" in switch.error_text
    assert "Choose another port" in switch.error_text
    assert "Traceback" not in switch.error_text
    assert not switch.toggle.isChecked() and switch.toggle.text() == "Local API: Off"
    assert switch.port_box.isEnabled() and not switch.details.isVisible()

    again = make_switch(qtbot, empty_service, taken)
    assert ApiSwitch(empty_service).port_box.value() == taken  # the port is remembered
    again.port_box.setValue(free_port())
    with qtbot.wait_signal(again.state_changed, timeout=START_TIMEOUT_MS):
        qtbot.mouseClick(again.toggle, LEFT)
    assert again.error_text == ""
    again.stop()


def test_stop_while_starting_leaves_nothing_listening(
    qtbot: QtBot, empty_service: EngineService
) -> None:
    port = free_port()
    switch = make_switch(qtbot, empty_service, port)
    qtbot.mouseClick(switch.toggle, LEFT)
    assert switch.toggle.text() == "Starting…"
    switch.stop()
    assert switch.toggle.text() == "Local API: Off"
    qtbot.wait(300)  # let the late "started" callback arrive: it must not turn the switch on
    assert not switch.running and switch._state is SwitchState.OFF
    assert port_is_free(port)


def test_stop_after_the_server_started_but_before_the_switch_heard_of_it(
    qtbot: QtBot, empty_service: EngineService
) -> None:
    port = free_port()
    switch = make_switch(qtbot, empty_service, port)
    qtbot.mouseClick(switch.toggle, LEFT)
    assert switch._task is not None and switch._task.wait(15)  # started; callback still queued
    switch.stop()
    qtbot.wait(300)
    assert not switch.running and switch.toggle.text() == "Local API: Off"
    assert port_is_free(port)
