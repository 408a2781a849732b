"""Hub downloads against a real local HTTP hub: resume, verification, disk full, refusals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from hearthside.core.errors import ModelFileError, ModelStoreError
from hearthside.core.models.download import DownloadCancelled, download_model
from hearthside.core.models.hub import HubFile, HubFilePart, list_repo_gguf_files
from hearthside.core.models.hub_http import HubEndpoint, HubError, UnsafeURLError
from hearthside.core.models.store import FREE_SPACE_MARGIN_BYTES, ModelStore
from hearthside.core.paths import data_dir
from tests.hub_server import HubServer, write_llama_gguf
from tests.small_disk import small_tmpfs

pytestmark = pytest.mark.beside

REPO = "acme/tiny-llama-GGUF"
SPLIT_REPO = "acme/tiny-split-GGUF"
FILE = "Tiny-Llama-F32.gguf"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete 4.3 MB llama-style GGUF that llama.cpp loads."""
    [path] = write_llama_gguf(tmp_path_factory.mktemp("hub-files") / FILE)
    return path


@pytest.fixture(scope="module")
def split_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("hub-split")
    return write_llama_gguf(
        folder / "Tiny-Split-F32.gguf", hidden=128, feed_forward=256, split_max_tensors=6, seed=1
    )


@pytest.fixture
def hub(model_file: Path, split_files: list[Path]) -> Iterator[HubServer]:
    with HubServer() as server:
        server.state.add_file(REPO, FILE, model_file)
        for part in split_files:
            server.state.add_file(SPLIT_REPO, part.name, part)
        yield server


@pytest.fixture
def endpoint(hub: HubServer) -> HubEndpoint:
    return HubEndpoint(hub.url, allow_insecure_loopback=True)


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


# Most tests pass check_native=False: the first native load in a child process costs about a
# second and is checked by the full-download and split-model tests.


def only_file(endpoint: HubEndpoint, repo: str = REPO) -> HubFile:
    [hub_file] = list_repo_gguf_files(repo, endpoint=endpoint)
    return hub_file


def leftovers(store: ModelStore) -> list[str]:
    return sorted(path.name for path in store.downloads_dir.iterdir())


def model_files(store: ModelStore) -> list[str]:
    return sorted(path.name for path in store.models_dir.glob("*.gguf"))


# --- the happy path --------------------------------------------------------------------------


def test_a_full_download_is_verified_and_registered(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, model_file: Path
) -> None:
    hub_file = only_file(endpoint)
    reports: list[tuple[int, int]] = []

    record = download_model(
        hub_file, store, endpoint=endpoint, progress=lambda *r: reports.append(r)
    )

    assert record.id == "tiny-llama-f32"
    assert record.path == store.models_dir / "tiny-llama-f32.gguf"
    assert record.path.read_bytes() == model_file.read_bytes()
    assert (record.sha256, record.size_bytes) == (hub_file.sha256, model_file.stat().st_size)
    assert (record.source, record.quant, record.architecture) == (
        f"hub:{REPO}/{FILE}",
        "F32",
        "llama",
    )
    assert record.name == "Hub Test Llama 0 (F32)"
    assert store.list() == [record]
    assert reports[-1] == (record.size_bytes, record.size_bytes)
    assert [done for done, _ in reports] == sorted(done for done, _ in reports)
    assert record.path.stat().st_mode & 0o777 == 0o600
    assert leftovers(store) == []
    resolve, cdn = hub.state.requests[-2:]
    assert (resolve.status, cdn.status, cdn.range) == (302, 200, None)


def test_an_installed_model_is_not_downloaded_again(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore
) -> None:
    hub_file = only_file(endpoint)
    record = download_model(hub_file, store, endpoint=endpoint, check_native=False)
    sent_before = len(hub.state.file_requests())

    with pytest.raises(ModelStoreError, match=f"already installed as '{record.id}'"):
        download_model(hub_file, store, endpoint=endpoint, check_native=False)
    assert len(hub.state.file_requests()) == sent_before


# --- resume ----------------------------------------------------------------------------------


def test_an_interrupted_download_resumes_from_its_part_file(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, model_file: Path
) -> None:
    hub_file = only_file(endpoint)
    size = model_file.stat().st_size
    cut = 1_500_000
    hub.state.cut_after_bytes = cut

    with pytest.raises(HubError, match="stopped early") as raised:
        download_model(hub_file, store, endpoint=endpoint, check_native=False)
    assert "run the same command again" in (raised.value.hint or "").lower()
    assert store.list() == []
    [part, note] = [store.downloads_dir / name for name in leftovers(store)]
    assert part.stat().st_size == cut
    assert note.name == part.name + ".json"

    record = download_model(hub_file, store, endpoint=endpoint, check_native=False)

    first, second = hub.state.file_requests()
    assert (first.status, first.body_bytes) == (200, cut)
    assert (second.range, second.status, second.body_bytes) == (f"bytes={cut}-", 206, size - cut)
    assert record.path.read_bytes() == model_file.read_bytes()
    assert leftovers(store) == []


