"""Downloading a model from the hub: resumable, verified, registered last (SECURITY.md).

Each file goes to `<models dir>/downloads/<name>.<key>.part`, with a small `.json` note of what
it is a part of. A rerun resumes it with `Range: bytes=N-`, and appends only when the hub
answers 206 with a Content-Range that starts at N and has the expected total; a 200 means the
server ignored the range, so the file is written again from the start. When every byte is there,
its size and sha256 (the hub's LFS sha256) are checked, it is made durable and renamed into the
models dir, validated, and only then registered.

What happens to a `.part`:
- cancelled, connection lost, disk full: kept, so the same command resumes it;
- wrong size or sha256, or not a GGUF: deleted, and the next run starts afresh.
The models dir's stale-part cleanup never looks in `downloads/`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import http.client
import json
import os
import re
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from hearthside.core.errors import HearthsideError, ModelFileError, ModelStoreError
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.hub import (
    HubFile,
    HubFilePart,
    resolve_url,
    split_part_info,
    validate_repo_filename,
    validate_repo_id,
    validate_revision,
)
from hearthside.core.models.hub_http import (
    HubEndpoint,
    HubError,
    HubResponse,
    connection_error,
    open_url,
    status_error,
)
from hearthside.core.models.store import (
    FREE_SPACE_MARGIN_BYTES,
    MODEL_SUFFIX,
    ModelRecord,
    ModelStore,
    ProgressCallback,
    commit_part_file,
    split_file_name,
)
from hearthside.core.units import format_bytes

__all__ = ["DownloadCancelled", "download_model", "partial_download_bytes"]

CHUNK_BYTES = 1024 * 1024
_CANCEL_POLL_S = 0.1
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_RESUME_HINT = "Run the same command again: the download resumes where it stopped."


class DownloadCancelled(HearthsideError):
    """The download was cancelled; what arrived is kept for a later resume."""


@dataclass(frozen=True)
class _PartPlan:
    part: HubFilePart
    url: str
    partial: Path  # downloads/<name>.<key>.part
    note: Path  # downloads/<name>.<key>.part.json

    def note_text(self, repo: str) -> str:
        return json.dumps(
            {
                "repo": repo,
                "filename": self.part.filename,
                "size_bytes": self.part.size_bytes,
                "sha256": self.part.sha256,
            },
            sort_keys=True,
        )


class _Progress:
    """Bytes done over the whole model, reported through the caller's callback."""

    def __init__(self, total_bytes: int, callback: ProgressCallback | None) -> None:
        self.total_bytes = total_bytes
        self.done_before_bytes = 0  # parts already finished
        self.callback = callback

    def report(self, part_done_bytes: int) -> None:
        if self.callback is not None:
            self.callback(self.done_before_bytes + part_done_bytes, self.total_bytes)

    def finish_part(self, part_bytes: int) -> None:
        self.done_before_bytes += part_bytes


# --- the entry point -------------------------------------------------------------------------


def download_model(
    hub_file: HubFile,
    store: ModelStore,
    *,
    endpoint: HubEndpoint | None = None,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    check_native: bool = True,
) -> ModelRecord:
    """Download every part of `hub_file`, verify it, and register it in `store`.

    `progress(done_bytes, total_bytes)` is called as bytes arrive (total 0 when the hub did
    not say); setting `cancel` stops the transfer soon after and raises DownloadCancelled.
    """
    hub = endpoint or HubEndpoint.from_settings()
    _check_names(hub_file)
    _refuse_installed(store, hub_file)
    plans = _plan(hub_file, store, hub)
    for plan in plans:
        _discard_if_foreign(plan, hub_file.repo)
    _check_free_space(store, plans)
    tracker = _Progress(hub_file.size_bytes or 0, progress)
    digests = []
    for plan in plans:
        digests.append(_fetch(plan, hub_file.repo, hub, tracker, cancel))
        tracker.finish_part(plan.partial.stat().st_size)
    return _install(store, hub_file, plans, digests[0], check_native)


def partial_download_bytes(store: ModelStore) -> int:
    """Bytes kept in unfinished downloads (what a user can reclaim by deleting them)."""
    return sum(path.stat().st_size for path in store.downloads_dir.glob("*.part"))


# --- planning --------------------------------------------------------------------------------


def _check_names(hub_file: HubFile) -> None:
    validate_repo_id(hub_file.repo)
    validate_revision(hub_file.revision)
    if not hub_file.parts:
        raise HubError("This hub file has no parts to download.", hint="List the repo again.")
    for part in hub_file.parts:
        validate_repo_filename(part.filename)
    if hub_file.is_split and not _is_complete_split(hub_file):
        raise HubError(
            f"The parts of {hub_file.display_name} are not a complete, ordered set.",
            hint="List the repo again with `hearthside models pull OWNER/NAME`.",
        )


