"""The window's Settings: parallel requests chosen in the dialog, kept in window.ini across
runs, and applied to the next model the window prepares (the real planner, the real default
model, this machine's probe; nothing is loaded into the engine)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QSettings
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.model_loader import LoadOptions, prepare_model
from hearthside.app.gui.settings_dialog import (
    APPLIES_NOTE,
    AUTO_TEXT,
    SettingsDialog,
    read_parallel,
    write_parallel,
)
from hearthside.app.gui.window_state import PARALLEL_KEY, gui_settings
from hearthside.autotune.planner import DEFAULT_PARALLEL
from hearthside.core.models.hub_http import HubEndpoint
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.settings import SETTINGS_FILE_NAME, Settings

pytestmark = [pytest.mark.gui, pytest.mark.beside]
WindowFactory = Callable[..., MainWindow]


@pytest.fixture
def settings(hearthside_home: Path) -> QSettings:
    hearthside_home.mkdir(parents=True, exist_ok=True)
    return gui_settings(hearthside_home)


@pytest.fixture
def make_window(qtbot: QtBot, settings: QSettings) -> Iterator[WindowFactory]:
    windows: list[MainWindow] = []

    def make(options: LoadOptions | None = None) -> MainWindow:
        window = MainWindow(None, settings=settings, load_options=options)
        qtbot.addWidget(window)
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.shutdown()


def test_the_stored_value_round_trips_and_a_bad_one_means_auto(settings: QSettings) -> None:
    assert read_parallel(settings) is None  # nothing stored: Auto
    write_parallel(settings, 3)
    assert read_parallel(settings) == 3
    write_parallel(settings, None)
    assert settings.value(PARALLEL_KEY) in (0, "0") and read_parallel(settings) is None
    for hand_edited in ("many", "99", "-2"):
        settings.setValue(PARALLEL_KEY, hand_edited)
        assert read_parallel(settings) is None


def test_the_dialog_offers_auto_and_one_to_eight(qtbot: QtBot) -> None:
    dialog = SettingsDialog(None)
    qtbot.addWidget(dialog)
    box = dialog.parallel_box
    assert [box.itemText(i) for i in range(box.count())][:2] == [AUTO_TEXT, "1 (one at a time)"]
    assert box.count() == 9 and box.itemData(8) == 8
    assert dialog.parallel() is None
    assert APPLIES_NOTE in box.toolTip() and dialog.note.text() == APPLIES_NOTE
    box.setCurrentIndex(box.findData(3))
    assert dialog.parallel() == 3
    assert SettingsDialog(5).parallel() == 5


def test_the_choice_is_kept_and_applies_to_the_next_load(
    make_window: WindowFactory, settings: QSettings
) -> None:
    window = make_window()
    assert window.load_options.n_parallel is None  # Auto
    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog) and dialog.parallel() is None
    dialog.parallel_box.setCurrentIndex(dialog.parallel_box.findData(2))
    dialog.accept()
    assert window.load_options.n_parallel == 2
    assert read_parallel(settings) == 2
    assert window.message_bar.text == f"Parallel requests: 2. {APPLIES_NOTE}"
    again = make_window()
    assert again.load_options.n_parallel == 2  # a restart keeps it
    flagged = make_window(LoadOptions(n_parallel=5))
    assert flagged.load_options.n_parallel == 5  # --parallel / HEARTHSIDE_PARALLEL win
    again.apply_settings(None)
    assert again.load_options.n_parallel is None and read_parallel(settings) is None


@pytest.fixture
def model_id(default_model_file: Path) -> str:
    with ModelStore(data_dir()) as store:
        record = store.add(default_model_file, link=True, name="Gemma (test)", check_native=False)
    return record.id


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> HardwareProfile:
    return probe_in_subprocess(models_dir(tmp_path_factory.mktemp("probe-home")))


def test_the_window_prepares_models_with_the_setting(
    model_id: str, profile: HardwareProfile
) -> None:
    chosen = prepare_model(model_id, LoadOptions(n_ctx=1024, n_parallel=2), profile=lambda: profile)
    assert chosen.config.n_parallel == 2 and chosen.config.total_context == 2048
    auto = prepare_model(model_id, LoadOptions(n_ctx=1024), profile=lambda: profile)
    assert auto.config.n_parallel == DEFAULT_PARALLEL  # a 270M model leaves room for 4


def test_context_threads_hub_port_and_default_model_are_kept_where_each_lives(
    make_window: WindowFactory,
    default_model_file: Path,
    chat_model_file: Path,
    hearthside_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ModelStore(data_dir()) as store:
        first = store.add(default_model_file, link=True, name="First", check_native=False)
        second = store.add(chat_model_file, link=True, name="Second", check_native=False)
        store.set_default(first.id)
    window = make_window()
    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.data_label.text() == str(hearthside_home)
    assert dialog.model_box.currentData() == first.id
    dialog.context_box.setValue(8192)
    dialog.threads_box.setValue(2)
    dialog.port_box.setValue(9123)
    dialog.hub_edit.setText("https://hub.example.org")
    dialog.token_edit.setText("hf_secret")
    dialog.model_box.setCurrentIndex(dialog.model_box.findData(second.id))
    dialog.accept()

    text = window.message_bar.text
    assert text.startswith("Context: 8192 tokens; Threads: 2; Local API port: 9123")
    assert "Hub address: https://hub.example.org; Hub access token: saved" in text
    assert text.endswith(APPLIES_NOTE) and "hf_secret" not in text
    assert (window.load_options.n_ctx, window.load_options.n_threads) == (8192, 2)
    assert window.api_switch.port_box.value() == 9123
    stored = json.loads((hearthside_home / SETTINGS_FILE_NAME).read_text())
    assert stored == {
        "context_size": 8192,
        "threads": 2,
        "hub_endpoint": "https://hub.example.org",
        "hub_token": "hf_secret",
    }
    assert oct((hearthside_home / SETTINGS_FILE_NAME).stat().st_mode & 0o777) == "0o600"
    settings = Settings()  # what the CLI, the hub dialog and the next window read
    assert (settings.context_size, settings.threads) == (8192, 2)
    assert HubEndpoint.from_settings().url == "https://hub.example.org"
    assert LoadOptions.from_settings(settings).n_ctx == 8192
    with ModelStore(data_dir()) as store:
        default = store.default()
    assert default is not None and default.id == second.id
    monkeypatch.setenv("HEARTHSIDE_CONTEXT_SIZE", "1024")  # the environment still wins
    assert Settings().context_size == 1024


def test_an_unsafe_hub_address_is_refused_and_nothing_is_saved(
    make_window: WindowFactory, hearthside_home: Path
) -> None:
    window = make_window()
    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    dialog.hub_edit.setText("http://10.0.0.5")
    dialog.context_box.setValue(2048)
    dialog.accept()
    assert window.message_bar.text.startswith("The settings were not saved.")
    assert "https://" in window.message_bar.text
    assert not (hearthside_home / SETTINGS_FILE_NAME).exists()
    assert window.load_options.n_ctx == 4096


def test_the_api_idle_unload_is_kept_in_seconds_and_used_when_the_api_starts(
    make_window: WindowFactory, hearthside_home: Path, tmp_path: Path
) -> None:
    from hearthside.app.gui.api_switch import start_api
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.service import EngineService
    from tests.core.server.test_api import free_port
    from tests.gguf_samples import write_tiny_gguf

    window = make_window()
    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.idle_box.text() == "Never"
    dialog.idle_box.setValue(10)
    dialog.accept()
    assert (
        "Unload idle API models: after 10 minutes (from the next time the API is turned on)"
        in window.message_bar.text
    )
    stored = json.loads((hearthside_home / SETTINGS_FILE_NAME).read_text())
    assert stored == {"idle_unload_s": 600}
    assert Settings().idle_unload_s == 600

    model = write_tiny_gguf(tmp_path / "chat.gguf", loadable=True)
    with EngineService() as service:
        service.load(EngineConfig(model_path=str(model), n_ctx=256)).result()
        controller = start_api(service, free_port())
        try:
            assert controller.pool.idle_unload_s == 600
            assert not controller.pool.unload_served_when_idle  # the window's model stays
        finally:
            controller.stop()

    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.idle_box.value() == 10
    dialog.idle_box.setValue(0)  # Never
    dialog.accept()
    assert "Unload idle API models: never" in window.message_bar.text
    assert "idle_unload_s" not in json.loads((hearthside_home / SETTINGS_FILE_NAME).read_text())


def test_the_chat_model_unloads_too_only_when_ticked_and_only_with_an_idle_time(
    make_window: WindowFactory, hearthside_home: Path
) -> None:
    window = make_window()
    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    assert not dialog.idle_chat_box.isChecked()
    assert not dialog.idle_chat_box.isEnabled()  # "Never" above: nothing to unload after
    dialog.idle_box.setValue(5)
    assert dialog.idle_chat_box.isEnabled()
    dialog.idle_chat_box.setChecked(True)
    dialog.accept()
    assert "Unload the idle chat model too: yes" in window.message_bar.text
    stored = json.loads((hearthside_home / SETTINGS_FILE_NAME).read_text())
    assert stored == {"idle_unload_s": 300, "idle_unload_chat": True}
    assert Settings().idle_unload_chat

    window.edit_settings()
    dialog = window.settings_dialog
    assert isinstance(dialog, SettingsDialog)
    assert dialog.idle_chat_box.isChecked() and dialog.idle_chat_box.isEnabled()
    dialog.idle_chat_box.setChecked(False)
    dialog.accept()
    assert "Unload the idle chat model too: no" in window.message_bar.text
    assert json.loads((hearthside_home / SETTINGS_FILE_NAME).read_text()) == {"idle_unload_s": 300}
