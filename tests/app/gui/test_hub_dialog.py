"""The hub dialog against a real HTTP hub on loopback (tests/hub_server.py): real search and
listing, the real planner on this machine's probed profile (a GPU profile only where this
machine has none), real downloads into a real model store, and Qt widgets offscreen."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from hearthside.app.gui.hub_dialog import (
    HubDialog,
    TransferRate,
    catalog_match,
    eta_text,
    progress_text,
    staged_for_screenshot,
)
from hearthside.app.gui.models_page import ModelsPage
from hearthside.core.models.hub_http import HubEndpoint
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.probe.profile import EngineDevice, EngineInfo, GpuInfo, HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.units import format_bytes
from tests.fixtures.synthetic_gguf import write_synthetic_gguf
from tests.hub_server import HubRepo, HubServer
from tests.small_disk import small_tmpfs

pytestmark = [pytest.mark.gui, pytest.mark.beside]

TINY_REPO = "acme/Tiny-Dense-GGUF"
TINY_FILE = "Tiny-Dense-Q4_0.gguf"
GIANT_FILE = "Giant-1T-Q8_0.gguf"
CATALOG_REPO = "acme/Qwen2.5-14B-Instruct-GGUF"
CATALOG_FILE = "qwen2.5-14b-instruct-q4_k_m.gguf"
GATED_REPO = "acme/Gated-Dense-GGUF"
MiB = 1024 * 1024
NETWORK_MS = 15_000
DOWNLOAD_MS = 60_000
LEFT = Qt.MouseButton.LeftButton


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 5.7 MB llama-shaped Q4_0 GGUF with random weights that llama.cpp loads."""
    folder = tmp_path_factory.mktemp("hub-dialog")
    return write_synthetic_gguf(folder / TINY_FILE, "tiny-dense", "Q4_0")


@pytest.fixture(scope="module")
def this_machine() -> HardwareProfile:
    return probe_hardware()


def listed_only(filename: str, size_bytes: int) -> dict[str, object]:
    """A file the hub lists but these tests never download (sizes no test machine holds)."""
    return {"rfilename": filename, "size": size_bytes, "lfs": {"size": size_bytes}}


@pytest.fixture
def hub(model_file: Path) -> Iterator[HubServer]:
    with HubServer() as server:
        state = server.state
        state.add_file(TINY_REPO, TINY_FILE, model_file)
        tiny = state.repos[TINY_REPO]
        tiny.extra_siblings.append(listed_only(GIANT_FILE, 1_100_000_000_000))
        tiny.downloads, tiny.likes = 12_345, 67
        state.add_file(GATED_REPO, TINY_FILE, model_file)
        state.repos[GATED_REPO].gated = True
        state.repos[GATED_REPO].downloads = 10
        state.repos[CATALOG_REPO] = HubRepo(
            extra_siblings=[listed_only(CATALOG_FILE, 8_990_000_000)], downloads=999
        )
        yield server


@pytest.fixture
def endpoint(hub: HubServer) -> HubEndpoint:
    return HubEndpoint(hub.url, allow_insecure_loopback=True)


def open_dialog(
    qtbot: QtBot, endpoint: HubEndpoint, profile: HardwareProfile | None = None
) -> HubDialog:
    dialog = HubDialog(data_dir(), endpoint=endpoint, profile=profile)
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.searched, timeout=NETWORK_MS):
        dialog.show()
    return dialog


def choose_repo(qtbot: QtBot, dialog: HubDialog, repo: str) -> None:
    with qtbot.waitSignal(dialog.listed, timeout=NETWORK_MS):
        dialog.select_repo(repo)


def choose_repo_with_badges(qtbot: QtBot, dialog: HubDialog, repo: str) -> None:
    with qtbot.waitSignal(dialog.badges_ready, timeout=NETWORK_MS):
        choose_repo(qtbot, dialog, repo)


def badge_of(dialog: HubDialog, filename: str) -> tuple[str, str]:
    index = next(i for i, f in enumerate(dialog.files) if filename in f.filenames)
    badge = dialog.badges[index]
    return badge.label, badge.tooltip


def download(qtbot: QtBot, dialog: HubDialog, filename: str) -> None:
    dialog.select_file(filename)
    assert dialog.download_button.isEnabled()
    with qtbot.waitSignal(dialog.download_ended, timeout=DOWNLOAD_MS):
        qtbot.mouseClick(dialog.download_button, LEFT)