def _is_complete_split(hub_file: HubFile) -> bool:
    infos = [split_part_info(part.filename) for part in hub_file.parts]
    if any(info is None for info in infos):
        return False
    prefixes = {info[0] for info in infos if info}
    numbering = [(info[1], info[2]) for info in infos if info]
    count = len(hub_file.parts)
    return len(prefixes) == 1 and numbering == [(i, count) for i in range(1, count + 1)]


def _refuse_installed(store: ModelStore, hub_file: HubFile) -> None:
    existing = store.find_by_source(hub_file.source)
    if existing is None and hub_file.sha256 is not None:
        existing = store.find_by_sha256(hub_file.sha256)
    if existing is not None:
        raise ModelStoreError(
            f"This model is already installed as '{existing.id}'.",
            hint="Run `hearthside models list` to see it; remove it first to download it again.",
        )


def _preferred_id(hub_file: HubFile) -> str:
    basename = hub_file.filename.rsplit("/", 1)[-1]
    split = split_part_info(basename)
    return split[0] if split else basename[: -len(MODEL_SUFFIX)]


def _plan(hub_file: HubFile, store: ModelStore, hub: HubEndpoint) -> list[_PartPlan]:
    plans = []
    for part in hub_file.parts:
        # Named by what it is, not by the model id: a rerun must find it whatever ids exist.
        key = hashlib.sha256(f"{hub_file.repo}/{part.filename}".encode()).hexdigest()[:16]
        stem = part.filename.rsplit("/", 1)[-1][:100]
        partial = store.downloads_dir / f"{stem}.{key}.part"
        plans.append(
            _PartPlan(
                part=part,
                url=resolve_url(hub, hub_file.repo, hub_file.revision, part.filename),
                partial=partial,
                note=partial.with_name(partial.name + ".json"),
            )
        )
    return plans


def _discard_if_foreign(plan: _PartPlan, repo: str) -> None:
    """A .part we cannot vouch for (no note, or a note for other bytes) is not resumed."""
    try:
        matches = plan.note.read_text(encoding="utf-8") == plan.note_text(repo)
    except (OSError, UnicodeError):
        matches = False
    if not matches:
        _discard(plan)


def _discard(plan: _PartPlan) -> None:
    plan.partial.unlink(missing_ok=True)
    plan.note.unlink(missing_ok=True)


def _existing_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _check_free_space(store: ModelStore, plans: list[_PartPlan]) -> None:
    sizes = [plan.part.size_bytes for plan in plans]
    if any(size is None for size in sizes):
        return  # the hub did not say; the write itself reports a full disk
    needed = sum((plan.part.size_bytes or 0) - _existing_bytes(plan.partial) for plan in plans)
    free = shutil.disk_usage(store.downloads_dir).free
    if free < needed + FREE_SPACE_MARGIN_BYTES:
        raise ModelStoreError(
            f"Not enough free disk space to download this model: it needs {format_bytes(needed)} "
            f"more and {format_bytes(free)} is free in {store.models_dir}.",
            hint=f"Free at least {format_bytes(needed + FREE_SPACE_MARGIN_BYTES - free)} there, "
            "or point HEARTHSIDE_HOME at a bigger disk.",
        )


# --- one file --------------------------------------------------------------------------------


def _fetch(
    plan: _PartPlan,
    repo: str,
    hub: HubEndpoint,
    tracker: _Progress,
    cancel: threading.Event | None,
) -> str:
    """Bring `plan.partial` to the whole file and return its verified sha256."""
    expected_bytes = plan.part.size_bytes
    have = _existing_bytes(plan.partial)
    if expected_bytes is not None and have > expected_bytes:
        _discard(plan)
        have = 0
    if not plan.note.exists():
        plan.note.write_text(plan.note_text(repo), encoding="utf-8")
    if expected_bytes is not None and have == expected_bytes and have > 0:
        tracker.report(have)
        return _verified(plan, plan.part.sha256, _hash_prefix(plan.partial, have).hexdigest())
    digest, announced_sha256 = _transfer(plan, hub, tracker, cancel, have)
    return _verified(plan, plan.part.sha256 or announced_sha256, digest)


