"""The terminal chat when the engine worker crashes mid-reply: a real signal sent to the real
worker (SmolLM2 135M) at the third piece of text. The REPL prints what happened, keeps the
partial reply on screen and in the history, waits for the restart and answers the next
prompt; `--prompt` exits with an error."""

from __future__ import annotations

import builtins
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.app import terminal_chat
from hearthside.app.terminal_chat import ChatOptions, run_one_prompt, run_repl
from hearthside.core.engine.service import EngineService
from hearthside.core.history.store import ConversationStore, StoredMessage
from hearthside.core.logs import log_file

pytestmark = pytest.mark.beside

STORY = "Tell me a long story about a lighthouse keeper."
NEXT = "Thank you. Say goodbye."


def crash_at_third_piece(monkeypatch: pytest.MonkeyPatch, sig: signal.Signals) -> list[int]:
    """Send `sig` to the chat's engine worker once the third piece of the first reply is on
    screen; the pids of the workers it killed."""
    services: list[EngineService] = []
    start_service = terminal_chat._start_service
    write_piece = terminal_chat._write_reply_piece
    pieces: list[str] = []
    killed: list[int] = []

    def start(options: ChatOptions) -> EngineService:
        services.append(start_service(options))
        return services[-1]

    def write(piece: str) -> None:
        write_piece(piece)
        pieces.append(piece)
        pid = services[0].worker_pid
        if len(pieces) == 3 and pid is not None:
            killed.append(pid)
            os.kill(pid, sig)

    monkeypatch.setattr(terminal_chat, "_start_service", start)
    monkeypatch.setattr(terminal_chat, "_write_reply_piece", write)
    return killed


def typed(monkeypatch: pytest.MonkeyPatch, lines: list[str]) -> None:
    """`input()` answers with `lines`, one per prompt, then Ctrl-D."""
    pending: Iterator[str] = iter(lines)

    def read(_prompt: str = "") -> str:
        try:
            return next(pending)
        except StopIteration:
            raise EOFError from None

    monkeypatch.setattr(builtins, "input", read)


def saved_chat(home: Path) -> list[StoredMessage]:
    with ConversationStore(home) as store:
        (conversation,) = store.list()
        return store.messages(conversation.id)


def options_for(model: Path) -> ChatOptions:
    return ChatOptions(
        model=str(model),
        n_ctx=512,
        n_threads=1,
        n_threads_batch=1,
        temperature=0,
        max_tokens=10,
        seed=1,
    )


def test_a_crash_mid_reply_is_explained_and_the_next_prompt_is_answered(
    chat_model_file: Path,
    hearthside_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    killed = crash_at_third_piece(monkeypatch, signal.SIGKILL)
    typed(monkeypatch, [STORY, NEXT])
    assert run_repl(options_for(chat_model_file)) == 0
    assert len(killed) == 1
    out, err = capsys.readouterr()

    messages = saved_chat(hearthside_home)
    assert [(m.role, m.complete) for m in messages] == [
        ("user", True), ("assistant", True), ("user", True), ("assistant", True)
    ]  # fmt: skip
    partial, answer = messages[1].content, messages[3].content
    assert partial and answer
    assert partial in out and answer in out  # the partial reply stayed on screen
    assert messages[1].metrics is None and messages[3].metrics is not None

    crashed, restarted = [line for line in err.splitlines() if "engine" in line][-2:]
    assert crashed.startswith(
        "The engine crashed (SIGKILL, killed, most often by the system for want of memory) "
        "while writing this reply; the part above is kept in the chat"
    )
    assert str(log_file(hearthside_home)) in crashed and crashed.endswith("Restarting it…")
    assert restarted == (
        "The engine is running again, with the same settings. Go on with your next message."
    )
    logged = log_file(hearthside_home).read_text(encoding="utf-8")
    assert "the engine worker crashed: SIGKILL" in logged


def test_a_crash_in_a_one_shot_prompt_is_an_error(
    chat_model_file: Path,
    hearthside_home: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    crash_at_third_piece(monkeypatch, signal.SIGSEGV)
    assert run_one_prompt(options_for(chat_model_file), STORY) == 2
    out, err = capsys.readouterr()
    messages = saved_chat(hearthside_home)
    assert [(m.role, m.complete) for m in messages] == [("user", True), ("assistant", True)]
    assert messages[1].content and messages[1].content in out
    assert err.strip().splitlines()[-1] == (
        "error: The engine crashed (SIGSEGV, a segmentation fault) while writing the reply; "
        "the part printed is saved in the chat (`hearthside chat --resume 1` continues it). "
        f"The details are in {log_file(hearthside_home)}."
    )
