"""The terminal chat keeps its conversations in the window's history: real `hearthside chat`
processes on the real default chat model (SmolLM2 135M Instruct), then the history database
read the way the window reads it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.app.gui.chat_session import engine_messages
from hearthside.core.history.store import ConversationStore

pytestmark = pytest.mark.beside

CLI = [sys.executable, "-m", "hearthside.app.cli"]
FIRST = "My name is Ada. Please remember it."
SECOND = "What is my name?"
LONG_STORY = (
    "Write a very long story, at least 3000 words, about a dragon who learns to bake bread. "
    "Use many chapters."
)


def chat(model: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "chat", "--model", str(model), "--temperature", "0", *args],
        capture_output=True,
        text=True,
        timeout=600,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def prompt_tokens(stats_line: str) -> int:
    """From `--stats`: "[… · 12/40 prompt tokens evaluated]" → 40."""
    match = re.search(r"(\d+)/(\d+) prompt tokens evaluated", stats_line)
    assert match is not None, stats_line
    return int(match.group(2))


@pytest.mark.slow
def test_resume_continues_the_last_chat_and_the_window_lists_it(
    chat_model_file: Path, hearthside_home: Path
) -> None:
    first = chat(chat_model_file, "--prompt", FIRST, "--max-tokens", "8")
    assert first.returncode == 0, first.stderr
    resumed = chat(chat_model_file, "--resume", "--prompt", SECOND, "--max-tokens", "8", "--stats")
    assert resumed.returncode == 0, resumed.stderr
    fresh = chat(chat_model_file, "--no-history", "--prompt", SECOND, "--max-tokens", "8",
                 "--stats")  # fmt: skip
    assert fresh.returncode == 0, fresh.stderr
    # the resumed reply was written with the first turn in front of it; a fresh one was not
    assert prompt_tokens(resumed.stderr) > prompt_tokens(fresh.stderr) + 10

    with ConversationStore(hearthside_home) as store:  # what the window opens
        conversations = store.list()
        assert len(conversations) == 1  # --no-history saved nothing
        chat_ = conversations[0]
        assert chat_.title == FIRST
        messages = store.messages(chat_.id)
    assert [(m.role, m.complete) for m in messages] == [
        ("user", True), ("assistant", True), ("user", True), ("assistant", True)
    ]  # fmt: skip
    assert messages[0].content == FIRST and messages[2].content == SECOND
    assert messages[3].content.strip() == resumed.stdout.strip()
    assert messages[3].metrics is not None and messages[3].metrics.completion_tokens <= 8
    window_view = engine_messages(chat_, messages)
    assert [m.content for m in window_view][::2] == [FIRST, SECOND]


@pytest.mark.slow
def test_history_lists_saved_chats_in_the_repl(chat_model_file: Path) -> None:
    saved = chat(chat_model_file, "--prompt", FIRST, "--max-tokens", "4")
    assert saved.returncode == 0, saved.stderr
    repl = chat(chat_model_file, "--resume", "1", "--max-tokens", "4", stdin="/history\n/exit\n")
    assert repl.returncode == 0, repl.stderr
    assert f"Continuing chat 1 ({FIRST})" in repl.stderr
    assert "Recent chats (continue one with `hearthside chat --resume ID`):" in repl.stderr
    assert re.search(rf"\*\s+1\s+\d{{4}}-\d\d-\d\d \d\d:\d\d\s+{re.escape(FIRST)}", repl.stderr)


def test_resume_with_nothing_saved_says_how_to_start(chat_model_file: Path) -> None:
    result = chat(chat_model_file, "--resume", "--prompt", SECOND)
    assert result.returncode != 0
    assert "There is no saved chat to resume yet." in result.stderr
    assert "Start one with `hearthside chat`" in result.stderr
    assert "Traceback" not in result.stderr and "Loading" not in result.stderr


@pytest.mark.slow
def test_resume_of_an_unknown_chat_names_it(chat_model_file: Path) -> None:
    assert chat(chat_model_file, "--prompt", FIRST, "--max-tokens", "2").returncode == 0
    result = chat(chat_model_file, "--resume", "42", "--prompt", SECOND)
    assert result.returncode != 0
    assert "There is no saved chat with id 42." in result.stderr
    assert "`/history`" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_reply_without_max_tokens_stops_at_the_windows_length(
    chat_model_file: Path, hearthside_home: Path
) -> None:
    # A story this long outgrows 512 tokens whatever the CPU's rounding makes of it (a loop
    # that never ended on one machine's kernels ended after 110 tokens on another's).
    result = chat(chat_model_file, "--prompt", LONG_STORY)
    assert result.returncode == 0, result.stderr
    with ConversationStore(hearthside_home) as store:
        reply = store.messages(store.list()[0].id)[-1]
    assert reply.metrics is not None
    assert reply.metrics.completion_tokens == 512
    assert reply.metrics.stop_reason == "length"
