"""Chat history: conversations and their messages in `<data dir>/history.db`.

This module owns history.db (STYLE.md practice 6): the schema version lives in
`PRAGMA user_version` and a database newer than this code is refused; the journal is WAL with
synchronous=FULL, so every committed write survives a crash of the app; SQLite errors caused
by the environment (disk full, read-only, locked, corrupt) become a HistoryError with a hint,
anything else is our bug and propagates. A damaged file is reported, never replaced.

A reply is written while it streams: the window inserts the assistant message (incomplete)
when the reply starts, rewrites its text at every flush and marks it complete at the end, so a
`kill -9` mid-reply loses nothing that was already on screen.

Each reply keeps the model that wrote it (schema 2; replies saved before that have none, and
show none rather than a wrong one). Regenerating a reply keeps the earlier text as a version:
the `messages` row always holds the version shown (what the model is given in later turns),
`reply_versions` holds the others, and flipping swaps one in — so every other reader of the
history (the terminal chat, the API) sees one plain message per turn.
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from hearthside.core.database import DatabaseKind, classified_errors, open_database, transaction
from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.errors import HearthsideError
from hearthside.core.paths import ensure_private_dir
from hearthside.core.serialize import from_jsonable, to_jsonable

SCHEMA_VERSION = 2
DB_FILE_NAME = "history.db"
DEFAULT_TITLE = "New chat"
TITLE_MAX_CHARS = 48
Role = Literal["system", "user", "assistant"]
_ROLES = ("system", "user", "assistant")
# The sampling settings a conversation keeps; grammar and stops belong to API requests.
_KEPT_SAMPLING_FIELDS: tuple[str, ...] = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "max_tokens",
    "seed",
)


class HistoryError(HearthsideError):
    """The chat history cannot do what was asked (damaged file, disk full, unknown chat...)."""


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created_at: str  # ISO 8601, UTC
    updated_at: str
    system_prompt: str
    sampling: SamplingParams
    model_id: str | None


@dataclass(frozen=True)
class StoredMessage:
    """One message. An assistant message is `complete` once its reply has ended (normally or
    stopped); an incomplete one was cut off by a crash. `metrics` exist for finished replies."""

    id: int
    conversation_id: int
    position: int  # 0, 1, 2 ... within its conversation
    role: Role
    content: str
    created_at: str
    complete: bool
    metrics: GenerationMetrics | None
    model_id: str | None = None  # the registry id of the model that wrote this reply
    model_name: str | None = None  # its name then; None for replies saved before schema 2
    version: int = 1  # which of the reply's versions this is (1 = the first written)
    version_count: int = 1  # how many versions regenerating has made

    @property
    def stopped(self) -> bool:
        """The user stopped this reply before the model finished it."""
        return self.metrics is not None and self.metrics.stop_reason == "cancelled"

    @property
    def interrupted(self) -> bool:
        """The app ended while this reply was streaming."""
        return not self.complete


def title_from_message(text: str, max_chars: int = TITLE_MAX_CHARS) -> str:
    """A conversation title from its first user message: one line, cut at a word boundary."""
    words = " ".join(text.split())
    if not words:
        return DEFAULT_TITLE
    if len(words) <= max_chars:
        return words
    cut = words[: max_chars - 1]
    if " " in cut[max_chars // 2 :]:
        cut = cut.rsplit(" ", 1)[0]
    return cut.rstrip(" ,.;:") + "…"


# --- SQLite ----------------------------------------------------------------------------------


def _create_schema_v1(conn: sqlite3.Connection) -> None:
    # AUTOINCREMENT: an id is never reused, so an Edit link or a streaming reply that still
    # holds the id of a deleted message can never land on a newer one.
    conn.execute(
        """
        CREATE TABLE conversations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            title TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '',
            sampling TEXT NOT NULL,
            model_id TEXT
        )
        """
    )
    conn.execute(
        """
        CREATE TABLE messages (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            conversation_id INTEGER NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
            position INTEGER NOT NULL,
            role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
            content TEXT NOT NULL,
            created_at TEXT NOT NULL,
            metrics TEXT,
            complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
            UNIQUE (conversation_id, position)
        )
        """
    )
    conn.execute("CREATE INDEX conversations_by_update ON conversations (updated_at DESC)")


def _add_reply_models_and_versions(conn: sqlite3.Connection) -> None:
    # Replies written before this schema keep NULL: their model is unknown, not the one loaded.
    conn.execute("ALTER TABLE messages ADD COLUMN model_id TEXT")
    conn.execute("ALTER TABLE messages ADD COLUMN model_name TEXT")
    conn.execute("ALTER TABLE messages ADD COLUMN version INTEGER NOT NULL DEFAULT 1")
    conn.execute(
        """
        CREATE TABLE reply_versions (
            message_id INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
            version INTEGER NOT NULL,
            content TEXT NOT NULL,
            created_at TEXT NOT NULL,
            metrics TEXT,
            complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
            model_id TEXT,
            model_name TEXT,
            PRIMARY KEY (message_id, version)
        )
        """
    )


HISTORY = DatabaseKind(
    label="Hearthside's chat history (history.db)",
    file_name=DB_FILE_NAME,
    schema_version=SCHEMA_VERSION,
    migrations={0: _create_schema_v1, 1: _add_reply_models_and_versions},
    error=HistoryError,
    damaged_hint="Close Hearthside and move history.db (and history.db-wal, if present) out "
    "of its data folder to keep a copy; Hearthside then starts a new, empty history. Your "
    "models are not affected.",
)


def _require_intact(conn: sqlite3.Connection) -> None:
    # A damaged page is otherwise found only when a query happens to read it, perhaps
    # half-way through saving a reply; quick_check reads every page once, in milliseconds.
    verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
    if verdict != "ok":
        message, hint = HISTORY.damaged()
        raise HistoryError(message, hint=hint)


def _casefold_contains(haystack: str | None, needle: str) -> bool:
    return haystack is not None and needle in haystack.casefold()


def _open_database(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    conn = open_database(HISTORY, path, busy_timeout_s)
    try:
        _require_intact(conn)
        conn.create_function("hs_contains", 2, _casefold_contains, deterministic=True)
    except BaseException:
        conn.close()
        raise
    return conn


# --- rows ------------------------------------------------------------------------------------


def _sampling_to_json(sampling: SamplingParams) -> str:
    data = sampling.to_dict()
    return json.dumps({name: data[name] for name in _KEPT_SAMPLING_FIELDS}, sort_keys=True)


def _sampling_from_json(text: str) -> SamplingParams:
    known = {f.name for f in fields(SamplingParams)} & set(_KEPT_SAMPLING_FIELDS)
    data = json.loads(text)
    return SamplingParams(**{key: value for key, value in data.items() if key in known})


def _metrics_to_json(metrics: GenerationMetrics | None) -> str | None:
    return None if metrics is None else json.dumps(to_jsonable(metrics), sort_keys=True)


def _metrics_from_json(text: str | None) -> GenerationMetrics | None:
    return None if text is None else from_jsonable(GenerationMetrics, json.loads(text))


def _conversation_from_row(row: sqlite3.Row) -> Conversation:
    return Conversation(
        id=row["id"],
        title=row["title"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        system_prompt=row["system_prompt"],
        sampling=_sampling_from_json(row["sampling"]),
        model_id=row["model_id"],
    )


def _message_from_row(row: sqlite3.Row) -> StoredMessage:
    return StoredMessage(
        id=row["id"],
        conversation_id=row["conversation_id"],
        position=row["position"],
        role=row["role"],
        content=row["content"],
        created_at=row["created_at"],
        complete=bool(row["complete"]),
        metrics=_metrics_from_json(row["metrics"]),
        model_id=row["model_id"],
        model_name=row["model_name"],
        version=row["version"],
        version_count=row["version_count"],
    )


_SELECT_MESSAGES = (
    "SELECT m.*, 1 + (SELECT COUNT(*) FROM reply_versions AS v WHERE v.message_id = m.id) "
    "AS version_count FROM messages AS m"
)


def _utc_now() -> str:
    # Microseconds keep "most recently updated first" stable within one second.
    return datetime.now(UTC).isoformat(timespec="microseconds")


# --- the store -------------------------------------------------------------------------------


class ConversationStore:
    """The chat history under one Hearthside data dir. One instance per thread."""

    def __init__(self, root: Path, *, busy_timeout_s: float = 5.0) -> None:
        self.root = ensure_private_dir(Path(root))
        self.db_path = self.root / DB_FILE_NAME
        with classified_errors(HISTORY):
            self._conn = _open_database(self.db_path, busy_timeout_s)
        self._conn.row_factory = sqlite3.Row

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> ConversationStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- conversations --

    def create(
        self,
        *,
        title: str = DEFAULT_TITLE,
        system_prompt: str = "",
        sampling: SamplingParams | None = None,
        model_id: str | None = None,
    ) -> Conversation:
        now = _utc_now()
        sampling_json = _sampling_to_json(sampling or SamplingParams())
        cursor = self._write(
            "INSERT INTO conversations (title, created_at, updated_at, system_prompt, sampling, "
            "model_id) VALUES (?, ?, ?, ?, ?, ?)",
            [_clean_title(title), now, now, system_prompt, sampling_json, model_id],
        )
        return self.get(_inserted_id(cursor))

    def get(self, conversation_id: int) -> Conversation:
        rows = self._read("SELECT * FROM conversations WHERE id = ?", [conversation_id])
        if not rows:
            raise HistoryError(
                "That chat no longer exists.", hint="It may have been deleted in another window."
            )
        return _conversation_from_row(rows[0])

    def list(self) -> builtins.list[Conversation]:
        """Every conversation, the most recently updated first."""
        rows = self._read("SELECT * FROM conversations ORDER BY updated_at DESC, id DESC")
        return [_conversation_from_row(row) for row in rows]

    def search(self, text: str) -> builtins.list[Conversation]:
        """Conversations whose title or any message contains `text` (case-insensitive)."""
        needle = text.strip().casefold()
        if not needle:
            return self.list()
        rows = self._read(
            "SELECT * FROM conversations AS c WHERE hs_contains(c.title, :needle) OR EXISTS ("
            "  SELECT 1 FROM messages AS m"
            "  WHERE m.conversation_id = c.id AND hs_contains(m.content, :needle)"
            ") ORDER BY updated_at DESC, id DESC",
            {"needle": needle},
        )
        return [_conversation_from_row(row) for row in rows]

    def rename(self, conversation_id: int, title: str) -> Conversation:
        self._update_conversation(conversation_id, "title = ?", [_clean_title(title)])
        return self.get(conversation_id)

    def update_settings(
        self, conversation_id: int, *, system_prompt: str, sampling: SamplingParams
    ) -> Conversation:
        self._update_conversation(
            conversation_id,
            "system_prompt = ?, sampling = ?",
            [system_prompt, _sampling_to_json(sampling)],
        )
        return self.get(conversation_id)

    def set_model(self, conversation_id: int, model_id: str | None) -> Conversation:
        self._update_conversation(conversation_id, "model_id = ?", [model_id])
        return self.get(conversation_id)

    def delete(self, conversation_id: int) -> None:
        self._write("DELETE FROM conversations WHERE id = ?", [conversation_id])

    # -- messages --

    def messages(self, conversation_id: int) -> builtins.list[StoredMessage]:
        rows = self._read(
            f"{_SELECT_MESSAGES} WHERE m.conversation_id = ? ORDER BY m.position",
            [conversation_id],
        )
        return [_message_from_row(row) for row in rows]

    def message(self, message_id: int) -> StoredMessage:
        rows = self._read(f"{_SELECT_MESSAGES} WHERE m.id = ?", [message_id])
        if not rows:
            raise HistoryError("That message no longer exists.")
        return _message_from_row(rows[0])

    def add_message(
        self,
        conversation_id: int,
        role: Role,
        content: str,
        *,
        complete: bool = True,
        metrics: GenerationMetrics | None = None,
        model_id: str | None = None,
        model_name: str | None = None,
    ) -> StoredMessage:
        """Append a message (a reply with the model writing it). The first user message of an
        untitled chat names the chat."""
        if role not in _ROLES:
            raise ValueError(f"unknown role {role!r}")
        with classified_errors(HISTORY), transaction(self._conn):
            conversation = self.get(conversation_id)
            position = self._next_position(conversation_id)
            cursor = self._conn.execute(
                "INSERT INTO messages (conversation_id, position, role, content, created_at, "
                "metrics, complete, model_id, model_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [conversation_id, position, role, content, _utc_now(),
                 _metrics_to_json(metrics), int(complete), model_id, model_name],
            )  # fmt: skip
            title = conversation.title
            if (
                role == "user"
                and title == DEFAULT_TITLE
                and not self._has_user_message_before(conversation_id, position)
            ):
                title = title_from_message(content)
            self._conn.execute(
                "UPDATE conversations SET updated_at = ?, title = ? WHERE id = ?",
                [_utc_now(), title, conversation_id],
            )
        return self.message(_inserted_id(cursor))

    def update_message(
        self,
        message_id: int,
        content: str,
        *,
        complete: bool = False,
        metrics: GenerationMetrics | None = None,
    ) -> None:
        """Rewrite a message's text: at every flush of a streaming reply, and at its end."""
        self._write(
            "UPDATE messages SET content = ?, complete = ?, metrics = ? WHERE id = ?",
            [content, int(complete), _metrics_to_json(metrics), message_id],
        )

    def finish_message(self, message_id: int, content: str, metrics: GenerationMetrics) -> None:
        """The reply has ended (the model stopped, or the user did): its final text."""
        with classified_errors(HISTORY), transaction(self._conn):
            self.update_message(message_id, content, complete=True, metrics=metrics)
            self._conn.execute(
                "UPDATE conversations SET updated_at = ? WHERE id = "
                "(SELECT conversation_id FROM messages WHERE id = ?)",
                [_utc_now(), message_id],
            )

    def edit_message(self, message_id: int, content: str) -> builtins.list[StoredMessage]:
        """Change a message and forget everything after it (edit-and-resend); the remaining
        messages are returned."""
        message = self.message(message_id)
        with classified_errors(HISTORY), transaction(self._conn):
            self._conn.execute(
                "UPDATE messages SET content = ?, complete = 1 WHERE id = ?", [content, message_id]
            )
            self._delete_after(message.conversation_id, message.position)
        return self.messages(message.conversation_id)

    def new_version(
        self, message_id: int, *, model_id: str | None = None, model_name: str | None = None
    ) -> StoredMessage:
        """Regenerate: keep the reply's shown text as a version and start a new, empty and
        incomplete one in its place (same message id), written by `model_name`."""
        with classified_errors(HISTORY), transaction(self._conn):
            shown = self.message(message_id)
            self._archive(shown)
            self._conn.execute(
                "UPDATE messages SET content = '', complete = 0, metrics = NULL, created_at = ?, "
                "model_id = ?, model_name = ?, version = ? WHERE id = ?",
                [_utc_now(), model_id, model_name, shown.version_count + 1, message_id],
            )
        return self.message(message_id)

    def show_version(self, message_id: int, version: int) -> StoredMessage:
        """Make `version` (1 ... version_count) the reply's shown version: the one the view
        shows and the model reads in later turns."""
        with classified_errors(HISTORY), transaction(self._conn):
            shown = self.message(message_id)
            if version != shown.version:
                self._archive(shown)
                self._restore(message_id, version)
        return self.message(message_id)

    def drop_shown_version(self, message_id: int) -> StoredMessage | None:
        """Forget the shown version (a regenerated reply that failed before writing anything):
        the latest earlier version is shown again; with none, the message goes. None then."""
        with classified_errors(HISTORY), transaction(self._conn):
            row = self._conn.execute(
                "SELECT MAX(version) FROM reply_versions WHERE message_id = ?", [message_id]
            ).fetchone()
            if row[0] is None:
                self._conn.execute("DELETE FROM messages WHERE id = ?", [message_id])
                return None
            self._restore(message_id, int(row[0]))
        return self.message(message_id)

    def delete_message(self, message_id: int) -> None:
        self._write("DELETE FROM messages WHERE id = ?", [message_id])

    def truncate_after(self, conversation_id: int, position: int) -> None:
        """Forget the messages after `position` (-1 forgets them all)."""
        with classified_errors(HISTORY), transaction(self._conn):
            self._delete_after(conversation_id, position)

    # -- internals --

    def pragma(self, name: str) -> Any:
        """One PRAGMA's value, for diagnostics and tests (`journal_mode`, `synchronous`)."""
        if not name.isidentifier():
            raise ValueError(f"not a pragma name: {name!r}")
        return self._conn.execute(f"PRAGMA {name}").fetchone()[0]

    def _archive(self, message: StoredMessage) -> None:
        self._conn.execute(
            "INSERT INTO reply_versions (message_id, version, content, created_at, metrics, "
            "complete, model_id, model_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [message.id, message.version, message.content, message.created_at,
             _metrics_to_json(message.metrics), int(message.complete), message.model_id,
             message.model_name],
        )  # fmt: skip

    def _restore(self, message_id: int, version: int) -> None:
        """Move archived `version` into the messages row (whose own text is archived first)."""
        kept = self._conn.execute(
            "SELECT * FROM reply_versions WHERE message_id = ? AND version = ?",
            [message_id, version],
        ).fetchone()
        if kept is None:
            raise HistoryError("That version of the reply no longer exists.")
        self._conn.execute(
            "UPDATE messages SET content = ?, created_at = ?, metrics = ?, complete = ?, "
            "model_id = ?, model_name = ?, version = ? WHERE id = ?",
            [kept["content"], kept["created_at"], kept["metrics"], kept["complete"],
             kept["model_id"], kept["model_name"], version, message_id],
        )  # fmt: skip
        self._conn.execute(
            "DELETE FROM reply_versions WHERE message_id = ? AND version = ?",
            [message_id, version],
        )

    def _next_position(self, conversation_id: int) -> int:
        row = self._conn.execute(
            "SELECT COALESCE(MAX(position), -1) + 1 FROM messages WHERE conversation_id = ?",
            [conversation_id],
        ).fetchone()
        return int(row[0])

    def _has_user_message_before(self, conversation_id: int, position: int) -> bool:
        row = self._conn.execute(
            "SELECT 1 FROM messages WHERE conversation_id = ? AND role = 'user' AND position < ?",
            [conversation_id, position],
        ).fetchone()
        return row is not None

    def _delete_after(self, conversation_id: int, position: int) -> None:
        self._conn.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND position > ?",
            [conversation_id, position],
        )
        self._conn.execute(
            "UPDATE conversations SET updated_at = ? WHERE id = ?", [_utc_now(), conversation_id]
        )

    def _update_conversation(
        self, conversation_id: int, assignments: str, params: builtins.list[Any]
    ) -> None:
        self.get(conversation_id)  # a clear error for a chat deleted meanwhile
        self._write(
            f"UPDATE conversations SET {assignments}, updated_at = ? WHERE id = ?",
            [*params, _utc_now(), conversation_id],
        )

    def _read(self, sql: str, params: Any = ()) -> builtins.list[sqlite3.Row]:
        with classified_errors(HISTORY):
            return self._conn.execute(sql, params).fetchall()

    def _write(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        with classified_errors(HISTORY):
            return self._conn.execute(sql, params)


def _clean_title(title: str) -> str:
    cleaned = " ".join(title.split())
    return cleaned[:200] if cleaned else DEFAULT_TITLE


def _inserted_id(cursor: sqlite3.Cursor) -> int:
    if cursor.lastrowid is None:
        raise HistoryError("The chat history did not save the new entry.")
    return cursor.lastrowid
