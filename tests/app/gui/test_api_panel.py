"""The Local API's URL, key and request log in the real window: visible without a toolbar
overflow at 1024 px and up, clear of the sidebar's "New chat" button, and a log of the
requests a real `openai` client and a refused one made (time, route, status, tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import QToolButton, QWidget
from pytestqt.qtbot import QtBot

from hearthside.app.gui.api_switch import ApiSwitch, log_row
from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.window_state import gui_settings
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.request_log import FinishedRequest
from tests.app.gui.test_api_switch import free_port

pytestmark = [pytest.mark.gui, pytest.mark.beside]
START_TIMEOUT_MS = 20_000
LEFT = Qt.MouseButton.LeftButton


@pytest.fixture()
def empty_service() -> Iterator[EngineService]:
    service = EngineService().start()
    yield service
    service.stop()


def global_rect(widget: QWidget) -> QRect:
    return QRect(widget.mapToGlobal(QPoint(0, 0)), widget.size())


def turn_on(qtbot: QtBot, switch: ApiSwitch) -> None:
    switch.port_box.setValue(free_port())
    with qtbot.wait_signal(switch.state_changed, timeout=START_TIMEOUT_MS):
        qtbot.mouseClick(switch.toggle, LEFT)
    assert switch.running


@pytest.mark.parametrize("size", [(1024, 700), (1366, 850)])
def test_url_and_key_show_inside_the_window_without_overflow(
    qtbot: QtBot, empty_service: EngineService, hearthside_home: Path, size: tuple[int, int]
) -> None:
    hearthside_home.mkdir(parents=True, exist_ok=True)
    window = MainWindow(empty_service, settings=gui_settings(hearthside_home))
    qtbot.addWidget(window)
    window.resize(*size)
    window.show()
    qtbot.waitExposed(window)
    switch = window.api_switch
    turn_on(qtbot, switch)
    qtbot.waitUntil(lambda: switch.url_label.isVisible())
    assert (window.width(), window.height()) == size  # nothing forced the window wider
    inside = global_rect(window)
    new_chat = global_rect(window.conversation_list.new_button)
    for widget in (
        switch.url_label,
        switch.copy_url_button,
        switch.key_label,
        switch.copy_key_button,
        switch.count_label,
    ):
        assert widget.isVisible(), widget
        shown = global_rect(widget)
        assert inside.contains(shown), (widget, shown, inside)
        assert not shown.intersects(new_chat), widget
    assert switch.url_label.text() == switch.url
    switch.log_button.click()  # the request log open too: still the same window
    qtbot.waitUntil(lambda: switch.log_table.isVisible())
    assert (window.width(), window.height()) == size
    assert inside.contains(global_rect(switch.log_table))
    extension = window.toolbar.findChild(QToolButton, "qt_toolbar_ext_button")
    assert extension is None or not extension.isVisible()  # no "»" menu
    with qtbot.wait_signal(switch.state_changed, timeout=START_TIMEOUT_MS):
        qtbot.mouseClick(switch.toggle, LEFT)
    assert not switch.panel.isVisible()
    assert extension is None or not extension.isVisible()  # and none stays after switching off
    window.shutdown()


@pytest.fixture(scope="module")
def loaded_service(default_model_file: Path) -> Iterator[EngineService]:
    service = EngineService().start()
    service.load(EngineConfig(model_path=str(default_model_file), n_ctx=1024)).result()
    yield service
    service.stop()


def logged(switch: ApiSwitch) -> list[tuple[str, ...]]:
    table = switch.log_table
    return [
        tuple(table.item(row, column).text() for column in range(table.columnCount()))
        for row in range(table.rowCount())
    ]


def test_the_request_log_shows_route_status_and_tokens(
    qtbot: QtBot, loaded_service: EngineService, hearthside_home: Path
) -> None:
    switch = ApiSwitch(loaded_service)
    qtbot.addWidget(switch)
    switch.show()
    turn_on(qtbot, switch)
    url, key = switch.url, switch.api_key
    assert url is not None and key is not None
    client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
    reply = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "Say hello."}],
        temperature=0,
        max_tokens=6,
    )
    assert reply.usage is not None
    refused = httpx.get(f"{url}/models", timeout=10)  # no key
    assert refused.status_code == 401
    qtbot.waitUntil(lambda: len(logged(switch)) == 2, timeout=5000)
    newest, oldest = logged(switch)
    assert oldest[1:] == ("POST /v1/chat/completions", "200", str(reply.usage.completion_tokens))
    assert newest[1:] == ("GET /v1/models", "401", "–")
    assert len(oldest[0]) == len("12:34:56")
    assert not switch.log_table.isVisible()  # on demand
    switch.log_button.click()
    assert switch.log_table.isVisible()
    switch.stop()


def test_a_log_row_in_words() -> None:
    entry = FinishedRequest(0.0, "GET", "/v1/models", None, None, 0.1)
    assert log_row(entry)[1:] == ("GET /v1/models", "closed", "–")
