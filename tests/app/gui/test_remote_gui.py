"""A remote server in the window, offscreen: saved through "Connect to a server…" on the Models
page, chatted with (the reply streams into the view), served by the Local API as a proxy to the
real `openai` client, and a dead address reported in plain words. The peer is llama-cpp-python's
own server (`python -m llama_cpp.server`) on the default model, in its own process."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import MODELS_PAGE, PLAN_PAGE, MainWindow, remote_config_of
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.remote import DEFAULT_REMOTE_N_CTX
from hearthside.core.engine.remotes import RemoteRegistry
from hearthside.core.engine.service import EngineService
from tests.app.gui.window_helpers import use_settings
from tests.remote_peer import ServerProcess, free_port, llama_cpp_server

pytestmark = [pytest.mark.gui, pytest.mark.beside]

PEER_KEY = "gui-peer-key-0123456789"
QUESTION = "What is the capital of France?"
ANSWER_MS = 60_000  # one short greedy reply from a one-thread server on busy shared cores
CONNECT_MS = 20_000
LEFT = Qt.MouseButton.LeftButton
# The Plan page probes when first shown; a probe that fails at once keeps its worker short.
FAILING_PROBE = (sys.executable, "-c", "raise SystemExit(3)")


@pytest.fixture(scope="module")
def peer(default_model_file: Path) -> Iterator[ServerProcess]:
    with llama_cpp_server(default_model_file, PEER_KEY) as server:
        yield server


@pytest.fixture()
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    service = EngineService().start()
    shown = MainWindow(service, probe_command=FAILING_PROBE)
    qtbot.addWidget(shown)
    shown.show()
    shown.open_history()  # no local model: only the remote is loaded in these tests
    yield shown
    shown.close()
    service.stop()


def connect_through_dialog(window: MainWindow, qtbot: QtBot, peer: ServerProcess) -> None:
    """Models page → "Connect to a server…" → test → save → "Chat with it"; waits until the
    window has connected."""
    window.show_page(MODELS_PAGE)
    page = window.models_page
    qtbot.mouseClick(page.connect_button, LEFT)
    dialog = page._remote_dialog
    assert dialog is not None and dialog.isVisible()
    dialog.name_edit.setText("peer")
    dialog.url_edit.setText(peer.base_url)
    dialog.key_edit.setText(PEER_KEY)
    qtbot.mouseClick(dialog.test_button, LEFT)
    qtbot.waitUntil(dialog.test_button.isEnabled, timeout=CONNECT_MS)
    assert dialog.status_label.text() == "Connected: the server offers 1 model."
    with qtbot.waitSignal(dialog.accepted):
        dialog.save()

    assert page.remote_names == ["peer"]
    assert page.selected_remote() == "peer"
    row = page.remote_list.item(0).text()
    assert row.startswith("peer — ") and f"at {peer.base_url}" in row and "(remote, key" in row
    with qtbot.waitSignal(window.bridge.load_finished, timeout=CONNECT_MS):
        qtbot.mouseClick(page.remote_chat_button, LEFT)


def test_a_saved_remote_chats_and_its_reply_streams_into_the_view(
    window: MainWindow, qtbot: QtBot, peer: ServerProcess
) -> None:
    connect_through_dialog(window, qtbot, peer)

    loaded = window.bridge.loaded_model
    remote = remote_config_of(loaded)
    assert loaded is not None and remote is not None and loaded.name == "peer"
    served_model = remote.model
    assert served_model  # the server's own id for its model
    assert window.model_label.text() == f"Remote: peer ({served_model}) at {peer.base_url}"
    # llama-cpp-python's server does not report its context; the gauge uses the fallback.
    assert window.context_label.text() == f"context 0 / {DEFAULT_REMOTE_N_CTX} tokens"

    use_settings(window, max_tokens=12)
    pieces: list[str] = []
    window.bridge.text_flushed.connect(pieces.append)
    with qtbot.waitSignal(window.bridge.reply_finished, timeout=ANSWER_MS) as finished:
        assert window.session.send(QUESTION)
    result: GenerationResult = finished.args[0]
    assert result.text.strip(), "the remote model gave an empty answer"
    assert "".join(pieces) == result.text  # every piece reached the view through the bridge
    assert result.metrics.completion_tokens > 0
    first_word = result.text.split()[0]  # the view renders Markdown; words survive it
    qtbot.waitUntil(lambda: first_word in window.chat_pane.view.toPlainText())
    assert QUESTION in window.chat_pane.view.toPlainText()

    window.show_page(PLAN_PAGE)
    assert f"runs on the server at {peer.base_url}" in window.message_bar.text
    qtbot.waitUntil(lambda: not window.plan_page.spinner.isVisible(), timeout=CONNECT_MS)


def test_the_local_api_is_a_proxy_over_the_remote(
    window: MainWindow, qtbot: QtBot, peer: ServerProcess
) -> None:
    connect_through_dialog(window, qtbot, peer)
    remote = remote_config_of(window.bridge.loaded_model)
    assert remote is not None and remote.model
    remote_model = remote.model

    switch = window.api_switch
    switch.port_box.setValue(free_port())
    with qtbot.waitSignal(switch.state_changed, timeout=CONNECT_MS):
        qtbot.mouseClick(switch.toggle, LEFT)
    assert switch.running and switch.url is not None and switch.api_key is not None
    assert switch.api_key != PEER_KEY  # clients use our key; the remote's stays with us

    client = openai.OpenAI(base_url=switch.url, api_key=switch.api_key, max_retries=0)
    answer = client.chat.completions.create(
        model="anything",
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=8,
        temperature=0,
    )
    assert answer.model == remote_model
    assert answer.choices[0].message.content
    assert [model.id for model in client.models.list()] == [remote_model]
    switch.stop()


def test_a_dead_server_is_reported_in_plain_words_and_can_be_removed(
    window: MainWindow, qtbot: QtBot, hearthside_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        dead_url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    RemoteRegistry().add("gone", dead_url, api_key="some-key-123456")
    window.show_page(MODELS_PAGE)  # the page reads the saved servers when it is shown
    page = window.models_page
    assert page.remote_names == ["gone"]
    page.select_remote("gone")

    with qtbot.waitSignal(window.bridge.load_failed, timeout=CONNECT_MS):
        qtbot.mouseClick(page.remote_chat_button, LEFT)
    text = window.message_bar.text
    assert text.startswith("Could not connect to the server gone. ")
    assert f"The server at {dead_url} isn't answering — is it running?" in text
    assert "Traceback" not in text and "httpx" not in text
    assert window.model_label.text() == "No model loaded"

    window.show_page(MODELS_PAGE)
    page.select_remote("gone")
    monkeypatch.setattr(QMessageBox, "question", lambda *_args: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(page.remote_remove_button, LEFT)
    assert page.remote_names == [] and page.remotes_empty.isVisibleTo(page)
    assert RemoteRegistry().all() == []
    assert not (hearthside_home / "remote-keys" / "gone.key").exists()