def search_requests(hub: HubServer) -> list[str]:
    return [r.query.get("search", [""])[0] for r in hub.state.requests if r.path == "/api/models"]


# --- search ----------------------------------------------------------------------------------


def test_search_shows_the_served_repos_and_typing_narrows_them_once(
    qtbot: QtBot, hub: HubServer, endpoint: HubEndpoint, this_machine: HardwareProfile
) -> None:
    dialog = open_dialog(qtbot, endpoint, this_machine)

    assert [r.repo for r in dialog.repos] == [TINY_REPO, CATALOG_REPO, GATED_REPO]
    assert dialog.repo_table.item(0, 1).text() == "12 k"  # 12,345 downloads
    assert dialog.repo_table.item(2, 0).text() == f"{GATED_REPO}  (gated)"
    assert dialog.repo_table.item(0, 3).text() == "2025-08-14"

    with qtbot.waitSignal(dialog.searched, timeout=NETWORK_MS):
        qtbot.keyClicks(dialog.search_box, "tiny")

    assert [r.repo for r in dialog.repos] == [TINY_REPO]
    assert search_requests(hub) == ["", "tiny"]  # debounced: not t, ti, tin


# --- fit badges ------------------------------------------------------------------------------


def test_badges_come_from_the_planner_on_this_machine(qtbot: QtBot, endpoint: HubEndpoint) -> None:
    dialog = open_dialog(qtbot, endpoint)  # no profile given: it probes this machine itself

    choose_repo_with_badges(qtbot, dialog, TINY_REPO)

    assert [f.filename for f in dialog.files] == [TINY_FILE, GIANT_FILE]
    assert dialog.file_table.item(0, 1).text() == "Q4_0"
    assert dialog.file_table.item(1, 2).text() == "1024.5 GiB"  # 1.1 × 10^12 bytes
    tiny_label, tiny_why = badge_of(dialog, TINY_FILE)
    giant_label, giant_why = badge_of(dialog, GIANT_FILE)
    assert tiny_label == "≈ fits"  # no catalog model in the name: an estimate, and it says so
    assert "Needs about " in tiny_why and " MiB (context" in tiny_why  # under 1 GiB
    assert "of RAM for models" in tiny_why
    assert giant_label == "≈ won't fit"
    assert "Needs about 1" in giant_why and "Larger than this machine's memory" in giant_why
    assert "An estimate" in giant_why
    assert dialog.machine_label.text().startswith("Badges for this machine:")


def with_nvidia_gpu(
    profile: HardwareProfile,
    name: str = "NVIDIA GeForce RTX 4060",
    vram_gib: int = 8,
    bandwidth_gb_s: int = 272,
) -> HardwareProfile:
    """This machine plus the GPU it lacks, as the probe reports one, driven by the engine."""
    vram = vram_gib * 1024**3
    gpu = GpuInfo(
        vendor="nvidia",
        name=name,
        arch="sm_89" if "40" in name else "sm_86",
        vram_total_bytes=vram,
        vram_free_bytes=vram - 600 * MiB,
        memory_bandwidth_bytes_per_s=bandwidth_gb_s * 10**9,
    )
    engine = profile.engine or EngineInfo()
    device = EngineDevice("CUDA0", gpu.name, "gpu", vram, vram - 600 * MiB)
    engine = replace(engine, backends=("CPU", "CUDA"), gpu_offload=True, devices=(device,))
    return replace(profile, gpus=(gpu,), engine=engine)


def test_a_catalog_model_too_big_for_the_gpu_fits_with_offload(
    qtbot: QtBot, endpoint: HubEndpoint, this_machine: HardwareProfile
) -> None:
    dialog = open_dialog(qtbot, endpoint, with_nvidia_gpu(this_machine))

    choose_repo_with_badges(qtbot, dialog, CATALOG_REPO)

    label, why = badge_of(dialog, CATALOG_FILE)
    assert label == "fits with offload"  # the catalog knows Qwen2.5 14B: not an estimate
    assert "on GPU CUDA0" in why and "in RAM" in why
    assert "Qwen2.5 14B, from Hearthside's catalog" in why
    choose_repo_with_badges(qtbot, dialog, TINY_REPO)
    assert badge_of(dialog, TINY_FILE)[0] == "≈ fits"  # 5.7 MB: all of it on the GPU


