"""The model registry: which GGUF files Hearthside knows, where they live, which is the default.

This module owns `<data dir>/models.db` (STYLE.md practice 6): the schema version lives in
`PRAGMA user_version` and a database newer than this code is refused; the journal is WAL with
synchronous=FULL; SQLite errors caused by the environment (disk full, read-only, locked,
corrupt) become a ModelStoreError with a hint, anything else is our bug and propagates.

Model files live in `models_dir(root)`. A model added by copy is written to `<id>.gguf.part`,
hashed in the same pass, fsynced, renamed into place and only then registered, so a crash at
any point leaves no half-registered model. A linked model stays where the user keeps it and is
never deleted by Hearthside.

Installers that write model files themselves (hub downloads, local re-quantization) put the
finished file in the models dir and call `register_installed`. A split GGUF
(`<id>-00001-of-00003.gguf` ...) is one model: the registry points at the first part, llama.cpp
loads the others from the same folder, and removing the model deletes every part. A model made
from another one records it in `variant_of`; `source` says where a model came from ("file",
"default", "hub:owner/repo/file.gguf", "quantized:<source id>").
"""

from __future__ import annotations

import builtins
import errno
import glob
import hashlib
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any

import sqlite_utils

from hearthside.core.database import DatabaseKind, classified_errors, open_database, transaction
from hearthside.core.display_text import shortened
from hearthside.core.errors import ModelFileError, ModelStoreError
from hearthside.core.models.child_check import check_loads_in_child
from hearthside.core.models.gguf_validator import GGUFInfo, validate_gguf
from hearthside.core.paths import data_dir, ensure_private_dir, is_within, models_dir
from hearthside.core.units import format_bytes

SCHEMA_VERSION = 3
DB_FILE_NAME = "models.db"
MODEL_SUFFIX = ".gguf"
PART_SUFFIX = ".part"
DEFAULT_REF = "default"
MAX_ID_LENGTH = 64
COPY_BLOCK_BYTES = 4 * 1024 * 1024
# Room for the registry, its WAL and the OS once the copy has landed.
FREE_SPACE_MARGIN_BYTES = 64 * 1024 * 1024
# Another process (the GUI while the CLI runs, say) may be writing a .part right now; a file it
# is writing has a fresh mtime, so only parts untouched for this long count as leftovers.
STALE_PART_AGE_S = 15 * 60
# A file registered in place is checked and hashed again when it changed meanwhile, this often.
IN_PLACE_CHECK_ATTEMPTS = 3

SOURCE_DEFAULT = "default"
SOURCE_FILE = "file"
SOURCE_HUB_PREFIX = "hub:"
SOURCE_QUANTIZED_PREFIX = "quantized:"
_SOURCES = frozenset({SOURCE_DEFAULT, SOURCE_FILE})
_SOURCE_PREFIXES = (SOURCE_HUB_PREFIX, SOURCE_QUANTIZED_PREFIX)
_MAX_SOURCE_LENGTH = 512
_SPLIT_NAME_PATTERN = re.compile(r"(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")
_RESERVED_IDS = frozenset({DEFAULT_REF})
_MODEL_ID_PATTERN = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?")
_LIST_HINT = "Run `hearthside models list` to see what is installed."
_DEFAULT_INSTALLED_KEY = "default_model_installed_at"

ProgressCallback = Callable[[int, int], None]
_FileIdentity = tuple[str, int, int]  # resolved path, size, mtime in ns
_FileVersion = tuple[int, int, int, int, int]  # device, inode, size, mtime and ctime in ns


@dataclass(frozen=True)
class ModelRecord:
    """One registered model. `linked` models live outside the models dir and are never deleted."""

    id: str
    name: str
    path: Path
    size_bytes: int
    sha256: str
    architecture: str | None
    quant: str | None
    parameter_count: int | None
    added_at: str
    source: str
    licence: str | None
    is_default: bool
    linked: bool
    variant_of: str | None = None  # the id of the model this one was made from
    part_count: int = 1  # files of a split GGUF; `path` is the first, `size_bytes` their sum

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["path"] = str(self.path)
        return data


