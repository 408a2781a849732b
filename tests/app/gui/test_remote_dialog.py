"""The "Connect to a server" dialog, offscreen, against a small real HTTP server on loopback
that answers `/v1/models` like vLLM (Bearer key required, `max_model_len` in each card).
The remote engine itself is tested against llama-cpp-python's server in
tests/core/engine/test_remote.py."""

from __future__ import annotations

import json
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from hearthside.app.gui.remote_dialog import FIRST_LISTED, RemoteDialog
from hearthside.core.engine.remotes import RemoteRegistry

pytestmark = [pytest.mark.gui, pytest.mark.beside]

KEY = "vllm-key-abcdef123"
MODELS = ["Qwen/Qwen3-32B-AWQ", "meta-llama/Llama-3.1-8B-Instruct"]
ANSWER_MS = 10_000


class _VllmLikeModels(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            body = {"error": {"message": "Unauthorized", "type": "AuthenticationError"}}
            self._send(401, body)
            return
        cards = [{"id": m, "object": "model", "max_model_len": 32768} for m in MODELS]
        self._send(200, {"object": "list", "data": cards})

    def _send(self, status: int, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _VllmLikeModels)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture()
def dialog(qtbot: QtBot) -> RemoteDialog:
    shown = RemoteDialog()
    qtbot.addWidget(shown)
    return shown


def fill(dialog: RemoteDialog, name: str, url: str, key: str) -> None:
    dialog.name_edit.setText(name)
    dialog.url_edit.setText(url)
    dialog.key_edit.setText(key)


def test_testing_lists_the_models_and_save_keeps_the_key_private(
    dialog: RemoteDialog, qtbot: QtBot, server_url: str, hearthside_home: Path
) -> None:
    fill(dialog, "gpu-box", server_url, KEY)
    dialog.test_connection()
    qtbot.waitUntil(dialog.test_button.isEnabled, timeout=ANSWER_MS)
    assert dialog.status_label.text() == "Connected: the server offers 2 models."
    items = [dialog.model_box.itemText(i) for i in range(dialog.model_box.count())]
    assert items == [FIRST_LISTED, *MODELS]

    dialog.model_box.setCurrentText(MODELS[1])
    with qtbot.waitSignal(dialog.accepted):
        dialog.save()
    remote = RemoteRegistry().get("gpu-box")
    assert (remote.base_url, remote.model, remote.has_key) == (f"{server_url}/v1", MODELS[1], True)
    key_file = hearthside_home / "remote-keys" / "gpu-box.key"
    assert key_file.read_text().strip() == KEY
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600


def test_a_wrong_key_is_reported_without_showing_it(
    dialog: RemoteDialog, qtbot: QtBot, server_url: str
) -> None:
    fill(dialog, "gpu-box", server_url, "wrong-key-123456")
    dialog.test_connection()
    qtbot.waitUntil(dialog.test_button.isEnabled, timeout=ANSWER_MS)
    assert "rejected the key" in dialog.status_label.text()
    assert "wrong-key" not in dialog.status_label.text()
    assert dialog.model_box.count() == 1  # nothing listed


def test_a_bad_address_or_name_is_explained_and_nothing_is_saved(
    dialog: RemoteDialog, qtbot: QtBot
) -> None:
    fill(dialog, "box", "192.168.1.20:8000", "")
    dialog.test_connection()
    assert "is not a server address" in dialog.status_label.text()
    fill(dialog, "", "http://192.168.1.20:8000", "")
    with qtbot.assertNotEmitted(dialog.accepted):
        dialog.save()
    assert "cannot be a remote's name" in dialog.status_label.text()
    assert RemoteRegistry().all() == []
