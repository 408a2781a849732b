"""One way to open Hearthside's SQLite files: private, WAL, synchronous=FULL, versioned schema
migrated in one transaction, and SQLite's environment failures turned into plain words.

Each database (model registry, conversations, autotune wisdom) names itself and its error
type; the rules for durability, locking and corruption are the same for all of them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from hearthside.core.errors import HearthsideError
from hearthside.core.paths import make_private_file

Migration = Callable[[sqlite3.Connection], None]


@dataclass(frozen=True)
class DatabaseKind:
    """What a database is called in messages, its schema version and how to reach it."""

    label: str  # "the autotune database (wisdom.db)"
    file_name: str  # "wisdom.db"
    schema_version: int
    migrations: Mapping[int, Migration]  # migrations[n] takes schema n to n + 1
    error: type[HearthsideError]
    damaged_hint: str = ""  # what to do with a damaged file, when more can be said

    def damaged(self) -> tuple[str, str]:
        return (
            f"{_capitalised(self.label)} is damaged.",
            self.damaged_hint
            or f"Move {self.file_name} out of Hearthside's data folder and run again: a new, "
            "empty one will be made.",
        )

    def environment_errors(self) -> dict[int, tuple[str, str]]:
        corrupt = self.damaged()
        locked = (
            f"{_capitalised(self.label)} is busy in another Hearthside window or command.",
            "Close the other one, or wait a moment, and try again.",
        )
        return {
            sqlite3.SQLITE_FULL: (
                "The disk holding Hearthside's data is full.",
                "Free some space.",
            ),
            sqlite3.SQLITE_READONLY: (
                f"{_capitalised(self.label)} is read-only.",
                "Check that you own Hearthside's data folder and can write to it.",
            ),
            sqlite3.SQLITE_CANTOPEN: (
                f"Hearthside could not open {self.label}.",
                "Check that Hearthside's data folder exists and that you can write to it.",
            ),
            sqlite3.SQLITE_IOERR: (
                f"The disk reported an error while Hearthside used {self.label}.",
                "Check the disk, then try again.",
            ),
            sqlite3.SQLITE_BUSY: locked,
            sqlite3.SQLITE_LOCKED: locked,
            sqlite3.SQLITE_CORRUPT: corrupt,
            sqlite3.SQLITE_NOTADB: corrupt,
        }


@contextmanager
def classified_errors(kind: DatabaseKind) -> Iterator[None]:
    """SQLite's environment failures (disk full, corrupt file, locked) as `kind.error`."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        known = kind.environment_errors().get(code & 0xFF) if isinstance(code, int) else None
        if known is None:
            raise
        message, hint = known
        raise kind.error(message, hint=hint) from exc


@contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """An IMMEDIATE transaction: the write lock is taken up front, so a read-then-write inside
    cannot fail half-way on another writer. Connections run with isolation_level=None."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:  # SQLite has already rolled back after some errors
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def open_database(
    kind: DatabaseKind, path: Path, busy_timeout_s: float = 5.0
) -> sqlite3.Connection:
    """Open (creating if needed) and migrate `path`; raises `kind.error` in plain words."""
    with classified_errors(kind):
        make_private_file(path)  # before SQLite creates it with the umask's looser mode
        conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
        try:
            conn.execute("PRAGMA synchronous = FULL")
            _schema_version(kind, conn)  # refuse a newer schema before touching anything
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA foreign_keys = ON")
            _migrate(kind, conn)
        except BaseException:
            conn.close()
            raise
    return conn


def _schema_version(kind: DatabaseKind, conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > kind.schema_version:
        raise kind.error(
            f"{_capitalised(kind.label)} was written by a newer Hearthside (schema {version}; "
            f"this version understands up to {kind.schema_version}).",
            hint=f"Update Hearthside, or move {kind.file_name} out of its data folder.",
        )
    return version


def _migrate(kind: DatabaseKind, conn: sqlite3.Connection) -> None:
    if _schema_version(kind, conn) == kind.schema_version:
        return
    with transaction(conn):
        version = _schema_version(kind, conn)  # again, under the lock: another process may have
        while version < kind.schema_version:
            kind.migrations[version](conn)
            version += 1
        conn.execute(f"PRAGMA user_version = {kind.schema_version}")


def _capitalised(text: str) -> str:
    return text[:1].upper() + text[1:]