# --- ids -------------------------------------------------------------------------------------


def registered_file(ref: str, home: str | os.PathLike[str] | None = None) -> Path | None:
    """The GGUF behind `ref` (a path, `default` or a registered id), or None for a what-if
    model (a catalog id or descriptor). Opens no registry that does not exist yet."""
    path = Path(ref)
    if ref.lower().endswith(".gguf") and path.is_file():
        return path
    folder = data_dir(home)
    if not (folder / DB_FILE_NAME).exists():
        return None
    with ModelStore(folder) as store:
        if ref == DEFAULT_REF or store.find(ref) is not None:
            return store.resolve(ref).path
    return None


def slugify_model_id(text: str) -> str:
    """A model id from a file stem: lowercase [a-z0-9._-], no "..", never empty."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", text.lower())
    slug = re.sub(r"\.{2,}", ".", slug)
    slug = slug.strip("-._")[:MAX_ID_LENGTH].strip("-._")
    return slug or "model"


def is_valid_model_id(model_id: str) -> bool:
    return (
        len(model_id) <= MAX_ID_LENGTH
        and _MODEL_ID_PATTERN.fullmatch(model_id) is not None
        and ".." not in model_id
    )


def _shown(text: str) -> str:
    """User-supplied text made safe to echo in a message: printable, and not too long."""
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable if len(printable) <= 80 else printable[:77] + "..."


# --- files -----------------------------------------------------------------------------------


def part_path_for(target: Path) -> Path:
    return target.with_name(target.name + PART_SUFFIX)


def split_file_name(prefix: str, index: int, count: int) -> str:
    """llama.cpp's name for part `index` (1-based) of `count`: `<prefix>-00002-of-00003.gguf`."""
    return f"{prefix}-{index:05d}-of-{count:05d}{MODEL_SUFFIX}"


def split_part_paths(first_part: Path, count: int) -> builtins.list[Path]:
    """Every part of a split GGUF, from the first part's path (itself when `count` is 1)."""
    match = _SPLIT_NAME_PATTERN.fullmatch(first_part.name)
    if count <= 1 or match is None:
        return [first_part]
    prefix = match.group("prefix")
    return [first_part.with_name(split_file_name(prefix, i, count)) for i in range(1, count + 1)]


def is_valid_source(source: str) -> bool:
    if source in _SOURCES:
        return True
    return (
        source.startswith(_SOURCE_PREFIXES)
        and len(source) <= _MAX_SOURCE_LENGTH
        and source.isprintable()
    )


def commit_part_file(part: Path, target: Path) -> None:
    """Make a finished .part durable, then atomically give it its final name."""
    with part.open("rb+") as handle:
        os.fsync(handle.fileno())
    os.replace(part, target)
    _fsync_directory(target.parent)


def _fsync_directory(directory: Path) -> None:
    # Without this a power cut can forget the rename even though the data blocks are on disk.
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_private_for_writing(path: Path) -> Any:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return os.fdopen(fd, "wb")


def _copy_hashing(
    source: Path, destination: Path, expected_bytes: int, progress: ProgressCallback | None
) -> tuple[str, _FileIdentity]:
    """Copy `source` to `destination`; the sha256 of the bytes copied, and which file (path,
    size, mtime) they were read from."""
    digest = hashlib.sha256()
    done_bytes = 0
    if progress is not None:
        progress(0, expected_bytes)
    with source.open("rb") as reader, _open_private_for_writing(destination) as writer:
        copied = _identity_of(source, os.fstat(reader.fileno()))
        while block := reader.read(COPY_BLOCK_BYTES):
            writer.write(block)
            digest.update(block)
            done_bytes += len(block)
            if progress is not None:
                progress(done_bytes, expected_bytes)
        writer.flush()
        os.fsync(writer.fileno())
    _require_unchanged_size(done_bytes, expected_bytes)
    return digest.hexdigest(), copied


def hash_file(path: Path, progress: ProgressCallback | None = None) -> str:
    digest = hashlib.sha256()
    total_bytes = path.stat().st_size
    done_bytes = 0
    with path.open("rb") as reader:
        while block := reader.read(COPY_BLOCK_BYTES):
            digest.update(block)
            done_bytes += len(block)
            if progress is not None:
                progress(done_bytes, total_bytes)
    return digest.hexdigest()


