"""The window's chat and a Local API client stream at the same time: with two slots the
engine decodes both replies together, so neither waits for the other to finish."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import MainWindow
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from tests.app.gui.window_helpers import open_window, use_settings
from tests.core.server.test_api import KEY, free_port

pytestmark = pytest.mark.gui

STORY = "Tell me a long story about a lighthouse keeper."
REPLY_TOKENS = 160


@pytest.fixture
def window(
    qapp: QApplication, chat_model_file: Path, hearthside_home: Path
) -> Iterator[MainWindow]:
    with open_window(hearthside_home, str(chat_model_file), n_ctx=1024, parallel=2) as opened:
        yield opened


def stream_from_api(base_url: str, stamps: list[float], started: threading.Event) -> None:
    body = {
        "model": "default",
        "messages": [{"role": "user", "content": "Write a long poem about the sea."}],
        "max_tokens": REPLY_TOKENS,
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", f"{base_url}/chat/completions", json=body, headers=headers, timeout=120
    ) as response:
        started.set()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                stamps.append(time.perf_counter())


def seconds_with_text(stamps: list[float], origin: float) -> set[int]:
    return {int(stamp - origin) for stamp in stamps}


def test_the_window_keeps_streaming_while_an_api_client_streams(
    window: MainWindow, qtbot: QtBot
) -> None:
    assert window.service is not None and window.service.slots == 2
    controller = ServerController(
        ServerSettings(port=free_port(), api_key=KEY, model_id="default"), window.service
    )
    controller.start()
    try:
        use_settings(window, max_tokens=REPLY_TOKENS)
        window_stamps: list[float] = []
        window.bridge.text_flushed.connect(lambda _text: window_stamps.append(time.perf_counter()))
        api_stamps: list[float] = []
        api_started = threading.Event()
        client = threading.Thread(
            target=stream_from_api, args=(controller.url, api_stamps, api_started)
        )
        origin = time.perf_counter()
        client.start()
        assert window.session.send(STORY)
        qtbot.waitUntil(lambda: window.session.mode == "idle", timeout=180_000)
        client.join(180)
    finally:
        controller.stop()
    assert len(window_stamps) >= 5 and len(api_stamps) >= 20
    both = seconds_with_text(window_stamps, origin) & seconds_with_text(api_stamps, origin)
    assert len(both) >= 2, (sorted(seconds_with_text(window_stamps, origin)), both)