def _transfer(
    plan: _PartPlan,
    hub: HubEndpoint,
    tracker: _Progress,
    cancel: threading.Event | None,
    have: int,
) -> tuple[str, str | None]:
    """Request the missing bytes and write them, hashing the whole file on the way.

    Returns the file's sha256 and the sha256 the hub announced for it (if any)."""
    headers = {"Range": f"bytes={have}-"} if have > 0 else {}
    with open_url(plan.url, hub, headers=headers) as response:
        start = _resume_point(response, have, plan)
        if start is not None:
            digest = _hash_prefix(plan.partial, start)
            total = _total_bytes(response, start, plan)
            _receive(response, plan, start, total, digest, tracker, cancel)
            return digest.hexdigest(), response.linked_sha256
    # The answer to our range request was unusable: once more, from the first byte.
    plan.partial.unlink(missing_ok=True)
    return _transfer(plan, hub, tracker, cancel, 0)


def _resume_point(response: HubResponse, have: int, plan: _PartPlan) -> int | None:
    """Where the response body starts in the file: `have` for a matching 206, 0 for a 200,
    None for an answer to a range request we must not use."""
    if response.status == 200:
        return 0
    if have > 0 and response.status == 206 and _range_matches(response, have, plan):
        return have
    if have > 0 and response.status in (206, 416):
        return None
    raise status_error(response.status, plan.part.filename)


def _range_matches(response: HubResponse, have: int, plan: _PartPlan) -> bool:
    match = _CONTENT_RANGE.fullmatch((response.header("Content-Range") or "").strip())
    if match is None:
        return False
    first, last, total = (int(group) for group in match.groups())
    expected_total = plan.part.size_bytes
    return first == have and last == total - 1 and expected_total in (None, total)


def _total_bytes(response: HubResponse, start: int, plan: _PartPlan) -> int | None:
    if plan.part.size_bytes is not None:
        return plan.part.size_bytes
    length = response.header("Content-Length")
    return start + int(length) if length and length.isdigit() else None


def _receive(
    response: HubResponse,
    plan: _PartPlan,
    start: int,
    total: int | None,
    digest: hashlib._Hash,
    tracker: _Progress,
    cancel: threading.Event | None,
) -> None:
    written = start
    with _open_part(plan.partial, append=start > 0) as sink, _aborting_on(cancel, response):
        tracker.report(written)
        while total is None or written < total:
            block = _read_block(response, plan, cancel, written)
            if not block:
                break
            if total is not None and written + len(block) > total:
                _discard(plan)
                raise HubError(
                    f"The hub sent more of {plan.part.filename} than it announced.",
                    hint="Run the same command again to download it afresh.",
                )
            _write_block(sink, block, plan, written, total)
            digest.update(block)
            written += len(block)
            tracker.report(written)
            if cancel is not None and cancel.is_set():
                raise _cancelled(plan, written)
    if total is not None and written < total:
        if cancel is not None and cancel.is_set():
            raise _cancelled(plan, written)
        raise HubError(
            f"The download of {plan.part.filename} stopped early "
            f"({format_bytes(written)} of {format_bytes(total)}).",
            hint="Check your internet connection. " + _RESUME_HINT,
        )


def _read_block(
    response: HubResponse, plan: _PartPlan, cancel: threading.Event | None, written: int
) -> bytes:
    try:
        return response.read(CHUNK_BYTES)
    except (OSError, http.client.HTTPException) as exc:
        if cancel is not None and cancel.is_set():
            raise _cancelled(plan, written) from None
        raise connection_error(_host_of(response), exc) from exc


def _host_of(response: HubResponse) -> str:
    return response.url.split("/")[2] if response.url.count("/") >= 2 else response.url


def _write_block(
    sink: BinaryIO, block: bytes, plan: _PartPlan, written: int, total: int | None
) -> None:
    view = memoryview(block)
    try:
        while view:  # an unbuffered write may take only part of the block (a nearly full disk)
            view = view[sink.write(view) or 0 :]
    except OSError as exc:
        raise _write_failure(exc, plan, written + len(block) - len(view), total) from exc


@contextlib.contextmanager
def _open_part(path: Path, *, append: bool) -> Iterator[BinaryIO]:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    sink = os.fdopen(os.open(path, flags, 0o600), "wb", buffering=0)
    try:
        yield sink
    finally:
        # Durable even when interrupted: a resume must not build on bytes the OS dropped.
        with contextlib.suppress(OSError):
            os.fsync(sink.fileno())
        with contextlib.suppress(OSError):
            sink.close()