def test_repo_names_map_to_catalog_models_by_whole_words() -> None:
    assert catalog_match("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF").id == "llama-3.1-8b"
    assert catalog_match("someone/Hermes-3-Llama-3.1-8B-GGUF").id == "llama-3.1-8b"
    assert catalog_match("unsloth/Qwen3-30B-A3B-Instruct-2507-GGUF").id == "qwen3-30b-a3b"
    assert catalog_match("someone/Llama-3.1-80B-GGUF") is None
    assert catalog_match(TINY_REPO) is None


# --- downloading -----------------------------------------------------------------------------


def test_a_download_from_the_models_page_registers_the_model_and_selects_it(
    qtbot: QtBot,
    hub: HubServer,
    monkeypatch: pytest.MonkeyPatch,
    this_machine: HardwareProfile,
    model_file: Path,
) -> None:
    monkeypatch.setenv("HEARTHSIDE_HUB_ENDPOINT", hub.url)
    monkeypatch.setenv("HEARTHSIDE_HUB_ALLOW_INSECURE_LOOPBACK", "1")
    page = ModelsPage()
    qtbot.addWidget(page)
    page.set_hardware_profile(this_machine)
    page.show()
    qtbot.mouseClick(page.hub_button, LEFT)
    dialog = page.open_hub_dialog()  # the one the button opened
    qtbot.waitUntil(lambda: bool(dialog.repos), timeout=NETWORK_MS)
    choose_repo(qtbot, dialog, TINY_REPO)

    with qtbot.waitSignal(page.models_changed, timeout=DOWNLOAD_MS):
        download(qtbot, dialog, TINY_FILE)

    with ModelStore(data_dir()) as store:
        [record] = store.list()
    assert record.source == f"hub:{TINY_REPO}/{TINY_FILE}"
    assert record.path.read_bytes() == model_file.read_bytes()
    assert page.selected_id() == record.id
    assert "Downloaded" in page.message
    assert not dialog.isVisible()

    # The same file again: nothing is fetched, the installed model is shown instead.
    fetched = len(hub.state.file_requests())
    page.table.clearSelection()
    dialog = page.open_hub_dialog()
    download(qtbot, dialog, TINY_FILE)
    assert "already installed" in dialog.message
    assert page.selected_id() == record.id
    assert len(hub.state.file_requests()) == fetched


def start_a_download_that_stalls(
    qtbot: QtBot, hub: HubServer, endpoint: HubEndpoint, profile: HardwareProfile
) -> HubDialog:
    """A download that has 2 MiB of the file when the hub stops sending."""
    dialog = open_dialog(qtbot, endpoint, profile)
    choose_repo(qtbot, dialog, TINY_REPO)
    dialog.select_file(TINY_FILE)
    hub.state.hold_after_bytes = 2 * MiB
    qtbot.mouseClick(dialog.download_button, LEFT)
    qtbot.waitUntil(hub.state.holding.is_set, timeout=NETWORK_MS)
    qtbot.waitUntil(lambda: "2 MiB of 5 MiB" in dialog.progress_label.text(), timeout=NETWORK_MS)
    return dialog


def test_cancel_keeps_what_arrived_and_download_again_resumes_from_it(
    qtbot: QtBot,
    hub: HubServer,
    endpoint: HubEndpoint,
    this_machine: HardwareProfile,
    model_file: Path,
) -> None:
    dialog = start_a_download_that_stalls(qtbot, hub, endpoint, this_machine)

    with qtbot.waitSignal(dialog.download_ended, timeout=DOWNLOAD_MS):
        qtbot.mouseClick(dialog.cancel_button, LEFT)
        hub.state.released.set()

    assert "is kept: press Download to resume" in dialog.message
    with ModelStore(data_dir()) as store:
        assert store.list() == []
        [part] = store.downloads_dir.glob("*.part")
    kept = part.stat().st_size
    assert 2 * MiB <= kept < model_file.stat().st_size

    lines: list[str] = []
    dialog.progress_changed.connect(lines.append)
    with qtbot.waitSignal(dialog.downloaded, timeout=DOWNLOAD_MS) as done:
        qtbot.mouseClick(dialog.download_button, LEFT)

    assert f"Resuming from {format_bytes(kept)}…" in lines
    resumed = hub.state.file_requests()[-1]
    missing = model_file.stat().st_size - kept
    assert (resumed.range, resumed.status, resumed.body_bytes) == (f"bytes={kept}-", 206, missing)
    assert done.args[0].path.read_bytes() == model_file.read_bytes()