def _require_unchanged_size(actual_bytes: int, expected_bytes: int) -> None:
    if actual_bytes != expected_bytes:
        raise ModelFileError(
            "The model file changed while Hearthside was reading it.",
            hint="Wait until whatever is writing it has finished, then add it again.",
        )


def _require_model_file(path: Path) -> Path:
    if not path.exists():
        raise ModelFileError(f"There is no file at {_shown(str(path))}.", hint="Check the path.")
    if not path.is_file():
        raise ModelFileError(
            f"{_shown(str(path))} is not a file.", hint="Give the path of a .gguf model file."
        )
    return path


def _remove_stale_parts(directory: Path, now_s: float) -> None:
    for part in directory.glob(f"*{MODEL_SUFFIX}{PART_SUFFIX}"):
        try:
            if now_s - part.stat().st_mtime > STALE_PART_AGE_S:
                part.unlink()
        except FileNotFoundError:
            continue  # its writer finished or cleaned it meanwhile


_OS_ERROR_HINTS: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("The disk ran out of space while copying the model.", "Free some space."),
    errno.EACCES: (
        "Permission denied while copying the model file.",
        "Check that you can read the file and write to Hearthside's data folder.",
    ),
    errno.EROFS: (
        "Hearthside's models folder is on a read-only disk.",
        "Point HEARTHSIDE_HOME at a writable folder.",
    ),
}


def _copy_failure(exc: OSError) -> ModelStoreError:
    message, hint = _OS_ERROR_HINTS.get(
        exc.errno or 0,
        ("Hearthside could not copy the model file.", f"The system said: {exc.strerror or exc}."),
    )
    return ModelStoreError(message, hint=hint)


# --- SQLite ----------------------------------------------------------------------------------