@contextlib.contextmanager
def _aborting_on(cancel: threading.Event | None, response: HubResponse) -> Iterator[None]:
    """Cut the connection when `cancel` is set, so a read stuck on a slow server returns."""
    if cancel is None:
        yield
        return
    finished = threading.Event()

    def watch() -> None:
        while not finished.wait(_CANCEL_POLL_S):
            if cancel.is_set():
                response.abort()
                return

    watcher = threading.Thread(target=watch, name="hub-download-cancel", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        finished.set()
        watcher.join()


def _cancelled(plan: _PartPlan, written: int) -> DownloadCancelled:
    return DownloadCancelled(
        f"Download cancelled; {format_bytes(written)} of {plan.part.filename} is kept.",
        hint=_RESUME_HINT,
    )


def _write_failure(
    exc: OSError, plan: _PartPlan, written: int, total: int | None
) -> ModelStoreError:
    folder = plan.partial.parent
    if exc.errno not in _NO_ROOM_ERRNOS:
        return ModelStoreError(
            f"Hearthside could not write the download to {folder}.",
            hint=f"The system said: {exc.strerror or exc}.",
        )
    kept = (
        f"The {format_bytes(written)} downloaded so far is kept in {plan.partial}. "
        if written > 0
        else ""
    )
    missing = format_bytes(total - written) if total is not None else "more"
    if exc.errno == errno.EFBIG:
        return ModelStoreError(
            f"The system would not let {plan.part.filename} grow past {format_bytes(written)} "
            f"in {folder} (a file-size limit or quota); it needs {missing} more.",
            hint=kept + "Raise the limit (ulimit -f) or point HEARTHSIDE_HOME at another "
            "disk, then run the same command again to resume.",
        )
    return ModelStoreError(
        f"The disk ran out of space while downloading {plan.part.filename} to {folder}: "
        f"it needs {missing} more and {format_bytes(_free_bytes(folder))} is free there.",
        hint=kept + "Free some space and run the same command again to resume, or delete "
        "that file to give up.",
    )


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return 0


# --- verification and install ----------------------------------------------------------------


def _hash_prefix(path: Path, n_bytes: int) -> hashlib._Hash:
    """A sha256 object fed with the first `n_bytes` of `path` (a resumed file's old bytes)."""
    digest = hashlib.sha256()
    if n_bytes == 0:
        return digest
    remaining = n_bytes
    with path.open("rb") as source:
        while remaining > 0 and (block := source.read(min(CHUNK_BYTES, remaining))):
            digest.update(block)
            remaining -= len(block)
    return digest


def _verified(plan: _PartPlan, expected_sha256: str | None, digest: str) -> str:
    """Check the finished .part's size and sha256; a bad one is deleted."""
    actual_bytes = _existing_bytes(plan.partial)
    if plan.part.size_bytes is not None and actual_bytes != plan.part.size_bytes:
        _discard(plan)
        raise ModelFileError(
            f"{plan.part.filename} arrived with the wrong size ({actual_bytes} bytes, the hub "
            f"says {plan.part.size_bytes}).",
            hint="It was deleted. Run the same command again to download it afresh.",
        )
    if expected_sha256 is not None and digest != expected_sha256.lower():
        _discard(plan)
        raise ModelFileError(
            f"{plan.part.filename} did not match the sha256 the hub lists for it; it was "
            "damaged on the way and has been deleted.",
            hint="Run the same command again to download it afresh. If it fails again, your "
            "connection or a proxy is changing the data.",
        )
    return digest


def _install(
    store: ModelStore,
    hub_file: HubFile,
    plans: list[_PartPlan],
    first_sha256: str,
    check_native: bool,
) -> ModelRecord:
    try:
        infos = [validate_gguf(plan.partial) for plan in plans]
    except ModelFileError:
        for plan in plans:
            _discard(plan)
        raise
    # The id is chosen only now: a long download must not hold on to an id another model
    # may have taken meanwhile.
    model_id = store.unused_model_id(_preferred_id(hub_file))
    targets = _target_paths(store, model_id, len(plans))
    for plan, target in zip(plans, targets, strict=True):
        commit_part_file(plan.partial, target)
        plan.note.unlink(missing_ok=True)
    first = infos[0]
    label = first.model_name or hub_file.repo.split("/", 1)[1]
    try:
        return store.register_installed(
            targets[0],
            model_id=model_id,
            source=hub_file.source,
            part_count=len(plans),
            name=f"{label} ({first.quant_name})" if first.quant_name else label,
            sha256=first_sha256,
            check_native=check_native,
        )
    except BaseException:
        for target in targets:
            target.unlink(missing_ok=True)
        raise


def _target_paths(store: ModelStore, model_id: str, count: int) -> list[Path]:
    """The files' final names: `<id>.gguf`, or llama.cpp's split names `<id>-0000i-of-0000n`."""
    if count == 1:
        return [store.models_dir / f"{model_id}{MODEL_SUFFIX}"]
    return [store.models_dir / split_file_name(model_id, i, count) for i in range(1, count + 1)]