def test_a_server_that_ignores_range_gets_a_clean_restart(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, model_file: Path
) -> None:
    hub_file = only_file(endpoint)
    hub.state.cut_after_bytes = 2 * MiB
    with pytest.raises(HubError):
        download_model(hub_file, store, endpoint=endpoint, check_native=False)
    hub.state.ignore_range = True

    record = download_model(hub_file, store, endpoint=endpoint, check_native=False)

    second = hub.state.file_requests()[-1]
    assert (second.range, second.status) == (f"bytes={2 * MiB}-", 200)
    assert second.body_bytes == model_file.stat().st_size
    assert record.path.read_bytes() == model_file.read_bytes()  # not 2 MiB of it twice


def test_cancel_keeps_what_arrived_and_the_next_run_resumes(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, model_file: Path
) -> None:
    hub_file = only_file(endpoint)
    cancel = threading.Event()

    def cancel_after_a_mebibyte(done: int, _total: int) -> None:
        if done >= MiB:
            cancel.set()

    with pytest.raises(DownloadCancelled, match="is kept"):
        download_model(
            hub_file,
            store,
            endpoint=endpoint,
            progress=cancel_after_a_mebibyte,
            cancel=cancel,
            check_native=False,
        )
    [part_name, _note] = leftovers(store)
    kept = (store.downloads_dir / part_name).stat().st_size
    assert MiB <= kept < model_file.stat().st_size
    assert store.list() == []

    record = download_model(hub_file, store, endpoint=endpoint, check_native=False)
    assert hub.state.file_requests()[-1].range == f"bytes={kept}-"
    assert record.sha256 == hub_file.sha256


def test_a_part_file_for_other_bytes_is_not_resumed(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, model_file: Path
) -> None:
    hub_file = only_file(endpoint)
    hub.state.cut_after_bytes = MiB
    with pytest.raises(HubError):
        download_model(hub_file, store, endpoint=endpoint, check_native=False)
    # The repo changed meanwhile: the same file name now has other bytes.
    changed = HubFile(REPO, (HubFilePart(FILE, hub_file.size_bytes, "0" * 64),), "F32")

    with pytest.raises(ModelFileError, match="did not match the sha256"):
        download_model(changed, store, endpoint=endpoint, check_native=False)
    assert hub.state.file_requests()[-1].range is None  # started afresh, no Range


# --- verification ----------------------------------------------------------------------------


def test_a_corrupted_download_is_rejected_and_leaves_nothing(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore
) -> None:
    hub.state.corrupt_offset = 3 * MiB

    with pytest.raises(ModelFileError, match="did not match the sha256") as raised:
        download_model(only_file(endpoint), store, endpoint=endpoint)

    assert "download it afresh" in (raised.value.hint or "")
    assert store.list() == []
    assert model_files(store) == []
    assert leftovers(store) == []


def test_without_a_listed_sha256_the_hubs_linked_etag_still_catches_corruption(
    model_file: Path, store: ModelStore
) -> None:
    with HubServer() as hub:
        hub.state.add_file(REPO, FILE, model_file, list_sha256=False)
        endpoint = HubEndpoint(hub.url, allow_insecure_loopback=True)
        hub_file = only_file(endpoint)
        assert hub_file.sha256 is None
        hub.state.corrupt_offset = 100

        with pytest.raises(ModelFileError, match="did not match the sha256"):
            download_model(hub_file, store, endpoint=endpoint, check_native=False)
        hub.state.corrupt_offset = None
        record = download_model(hub_file, store, endpoint=endpoint, check_native=False)

    assert record.path.read_bytes() == model_file.read_bytes()


# --- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize("filename", ["../evil.gguf", "/etc/evil.gguf", "a/../../evil.gguf"])
def test_hostile_file_names_are_refused_before_any_request(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore, filename: str
) -> None:
    hostile = HubFile(REPO, (HubFilePart(filename, 10, None),), None)

    with pytest.raises(HubError, match="not a file name Hearthside downloads"):
        download_model(hostile, store, endpoint=endpoint, check_native=False)
    assert hub.state.requests == []