def test_cancel_stops_a_stalled_download_promptly(
    qtbot: QtBot, hub: HubServer, endpoint: HubEndpoint, this_machine: HardwareProfile
) -> None:
    dialog = start_a_download_that_stalls(qtbot, hub, endpoint, this_machine)
    try:
        with qtbot.waitSignal(dialog.download_ended, timeout=3000):
            qtbot.mouseClick(dialog.cancel_button, LEFT)
    finally:
        hub.state.released.set()
        qtbot.waitUntil(lambda: not dialog.busy, timeout=DOWNLOAD_MS)


# --- errors in plain words -------------------------------------------------------------------


def test_a_gated_repo_asks_for_a_hub_token(
    qtbot: QtBot, endpoint: HubEndpoint, this_machine: HardwareProfile
) -> None:
    dialog = open_dialog(qtbot, endpoint, this_machine)
    choose_repo(qtbot, dialog, GATED_REPO)

    download(qtbot, dialog, TINY_FILE)

    assert "HTTP 401" in dialog.message
    assert "This model needs a hub token" in dialog.message
    assert "Hub access token" in dialog.message


def test_a_hub_that_is_down_gets_the_network_hint(
    qtbot: QtBot, this_machine: HardwareProfile
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    endpoint = HubEndpoint(f"http://127.0.0.1:{closed_port}", allow_insecure_loopback=True)

    dialog = open_dialog(qtbot, endpoint, this_machine)

    assert dialog.repos == []
    assert dialog.search_status.text() == "Search failed"
    assert "The hub could not be reached" in dialog.message
    assert "Check your connection, or the hub address in Settings" in dialog.message


def test_a_corrupted_download_says_so_and_keeps_nothing(
    qtbot: QtBot, hub: HubServer, endpoint: HubEndpoint, this_machine: HardwareProfile
) -> None:
    dialog = open_dialog(qtbot, endpoint, this_machine)
    choose_repo(qtbot, dialog, TINY_REPO)
    hub.state.corrupt_offset = 4096

    download(qtbot, dialog, TINY_FILE)

    assert "did not match the sha256" in dialog.message
    assert "corrupted in transit" in dialog.message and "download it again" in dialog.message
    with ModelStore(data_dir()) as store:
        assert store.list() == []
        assert list(store.downloads_dir.iterdir()) == []


def test_a_full_disk_is_refused_before_the_transfer(
    qtbot: QtBot,
    hub: HubServer,
    endpoint: HubEndpoint,
    this_machine: HardwareProfile,
    hearthside_home: Path,
) -> None:
    with small_tmpfs(hearthside_home, 8):
        dialog = open_dialog(qtbot, endpoint, this_machine)
        choose_repo(qtbot, dialog, TINY_REPO)

        download(qtbot, dialog, TINY_FILE)

        assert "Not enough free disk space" in dialog.message
        assert "Free at least" in dialog.message
        assert hub.state.file_requests() == []
        dialog.close()


# --- progress wording ------------------------------------------------------------------------


def test_progress_shows_speed_and_time_left_over_the_last_seconds() -> None:
    now = [100.0]
    rate = TransferRate(clock=lambda: now[0])
    for second in range(4):
        now[0] = 100.0 + second
        rate.add(second * 10_000_000)  # 10 × 10^6 bytes/s: 9.5 MiB/s

    text = progress_text(30_000_000, 630_000_000, 0, rate)

    assert text == "29 MiB of 601 MiB — 10 MiB/s — about 1 min left"
    assert progress_text(30_000_000, 630_000_000, 5_000_000, rate).startswith(
        "29 MiB of 601 MiB (resumed from 5 MiB)"
    )
    assert eta_text(3 * 3600 + 300) == "about 3 h 5 min left"


def test_the_screenshot_stage_shows_every_badge_without_the_network(
    qtbot: QtBot, this_machine: HardwareProfile
) -> None:
    # CPU-only, so that planning eight 70B files takes a moment (with a GPU, seconds).
    workstation = replace(this_machine, memory=replace(this_machine.memory, total_bytes=64 << 30))
    dialog = staged_for_screenshot(workstation)
    qtbot.addWidget(dialog)
    dialog.show()

    labels = [badge.label for badge in dialog.badges]
    assert labels == ["fits"] * 6 + ["won't fit"] * 2  # up to 53.9 GiB in 64 GiB of RAM
    assert "(resumed from 11.2 GiB) — 48 MiB/s — about 8 min left" in dialog.progress_label.text()
    assert dialog.search_status.text() == "4 repos"  # showing it searched nothing
