"""The chat history on real SQLite files: durability settings, schema, errors, search."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import GenerationMetrics
from hearthside.core.history.store import (
    DB_FILE_NAME,
    DEFAULT_TITLE,
    SCHEMA_VERSION,
    ConversationStore,
    HistoryError,
    title_from_message,
)
from hearthside.core.paths import data_dir

pytestmark = pytest.mark.beside

METRICS = GenerationMetrics(
    prompt_tokens=12,
    prompt_tokens_evaluated=12,
    completion_tokens=5,
    ttft_s=0.1,
    prompt_tok_s=120.0,
    decode_tok_s=70.0,
    total_s=0.2,
    stop_reason="eos",
)


@pytest.fixture
def store() -> ConversationStore:
    with ConversationStore(data_dir()) as opened:
        yield opened


def test_wal_and_full_sync_are_really_set(store: ConversationStore) -> None:
    assert store.pragma("journal_mode") == "wal"
    assert store.pragma("synchronous") == 2  # FULL
    assert store.pragma("foreign_keys") == 1
    # The WAL mode is a property of the file: a second, plain connection sees it too.
    conn = sqlite3.connect(store.db_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_schema_version_is_recorded(store: ConversationStore) -> None:
    assert store.pragma("user_version") == SCHEMA_VERSION
    conn = sqlite3.connect(store.db_path)
    try:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    finally:
        conn.close()
    assert {"conversations", "messages"} <= tables


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_history_file_is_private(store: ConversationStore) -> None:
    assert stat.S_IMODE(store.db_path.stat().st_mode) == 0o600


def test_a_newer_schema_is_refused_not_touched() -> None:
    root = data_dir()
    ConversationStore(root).close()
    conn = sqlite3.connect(root / DB_FILE_NAME)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(HistoryError, match="newer Hearthside") as caught:
        ConversationStore(root)
    assert caught.value.hint


def test_a_file_that_is_not_a_database_is_an_error_with_a_hint_and_is_kept() -> None:
    path = data_dir() / DB_FILE_NAME
    garbage = b"this is not SQLite at all\n" * 200
    path.write_bytes(garbage)
    with pytest.raises(HistoryError, match="damaged") as caught:
        ConversationStore(data_dir())
    assert "move history.db" in (caught.value.hint or "")
    assert path.read_bytes() == garbage  # never silently wiped


def test_a_damaged_page_is_found_at_open() -> None:
    root = data_dir()
    with ConversationStore(root) as store:
        conversation = store.create()
        for number in range(300):
            store.add_message(conversation.id, "user", f"message {number} " + "x" * 200)
    conn = sqlite3.connect(root / DB_FILE_NAME)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    path = root / DB_FILE_NAME
    data = bytearray(path.read_bytes())
    page_size = 4096
    assert len(data) > 8 * page_size
    data[3 * page_size : 5 * page_size] = b"\xa5" * (2 * page_size)  # scribble over two pages
    path.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match="damaged"):
        ConversationStore(root)
    assert path.read_bytes() == bytes(data)


def test_conversation_round_trip_with_settings(store: ConversationStore) -> None:
    sampling = SamplingParams(temperature=0.2, top_p=0.5, max_tokens=64, seed=7)
    created = store.create(system_prompt="Be brief.", sampling=sampling, model_id="gemma")
    loaded = store.get(created.id)
    assert loaded.title == DEFAULT_TITLE
    assert loaded.system_prompt == "Be brief."
    assert loaded.sampling == sampling
    assert loaded.model_id == "gemma"
    changed = store.update_settings(
        created.id, system_prompt="", sampling=SamplingParams(temperature=0)
    )
    assert changed.sampling.temperature == 0 and changed.system_prompt == ""


def test_first_user_message_names_the_chat_and_rename_wins(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_message(conversation.id, "user", "What is the capital of France?")
    store.add_message(conversation.id, "assistant", "Paris.")
    store.add_message(conversation.id, "user", "And of Spain?")
    assert store.get(conversation.id).title == "What is the capital of France?"
    store.rename(conversation.id, "  Capitals \n of Europe ")
    assert store.get(conversation.id).title == "Capitals of Europe"
    store.add_message(conversation.id, "user", "And of Italy?")
    assert store.get(conversation.id).title == "Capitals of Europe"


def test_titles_are_shortened_at_a_word() -> None:
    long = "Please explain in great detail how a transformer language model predicts tokens"
    title = title_from_message(long)
    assert title.endswith("…") and len(title) <= 48
    assert long.startswith(title[:-1])
    assert title_from_message("  \n ") == DEFAULT_TITLE
    assert title_from_message("Hi\nthere") == "Hi there"


def test_a_streaming_reply_is_saved_at_every_flush(store: ConversationStore) -> None:
    conversation = store.create()
    store.add_message(conversation.id, "user", "Tell me a story.")
    reply = store.add_message(conversation.id, "assistant", "", complete=False)
    store.update_message(reply.id, "Once upon")
    # What a crash would leave: another connection reads the partial reply, incomplete.
    with ConversationStore(store.root) as other:
        partial = other.messages(conversation.id)[-1]
    assert (partial.content, partial.complete, partial.interrupted) == ("Once upon", False, True)
    stopped = GenerationMetrics(**{**METRICS.__dict__, "stop_reason": "cancelled"})
    store.finish_message(reply.id, "Once upon a time", stopped)
    final = store.message(reply.id)
    assert final.complete and final.stopped and final.metrics == stopped


def test_positions_and_edit_truncates_after_the_edited_message(store: ConversationStore) -> None:
    conversation = store.create()
    for role, text in [("user", "one"), ("assistant", "two"), ("user", "three")]:
        store.add_message(conversation.id, role, text)  # type: ignore[arg-type]
    store.add_message(conversation.id, "assistant", "four", metrics=METRICS)
    messages = store.messages(conversation.id)
    assert [m.position for m in messages] == [0, 1, 2, 3]
    assert messages[3].metrics == METRICS
    remaining = store.edit_message(messages[2].id, "three, edited")
    assert [(m.role, m.content) for m in remaining] == [
        ("user", "one"),
        ("assistant", "two"),
        ("user", "three, edited"),
    ]
    added = store.add_message(conversation.id, "assistant", "new four")
    assert added.position == 3


def test_truncate_and_delete_message(store: ConversationStore) -> None:
    conversation = store.create()
    first = store.add_message(conversation.id, "user", "a")
    last = store.add_message(conversation.id, "assistant", "b")
    store.delete_message(last.id)
    assert [m.id for m in store.messages(conversation.id)] == [first.id]
    store.truncate_after(conversation.id, -1)
    assert store.messages(conversation.id) == []


def test_delete_removes_the_messages_too(store: ConversationStore) -> None:
    kept = store.create()
    gone = store.create()
    store.add_message(gone.id, "user", "bye")
    store.delete(gone.id)
    assert [c.id for c in store.list()] == [kept.id]
    with pytest.raises(HistoryError):
        store.get(gone.id)
    conn = sqlite3.connect(store.db_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    finally:
        conn.close()


def test_list_puts_the_latest_activity_first(store: ConversationStore) -> None:
    older = store.create()
    newer = store.create()
    assert [c.id for c in store.list()] == [newer.id, older.id]
    store.add_message(older.id, "user", "bump")
    assert [c.id for c in store.list()] == [older.id, newer.id]


def test_search_finds_titles_and_content_case_insensitively(store: ConversationStore) -> None:
    about_rust = store.create(title="Rust lifetimes")
    about_paris = store.create()
    store.add_message(about_paris.id, "user", "Plan a weekend in Paris")
    store.add_message(about_paris.id, "assistant", "Visit the Musée d'Orsay.")
    store.create(title="Groceries")
    assert [c.id for c in store.search("rust")] == [about_rust.id]
    assert [c.id for c in store.search("MUSÉE")] == [about_paris.id]  # not only ASCII
    assert [c.id for c in store.search("weekend in")] == [about_paris.id]
    assert store.search("100%_") == []  # LIKE wildcards are plain text here
    assert len(store.search("  ")) == 3


def test_reopening_keeps_everything(hearthside_home: Path) -> None:
    with ConversationStore(data_dir()) as store:
        conversation = store.create()
        store.add_message(conversation.id, "user", "remember me")
    with ConversationStore(data_dir()) as reopened:
        assert [m.content for m in reopened.messages(conversation.id)] == ["remember me"]
        assert reopened.get(conversation.id).title == "remember me"


def test_unknown_chat_is_a_plain_error(store: ConversationStore) -> None:
    with pytest.raises(HistoryError, match="no longer exists"):
        store.add_message(12345, "user", "hello")