def test_a_redirect_to_a_forbidden_host_registers_nothing(
    hub: HubServer, endpoint: HubEndpoint, store: ModelStore
) -> None:
    hub_file = only_file(endpoint)
    hub.state.redirect_location = "http://169.254.169.254/latest/meta-data"

    with pytest.raises(UnsafeURLError, match="refused to download"):
        download_model(hub_file, store, endpoint=endpoint, check_native=False)

    assert hub.state.file_requests() == []
    assert store.list() == []
    assert model_files(store) == []


# --- split models ----------------------------------------------------------------------------


def test_a_split_model_downloads_every_part_and_llama_cpp_loads_it(
    endpoint: HubEndpoint, store: ModelStore, split_files: list[Path]
) -> None:
    hub_file = only_file(endpoint, SPLIT_REPO)
    assert hub_file.filenames == tuple(part.name for part in split_files)

    record = download_model(hub_file, store, endpoint=endpoint)

    assert record.part_count == 2
    assert record.size_bytes == sum(part.stat().st_size for part in split_files)
    assert model_files(store) == [
        "tiny-split-f32-00001-of-00002.gguf",
        "tiny-split-f32-00002-of-00002.gguf",
    ]
    assert [p.read_bytes() for p in store.files_of(record)] == [p.read_bytes() for p in split_files]
    model = llama_cpp.Llama(str(record.path), n_ctx=64, verbose=False)
    try:
        completion = model.create_completion("hi", max_tokens=4, temperature=0.0)
    finally:
        model.close()
    assert completion["usage"]["completion_tokens"] >= 1

    store.remove(record.id)
    assert model_files(store) == []


# --- a full disk -----------------------------------------------------------------------------


def test_too_little_space_is_refused_before_the_transfer(
    hub: HubServer, endpoint: HubEndpoint, hearthside_home: Path
) -> None:
    with small_tmpfs(hearthside_home, 8), ModelStore(data_dir()) as store:
        with pytest.raises(ModelStoreError, match="Not enough free disk space") as raised:
            download_model(only_file(endpoint), store, endpoint=endpoint)
        assert str(store.models_dir) in raised.value.message
        assert hub.state.file_requests() == []


def test_a_disk_that_fills_up_mid_download_is_reported_and_resumable(
    hub: HubServer, endpoint: HubEndpoint, hearthside_home: Path, model_file: Path
) -> None:
    size_mib = FREE_SPACE_MARGIN_BYTES // MiB + 16
    with small_tmpfs(hearthside_home, size_mib), ModelStore(data_dir()) as store:
        filler = hearthside_home / "another program's file"

        def another_program_fills_the_disk(done: int, _total: int) -> None:
            if done >= MiB and not filler.exists():
                free = os.statvfs(hearthside_home).f_bavail * os.statvfs(hearthside_home).f_frsize
                filler.write_bytes(b"\0" * (free - 512 * 1024))

        with pytest.raises(ModelStoreError, match="ran out of space") as raised:
            download_model(
                only_file(endpoint),
                store,
                endpoint=endpoint,
                progress=another_program_fills_the_disk,
                check_native=False,
            )
        assert str(store.downloads_dir) in raised.value.message
        assert "is kept in" in (raised.value.hint or "")
        assert store.list() == []
        [part_name, _note] = leftovers(store)
        kept = (store.downloads_dir / part_name).stat().st_size
        assert MiB <= kept < model_file.stat().st_size

        filler.unlink()
        record = download_model(only_file(endpoint), store, endpoint=endpoint)
        assert hub.state.file_requests()[-1].range == f"bytes={kept}-"
        assert record.path.read_bytes() == model_file.read_bytes()


_LIMITED_CHILD = """
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from hearthside.core.errors import ModelStoreError
from hearthside.core.models.download import download_model
from hearthside.core.models.hub import list_repo_gguf_files
from hearthside.core.models.hub_http import HubEndpoint
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir

endpoint = HubEndpoint({url!r}, allow_insecure_loopback=True)
[hub_file] = list_repo_gguf_files({repo!r}, endpoint=endpoint)
with ModelStore(data_dir()) as store:
    try:
        download_model(hub_file, store, endpoint=endpoint, check_native=False)
    except ModelStoreError as exc:
        print(exc.user_text())
        sys.exit(3)
"""


def test_a_file_size_limit_is_reported_and_the_part_kept(hub: HubServer, store: ModelStore) -> None:
    limit = 2 * MiB + 12345
    script = _LIMITED_CHILD.format(limit=limit, url=hub.url, repo=REPO)

    child = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert child.returncode == 3, child.stderr
    assert "would not let Tiny-Llama-F32.gguf grow past" in child.stdout
    assert "run the same command again to resume" in child.stdout
    [part_name, _note] = leftovers(store)
    assert (store.downloads_dir / part_name).stat().st_size == limit
    assert store.list() == []
