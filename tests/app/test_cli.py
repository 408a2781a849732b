"""The `hearthside` command as a user runs it: real processes, the real default model."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from hearthside.app.cli import COMMANDS, build_parser

pytestmark = pytest.mark.beside

CLI = [sys.executable, "-m", "hearthside.app.cli"]


def run_cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("hearthside ")


def test_one_prompt_on_the_default_model_prints_a_sensible_answer() -> None:
    # No --model: the default model is installed into the empty data dir on first use.
    result = run_cli(
        "chat", "--prompt", "What colour is the sky on a clear day?", "--temperature", "0"
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "blue" in result.stdout.lower(), result.stdout
    assert "Loading" not in result.stdout  # status goes to stderr; stdout is the answer only


def test_the_default_model_answers_a_coding_question_with_code() -> None:
    """The first thing a newcomer may ask: an instruct model answers with a code block."""
    result = run_cli(
        "chat", "--prompt", "Write a Python function that reverses a string.",
        "--temperature", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "smollm2" in result.stderr.lower()  # the instruct model is the default
    fence = result.stdout.find("```")
    assert fence >= 0, result.stdout
    assert "def " in result.stdout[fence:], result.stdout
    assert "[::-1]" in result.stdout or "reversed(" in result.stdout, result.stdout


def test_the_default_model_answers_plain_questions_sensibly() -> None:
    # (a 135M model: asked without "in one word", its greedy answer with a full-precision KV
    # cache wanders off into French landmarks; a q4_0 cache happened to say Paris)
    result = run_cli(
        "chat", "--prompt", "What is the capital of France? Answer in one word.",
        "--temperature", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_chat_is_the_default_command(default_model_file: Path) -> None:
    result = run_cli(
        "--model", str(default_model_file), "--prompt", "What is the capital of France?",
        "--temperature", "0",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


def test_bench_json_reports_medians(default_model_file: Path) -> None:
    result = run_cli(
        "bench",
        "--model",
        str(default_model_file),
        "--json",
        "-p",
        "64",
        "-n",
        "16",
        "-r",
        "3",
        "--warmup-s",
        "0.2",
        "--ctx",
        "256",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    tests = {entry["test"]: entry for entry in report["results"]}
    assert set(tests) == {"pp64", "tg16"}
    for entry in tests.values():
        assert entry["median_tok_s"] > 0 and len(entry["samples_tok_s"]) == 3
    assert report["config"]["n_ctx"] == 256


def test_unknown_model_is_a_clear_error_not_a_traceback() -> None:
    result = run_cli("chat", "--model", "no-such-model", "--prompt", "hi")
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "Traceback" not in result.stderr


def test_ctrl_c_stops_the_reply_but_not_the_chat(default_model_file: Path) -> None:
    chat = subprocess.Popen(
        [*CLI, "chat", "--model", str(default_model_file), "--temperature", "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        # as from a terminal: a suite started in the background (`&`) ignores SIGINT, and a
        # child would inherit that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert chat.stdin is not None and chat.stdout is not None and chat.stderr is not None
    received, status = bytearray(), bytearray()
    readers = [  # both pipes drained, so neither can fill up and stall the chat
        threading.Thread(target=_drain, args=(pipe.fileno(), into), daemon=True)
        for pipe, into in ((chat.stdout, received), (chat.stderr, status))
    ]
    for reader in readers:
        reader.start()
    chat.stdin.write(b"Write a very long story about a dragon.\n")
    chat.stdin.flush()
    deadline = time.monotonic() + 60
    while len(received.split()) < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(received.split()) >= 8, "the reply never started streaming"
    chat.send_signal(signal.SIGINT)
    chat.stdin.write(b"What is the capital of France?\n/exit\n")
    chat.stdin.close()
    try:
        chat.wait(timeout=60)
    except subprocess.TimeoutExpired:
        chat.kill()
        for reader in readers:
            reader.join(5)
        pytest.fail(f"the chat did not end; stderr: {bytes(status)!r}; stdout: {bytes(received)!r}")
    for reader in readers:
        reader.join(5)
    assert chat.returncode == 0, bytes(status)
    assert b"stopped" in status
    assert b"Paris" in received  # the chat went on after the interrupted reply


def _drain(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 4096):
        into.extend(chunk)


@pytest.mark.parametrize("argv", [["chat", "--ctx", "zero"], ["nonsense"]])
def test_bad_arguments_exit_with_usage(argv: list[str]) -> None:
    result = run_cli(*argv)
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_every_command_is_listed_and_each_parses_alone() -> None:
    """`hearthside models list` builds the parser of `models` alone; each command's entry must
    name what its module registers, or that command would stop parsing."""
    full = _command_names(build_parser())
    assert full == [name for name, _module, _adder in COMMANDS]
    for name in full:
        assert _command_names(build_parser(name)) == [name]
    assert _command_names(build_parser("nonsense")) == full  # so the error lists them all


def test_a_light_command_imports_neither_the_engine_nor_the_api_server(tmp_path: Path) -> None:
    code = (
        "import sys; from hearthside.app.cli import main; main(['models', 'list', '--json']);"
        "print(sorted(m for m in ('llama_cpp', 'fastapi', 'torch') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HEARTHSIDE_HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def _command_names(parser: argparse.ArgumentParser) -> list[str]:
    (subparsers,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return list(subparsers.choices)
