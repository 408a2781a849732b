"""Schema 2 of the chat history on real SQLite files: each reply keeps the model that wrote
it, regenerating keeps every version, and a schema-1 file is migrated without inventing a
model for the replies it already held."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hearthside.core.engine.engine import GenerationMetrics
from hearthside.core.history.store import (
    SCHEMA_VERSION,
    ConversationStore,
    HistoryError,
    _create_schema_v1,
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


def test_a_reply_keeps_the_model_that_wrote_it(store: ConversationStore) -> None:
    chat = store.create()
    store.add_message(chat.id, "user", "Hi")
    first = store.add_message(chat.id, "assistant", "Hello", model_id="smol", model_name="SmolLM2")
    store.add_message(chat.id, "user", "Again")
    second = store.add_message(chat.id, "assistant", "Hey", model_id="gemma", model_name="Gemma")
    with ConversationStore(store.root) as reopened:
        names = [(m.model_id, m.model_name) for m in reopened.messages(chat.id)]
    assert names == [(None, None), ("smol", "SmolLM2"), (None, None), ("gemma", "Gemma")]
    assert (first.version, first.version_count, second.version) == (1, 1, 1)


def test_a_schema_1_history_is_migrated_and_old_replies_have_no_model(tmp_path: Path) -> None:
    root = tmp_path / "home"
    root.mkdir()
    conn = sqlite3.connect(root / "history.db")
    _create_schema_v1(conn)
    conn.execute(
        "INSERT INTO conversations (title, created_at, updated_at, sampling) "
        "VALUES ('Old chat', '2026-01-01T10:00:00+00:00', '2026-01-01T10:00:00+00:00', '{}')"
    )
    conn.execute(
        "INSERT INTO messages (conversation_id, position, role, content, created_at, complete) "
        "VALUES (1, 0, 'assistant', 'An old answer', '2026-01-01T10:00:00+00:00', 1)"
    )
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()
    with ConversationStore(root) as migrated:
        assert migrated.pragma("user_version") == SCHEMA_VERSION == 2
        [old] = migrated.messages(1)
        assert (old.content, old.model_name, old.model_id, old.version_count) == (
            "An old answer", None, None, 1,
        )  # fmt: skip
        regenerated = migrated.new_version(old.id, model_id="g", model_name="Gemma")
        assert (regenerated.version, regenerated.version_count) == (2, 2)


def test_regenerate_keeps_versions_and_flipping_swaps_the_shown_one(
    store: ConversationStore,
) -> None:
    chat = store.create()
    store.add_message(chat.id, "user", "Name a fruit.")
    reply = store.add_message(
        chat.id, "assistant", "Apple.", metrics=METRICS, model_id="smol", model_name="SmolLM2"
    )
    fresh = store.new_version(reply.id, model_id="gemma", model_name="Gemma")
    assert (fresh.id, fresh.content, fresh.complete, fresh.metrics) == (reply.id, "", False, None)
    assert (fresh.version, fresh.version_count, fresh.model_name) == (2, 2, "Gemma")
    store.finish_message(reply.id, "Pear.", METRICS)
    first = store.show_version(reply.id, 1)
    assert (first.content, first.model_name, first.version, first.version_count) == (
        "Apple.", "SmolLM2", 1, 2,
    )  # fmt: skip
    assert first.complete and first.metrics == METRICS
    with ConversationStore(store.root) as reopened:  # the choice survives a restart
        assert reopened.message(reply.id).content == "Apple."
        second = reopened.show_version(reply.id, 2)
    assert (second.content, second.model_name, second.complete) == ("Pear.", "Gemma", True)
    with pytest.raises(HistoryError):
        store.show_version(reply.id, 3)
    assert store.message(reply.id).content == "Pear."  # the failed flip changed nothing


def test_a_failed_regeneration_shows_the_earlier_version_again(store: ConversationStore) -> None:
    chat = store.create()
    store.add_message(chat.id, "user", "Hi")
    reply = store.add_message(chat.id, "assistant", "Hello", model_name="SmolLM2")
    store.new_version(reply.id, model_name="Gemma")
    back = store.drop_shown_version(reply.id)
    assert back is not None
    assert (back.content, back.model_name, back.version_count) == ("Hello", "SmolLM2", 1)
    assert store.drop_shown_version(reply.id) is None  # no earlier version: the reply goes
    assert [m.role for m in store.messages(chat.id)] == ["user"]


def test_editing_an_earlier_message_forgets_the_later_replies_versions(
    store: ConversationStore,
) -> None:
    chat = store.create()
    question = store.add_message(chat.id, "user", "Hi")
    reply = store.add_message(chat.id, "assistant", "Hello")
    store.new_version(reply.id)
    store.edit_message(question.id, "Hello?")
    conn = sqlite3.connect(store.db_path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM reply_versions").fetchone()[0] == 0
    finally:
        conn.close()