def _create_schema_v1(db: sqlite_utils.Database) -> None:
    # `file` is the name inside the models dir for managed models (so a moved data dir keeps
    # working) and an absolute path for linked ones.
    db.execute(
        """
        CREATE TABLE models (
            id TEXT PRIMARY KEY,
            name TEXT NOT NULL,
            file TEXT NOT NULL,
            linked INTEGER NOT NULL CHECK (linked IN (0, 1)),
            size_bytes INTEGER NOT NULL,
            sha256 TEXT NOT NULL UNIQUE,
            architecture TEXT,
            quant TEXT,
            parameter_count INTEGER,
            added_at TEXT NOT NULL,
            source TEXT NOT NULL,
            licence TEXT,
            is_default INTEGER NOT NULL DEFAULT 0 CHECK (is_default IN (0, 1))
        )
        """
    )
    db.execute("CREATE UNIQUE INDEX one_default_model ON models (is_default) WHERE is_default = 1")
    db.execute("CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


def _add_variants_and_parts_v2(db: sqlite_utils.Database) -> None:
    db.execute("ALTER TABLE models ADD COLUMN variant_of TEXT")
    db.execute("ALTER TABLE models ADD COLUMN part_count INTEGER NOT NULL DEFAULT 1")


def _add_bad_files_v3(db: sqlite_utils.Database) -> None:
    # Files whose check in a child process failed, so nothing loads them in-process later.
    # A file is known by its path, size and mtime: a replaced or re-downloaded file is new.
    db.execute(
        """
        CREATE TABLE bad_files (
            path TEXT PRIMARY KEY,
            size_bytes INTEGER NOT NULL,
            mtime_ns INTEGER NOT NULL,
            reason TEXT NOT NULL,
            checked_at TEXT NOT NULL
        )
        """
    )


def _on_database(
    migration: Callable[[sqlite_utils.Database], None],
) -> Callable[[sqlite3.Connection], None]:
    return lambda conn: migration(sqlite_utils.Database(conn))


REGISTRY = DatabaseKind(
    label="Hearthside's model registry (models.db)",
    file_name="models.db",
    schema_version=SCHEMA_VERSION,
    migrations={
        0: _on_database(_create_schema_v1),
        1: _on_database(_add_variants_and_parts_v2),
        2: _on_database(_add_bad_files_v3),
    },
    error=ModelStoreError,
    damaged_hint="Move models.db out of Hearthside's data folder and run again: a new, empty "
    "registry will be made, and the model files themselves are untouched.",
)


def _open_database(path: Path, busy_timeout_s: float) -> sqlite_utils.Database:
    return sqlite_utils.Database(open_database(REGISTRY, path, busy_timeout_s))


@contextmanager
def _transaction(db: sqlite_utils.Database) -> Iterator[None]:
    with transaction(db.conn):
        yield


# --- the store -------------------------------------------------------------------------------


class ModelStore:
    """The registry of model files under one Hearthside data dir.

    One instance per thread: it holds a single SQLite connection.
    """

    def __init__(self, root: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.root = ensure_private_dir(Path(root))
        self.models_dir = models_dir(self.root)
        self.db_path = self.root / DB_FILE_NAME
        with classified_errors(REGISTRY):
            self._db = _open_database(self.db_path, busy_timeout_s)
        _remove_stale_parts(self.models_dir, time.time())

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ModelStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading --

    def list(self) -> builtins.list[ModelRecord]:
        return self._select(None)

    def get(self, model_id: str) -> ModelRecord:
        record = self.find(model_id)
        if record is None:
            raise ModelStoreError(f"No model called '{_shown(model_id)}'.", hint=_LIST_HINT)
        return record

    def default(self) -> ModelRecord | None:
        records = self._select("is_default = 1")
        return records[0] if records else None

    def find_by_sha256(self, sha256: str) -> ModelRecord | None:
        records = self._select("sha256 = ?", [sha256.lower()])
        return records[0] if records else None

    def resolve(self, ref: str) -> ModelRecord:
        """The model a user means by `ref`: the word "default", or a registered id."""
        if ref != DEFAULT_REF:
            return self.get(ref)
        record = self.default()
        if record is None:
            raise ModelStoreError(
                "No default model is set.",
                hint="Run `hearthside models install-default` to set up the default model, or "
                "`hearthside models default ID` to choose one you added.",
            )
        return record

    # -- writing --

    def add(
        self,
        path: str | os.PathLike[str],
        *,
        link: bool = False,
        name: str | None = None,
        source: str = SOURCE_FILE,
        licence: str | None = None,
        progress: ProgressCallback | None = None,
        check_native: bool = True,
    ) -> ModelRecord:
        """Validate a GGUF file and register it, copying it into the models dir unless `link`.

        A file already inside the models dir is registered where it is. The bytes registered
        are the bytes checked: a copy is validated and loaded in a child after copying; a file
        registered in place is checked again when it changed while it was checked and hashed.
        """
        if source not in _SOURCES:
            raise ValueError(f"unknown model source {source!r}")
        source_path = _require_model_file(Path(path))
        self._refuse_registered_path(source_path)
        details = _Details(name=name, source=source, licence=licence)
        if link or is_within(source_path, self.models_dir):
            return self._register_in_place(source_path, details, progress, check_native)
        return self._copy_and_register(source_path, details, progress, check_native)

    def remove(self, model_id: str, *, delete_file: bool = True) -> ModelRecord:
        """Unregister a model; delete its file only when Hearthside made or owns it."""
        record = self.get(model_id)
        with classified_errors(REGISTRY):
            self._db.execute("DELETE FROM models WHERE id = ?", [record.id])
        if delete_file and self.owns_file(record):
            try:
                for path in self.files_of(record):
                    path.unlink(missing_ok=True)
            except OSError as exc:
                raise ModelStoreError(
                    f"Removed '{record.id}' from the registry, but could not delete its file.",
                    hint=f"Delete {record.path} yourself. The system said: {exc.strerror}.",
                ) from exc
        return record

    def set_default(self, model_id: str) -> ModelRecord:
        record = self.get(model_id)
        with classified_errors(REGISTRY), _transaction(self._db):
            self._db.execute("UPDATE models SET is_default = 0 WHERE is_default = 1")
            self._db.execute("UPDATE models SET is_default = 1 WHERE id = ?", [record.id])
        return replace(record, is_default=True)

    def owns_file(self, record: ModelRecord) -> bool:
        """True when deleting the model may delete its file: never for a user's linked file."""
        return not record.linked and is_within(record.path, self.models_dir)

    def files_of(self, record: ModelRecord) -> builtins.list[Path]:
        """The model's file, or every part of a split model, first part first."""
        return split_part_paths(record.path, record.part_count)

    def find_by_source(self, source: str) -> ModelRecord | None:
        records = self._select("source = ?", [source])
        return records[0] if records else None

    def variants_of(self, model_id: str) -> builtins.list[ModelRecord]:
        return self._select("variant_of = ?", [model_id])

    def family(self, record: ModelRecord) -> builtins.list[ModelRecord]:
        """Every model made from the same original as `record` (variants of variants too),
        the original first."""
        root, seen = record, {record.id}
        while root.variant_of and root.variant_of not in seen and self.find(root.variant_of):
            seen.add(root.variant_of)
            root = self.get(root.variant_of)
        family, queue = [], [root]
        while queue:
            current = queue.pop(0)
            family.append(current)
            known = {member.id for member in family}
            queue += [v for v in self.variants_of(current.id) if v.id not in known]
        return family

    # -- helpers for installers that write into the models dir themselves --

    def unused_model_path(self, preferred_id: str) -> Path:
        """`<models dir>/<id>.gguf` for an id that neither a model nor a file uses yet."""
        return self.models_dir / f"{self.unused_model_id(preferred_id)}{MODEL_SUFFIX}"

    def unused_model_id(self, preferred_id: str) -> str:
        """An id from `preferred_id` that no model uses and no file in the models dir starts
        with (`<id>.gguf`, its `.part`, or the parts `<id>-00001-of-0000N.gguf` of a split)."""
        return self._unused_id(slugify_model_id(preferred_id), avoid_files=True)

    @property
    def downloads_dir(self) -> Path:
        """Where unfinished downloads wait to be resumed; the stale-part cleanup on open
        never looks here, so a download paused for a week still resumes."""
        return ensure_private_dir(self.models_dir / "downloads")

    def register_installed(
        self,
        path: Path,
        *,
        model_id: str,
        source: str,
        part_count: int = 1,
        name: str | None = None,
        licence: str | None = None,
        variant_of: str | None = None,
        sha256: str | None = None,
        check_native: bool = True,
    ) -> ModelRecord:
        """Register a model file an installer has already put in the models dir.

        `path` is the file (the first part of a split model, whose other parts lie next to it
        with llama.cpp's names). Every part is validated; the first is loaded once in a child
        process. `sha256` is the first part's digest when the installer has just computed it
        from the bytes it wrote; otherwise the file is hashed here.
        """
        if not is_valid_source(source):
            raise ValueError(f"unknown model source {source!r}")
        if not is_valid_model_id(model_id) or model_id in _RESERVED_IDS:
            raise ValueError(f"not a model id: {model_id!r}")
        if not is_within(path, self.models_dir):
            raise ValueError(f"{path} is not in the models dir")
        parts = split_part_paths(path, part_count)
        if len(parts) != part_count:
            raise ValueError(f"{path.name} is not named like part 1 of {part_count}")
        infos = [validate_gguf(_require_model_file(part)) for part in parts]
        if check_native:
            self.check_loads(path)
        digest = sha256.lower() if sha256 is not None else hash_file(path)
        self._refuse_duplicate(digest)
        relative = path.resolve().relative_to(self.models_dir.resolve()).as_posix()
        details = _Details(
            name=name,
            source=source,
            licence=licence,
            variant_of=variant_of,
            part_count=part_count,
            size_bytes=sum(info.file_size for info in infos),
            parameter_count=sum(info.parameter_count for info in infos),
        )
        return self._insert(model_id, relative, False, digest, infos[0], details)

    # -- files that failed their load check --

    def check_loads(self, path: Path) -> None:
        """Load `path` fully once in a child process; a file that fails is remembered as bad
        (and raises), one that passes is forgotten as bad."""
        try:
            check_loads_in_child(path)
        except ModelFileError as failure:
            self._remember_bad_file(path, failure.message)
            raise
        self._forget_bad_file(path)

    def bad_file_reason(self, path: Path) -> str | None:
        """Why this very file (same path, size and mtime) failed its check, if it did."""
        identity = _file_identity(path)
        if identity is None:
            return None
        with classified_errors(REGISTRY):
            row = self._db.execute(
                "SELECT reason FROM bad_files WHERE path = ? AND size_bytes = ? AND mtime_ns = ?",
                list(identity),
            ).fetchone()
        return None if row is None else str(row[0])

    def _remember_bad_file(self, path: Path, reason: str) -> None:
        identity = _file_identity(path)
        if identity is None:
            return
        with classified_errors(REGISTRY):
            self._db.execute(
                "INSERT OR REPLACE INTO bad_files (path, size_bytes, mtime_ns, reason, checked_at) "
                "VALUES (?, ?, ?, ?, ?)",
                [*identity, reason, _utc_now()],
            )

    def _forget_bad_file(self, path: Path) -> None:
        with classified_errors(REGISTRY):
            self._db.execute("DELETE FROM bad_files WHERE path = ?", [str(path.resolve())])

    def check_free_space(self, needed_bytes: int, *, hint: str | None = None) -> None:
        free_bytes = shutil.disk_usage(self.models_dir).free
        if free_bytes < needed_bytes + FREE_SPACE_MARGIN_BYTES:
            raise ModelStoreError(
                f"Not enough free disk space for this model: it needs {format_bytes(needed_bytes)} "
                f"and {format_bytes(free_bytes)} is free where Hearthside keeps models "
                f"({self.models_dir}).",
                hint=hint
                or "Free some space, or add the model with --link to use the file where it is.",
            )

    def default_model_installed_before(self) -> bool:
        with classified_errors(REGISTRY):
            row = self._db.execute(
                "SELECT value FROM settings WHERE key = ?", [_DEFAULT_INSTALLED_KEY]
            ).fetchone()
        return row is not None

    def remember_default_model_installed(self) -> None:
        with classified_errors(REGISTRY):
            self._db.execute(
                "INSERT OR IGNORE INTO settings (key, value) VALUES (?, ?)",
                [_DEFAULT_INSTALLED_KEY, _utc_now()],
            )

    # -- internals --

    def find(self, model_id: str) -> ModelRecord | None:
        """The model with this id, or None (also for text that cannot be an id)."""
        if not is_valid_model_id(model_id):
            return None
        records = self._select("id = ?", [model_id])
        return records[0] if records else None

    def _select(
        self, where: str | None, params: builtins.list[Any] | None = None
    ) -> builtins.list[ModelRecord]:
        with classified_errors(REGISTRY):
            rows = list(
                self._db.table("models").rows_where(where, params or [], order_by="added_at, id")
            )
        return [self._record_from_row(row) for row in rows]

    def _record_from_row(self, row: dict[str, Any]) -> ModelRecord:
        linked = bool(row["linked"])
        return ModelRecord(
            id=row["id"],
            name=row["name"],
            path=Path(row["file"]) if linked else self._managed_path(row["id"], row["file"]),
            size_bytes=row["size_bytes"],
            sha256=row["sha256"],
            architecture=row["architecture"],
            quant=row["quant"],
            parameter_count=row["parameter_count"],
            added_at=row["added_at"],
            source=row["source"],
            licence=row["licence"],
            is_default=bool(row["is_default"]),
            linked=linked,
            variant_of=row["variant_of"],
            part_count=row["part_count"],
        )

    def _managed_path(self, model_id: str, file_name: str) -> Path:
        relative = PurePosixPath(file_name)
        path = self.models_dir.joinpath(*relative.parts)
        if relative.is_absolute() or ".." in relative.parts or not is_within(path, self.models_dir):
            # Only a hand-edited registry gets here; never follow it out of the models dir.
            raise ModelStoreError(
                f"The registry entry for '{model_id}' points outside Hearthside's models folder.",
                hint=REGISTRY.damaged()[1],
            )
        return path

    def _refuse_registered_path(self, path: Path) -> None:
        resolved = path.resolve()
        for record in self.list():
            if record.path.resolve() == resolved:
                raise ModelStoreError(
                    f"This file is already registered as '{record.id}'.", hint=_LIST_HINT
                )

    def _refuse_duplicate(self, sha256: str) -> None:
        existing = self.find_by_sha256(sha256)
        if existing is not None:
            raise ModelStoreError(
                f"This model is already installed as '{existing.id}' (same sha256).",
                hint=_LIST_HINT,
            )

    def _unused_id(self, base: str, *, avoid_files: bool) -> str:
        taken = {record.id for record in self.list()} | _RESERVED_IDS
        number = 1
        while True:
            suffix = "" if number == 1 else f"-{number}"
            candidate = base[: MAX_ID_LENGTH - len(suffix)].rstrip("-._") + suffix
            file_taken = avoid_files and self._files_start_with(candidate)
            if candidate not in taken and not file_taken:
                return candidate
            number += 1

    def _files_start_with(self, model_id: str) -> bool:
        names = (f"{model_id}{MODEL_SUFFIX}", f"{model_id}{MODEL_SUFFIX}{PART_SUFFIX}")
        if any((self.models_dir / name).exists() for name in names):
            return True
        return any(self.models_dir.glob(f"{glob.escape(model_id)}-?????-of-?????{MODEL_SUFFIX}"))

    def _register_in_place(
        self,
        path: Path,
        details: _Details,
        progress: ProgressCallback | None,
        check_native: bool,
    ) -> ModelRecord:
        info, sha256 = self._checked_in_place(path, progress, check_native)
        self._refuse_duplicate(sha256)
        model_id = self._unused_id(slugify_model_id(path.stem), avoid_files=False)
        if is_within(path, self.models_dir):
            relative = path.resolve().relative_to(self.models_dir.resolve())
            return self._insert(model_id, relative.as_posix(), False, sha256, info, details)
        return self._insert(model_id, str(path.resolve()), True, sha256, info, details)

    def _checked_in_place(
        self, path: Path, progress: ProgressCallback | None, check_native: bool
    ) -> tuple[GGUFInfo, str]:
        """Validate, child-load and hash the file where it is, again when it changed meanwhile
        (same inode, size, mtime and ctime before and after), so the digest and facts
        registered are those of the file that was checked."""
        for _attempt in range(IN_PLACE_CHECK_ATTEMPTS):
            before = _file_version(path)
            info = validate_gguf(path)  # refuses a malformed or padded file before hashing
            if check_native:
                self.check_loads(path)
            sha256 = hash_file(path, progress)
            if before is not None and _file_version(path) == before:
                return info, sha256
        raise ModelFileError(
            "The model file kept changing while Hearthside was checking it.",
            hint="Wait until whatever is writing it has finished, then add it again.",
        )

    def _copy_and_register(
        self,
        source: Path,
        details: _Details,
        progress: ProgressCallback | None,
        check_native: bool,
    ) -> ModelRecord:
        # A quick look at the source refuses a malformed or padded file before the copy.
        source_info = validate_gguf(source)
        self.check_free_space(source_info.file_size)
        target = self.unused_model_path(source.stem)
        part = part_path_for(target)
        try:
            sha256, copied = _copy_hashing(source, part, source_info.file_size, progress)
            self._refuse_duplicate(sha256)
            # The source may have changed since it was looked at: check what we keep.
            info = validate_gguf(part)
            if check_native:
                self._check_copy_loads(part, source, copied)
            commit_part_file(part, target)
        except OSError as exc:
            part.unlink(missing_ok=True)
            raise _copy_failure(exc) from exc
        except BaseException:
            part.unlink(missing_ok=True)
            raise
        try:
            return self._insert(target.stem, target.name, False, sha256, info, details)
        except BaseException:
            target.unlink(missing_ok=True)
            raise

    def _check_copy_loads(self, part: Path, source: Path, copied: _FileIdentity) -> None:
        """Load the copy in a child; the verdict is remembered for the source file only when
        it is still the very file the copy was made from."""
        try:
            check_loads_in_child(part)
        except ModelFileError as failure:
            if _file_identity(source) == copied:
                self._remember_bad_file(source, failure.message)
            raise
        if _file_identity(source) == copied:
            self._forget_bad_file(source)

    def _insert(
        self,
        model_id: str,
        file: str,
        linked: bool,
        sha256: str,
        info: GGUFInfo,
        details: _Details,
    ) -> ModelRecord:
        row = {
            "id": model_id,
            # A metadata string may be 16 MiB; the registry keeps a name a person can read.
            "name": shortened(details.name or info.model_name or model_id),
            "file": file,
            "linked": int(linked),
            "size_bytes": details.size_bytes or info.file_size,
            "sha256": sha256,
            "architecture": info.architecture,
            "quant": info.quant_name,
            "parameter_count": details.parameter_count or info.parameter_count,
            "added_at": _utc_now(),
            "source": details.source,
            "licence": details.licence,
            "is_default": 0,
            "variant_of": details.variant_of,
            "part_count": details.part_count,
        }
        try:
            with classified_errors(REGISTRY):
                self._db.table("models").insert(row)
        except sqlite3.IntegrityError as exc:
            # Another process registered the same id or file between our checks and now.
            raise ModelStoreError(
                "Another Hearthside process added this model at the same time.", hint=_LIST_HINT
            ) from exc
        return self.get(model_id)


@dataclass(frozen=True)
class _Details:
    name: str | None
    source: str
    licence: str | None
    variant_of: str | None = None
    part_count: int = 1
    size_bytes: int | None = None  # all parts together; None: the one file's size
    parameter_count: int | None = None  # all parts together; None: the one file's count


def _utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _file_identity(path: Path) -> _FileIdentity | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return _identity_of(path, status)


def _identity_of(path: Path, status: os.stat_result) -> _FileIdentity:
    return str(path.resolve()), status.st_size, status.st_mtime_ns


def _file_version(path: Path) -> _FileVersion | None:
    """What changes whenever the file at `path` is replaced or written: device, inode, size,
    mtime and ctime (which, unlike mtime, no one can set back); None when it is gone."""
    try:
        status = path.stat()
    except OSError:
        return None
    return (
        status.st_dev,
        status.st_ino,
        status.st_size,
        status.st_mtime_ns,
        status.st_ctime_ns,
    )


# --- references that may be paths ------------------------------------------------------------


def resolve_model_path(store: ModelStore, ref: str) -> Path:
    """The file a user means by `ref`: "default", a registered id, or a GGUF file on disk.

    An unregistered file is validated and loaded once in a child process (a malformed file
    must not crash the caller), then returned as given; a file that failed that check before
    is refused at once.
    """
    if ref == DEFAULT_REF or store.find(ref) is not None:
        return _existing_registered_file(store.resolve(ref))
    candidate = Path(ref)
    if candidate.exists():
        _require_model_file(candidate)
        _refuse_known_bad(store, candidate)
        validate_gguf(candidate)
        store.check_loads(candidate)
        return candidate
    if _looks_like_path(ref):
        raise ModelFileError(
            f"There is no model file at {_shown(ref)}.",
            hint="Check the path, or give the id of an installed model. " + _LIST_HINT,
        )
    return store.get(ref).path  # raises "No model called ..."


def _refuse_known_bad(store: ModelStore, path: Path) -> None:
    reason = store.bad_file_reason(path)
    if reason is not None:
        raise ModelFileError(
            reason,
            hint="Hearthside checked this file before and will not load it. Download it again, "
            "or run `hearthside models add` on it to check it once more.",
        )


def _looks_like_path(ref: str) -> bool:
    return "/" in ref or os.sep in ref or ref.lower().endswith(MODEL_SUFFIX) or ref.startswith(".")


def _existing_registered_file(record: ModelRecord) -> Path:
    if not record.path.is_file():
        raise ModelFileError(
            f"The file for model '{record.id}' is missing ({record.path}).",
            hint=f"Put it back, or remove the entry with `hearthside models remove {record.id}`.",
        )
    return record.path
