"""`hearthside serve` as its own process, answering the `openai` client."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from hearthside.app import serve_cli
from hearthside.app.cli import build_parser, main
from hearthside.core.engine.config import EngineConfig
from hearthside.core.server.keys import load_or_create_api_key


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_up(base: str, key: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "hearthside serve exited early"
        try:
            if httpx.get(f"{base}/health", headers={"Authorization": f"Bearer {key}"}).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("the server did not come up")


def test_serve_answers_the_openai_client(default_model_file: Path, hearthside_home: Path) -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(default_model_file),
         "--port", str(port), "--ctx", "1024"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )  # fmt: skip
    try:
        key = load_or_create_api_key(hearthside_home / "api_key")
        base = f"http://127.0.0.1:{port}"
        wait_until_up(base, key, process)
        assert (hearthside_home / "api_key").stat().st_mode & 0o777 == 0o600
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(
            model="default",
            messages=question,
            temperature=0,
            max_tokens=8,  # type: ignore[arg-type]
        )
        assert "Paris" in (whole.choices[0].message.content or "")
        streamed = client.chat.completions.create(
            model="default",
            messages=question,
            temperature=0,
            max_tokens=8,
            stream=True,  # type: ignore[arg-type]
        )
        text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
        assert text == whole.choices[0].message.content
        refused = httpx.get(f"{base}/v1/models")  # no key
        assert refused.status_code == 401
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        finally:
            process.kill()
    assert process.returncode in (0, 130)  # 130: the conventional exit after Ctrl-C
    assert process.stderr is not None and b"Traceback" not in process.stderr.read()


def test_serve_refuses_a_lan_bind_without_a_key(default_model_file: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(default_model_file),
         "--host", "0.0.0.0", "--no-key", "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr


def test_serve_refuses_a_key_file_that_is_not_a_key(
    default_model_file: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "documents"
    folder.mkdir()
    folder.chmod(0o755)
    users_file = folder / "thesis.txt"
    users_file.write_text("Chapter 1\n")
    users_file.chmod(0o644)
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(default_model_file),
         "--api-key-file", str(users_file), "--port", str(free_port())],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode != 0
    assert "holds something that is not a Hearthside API key" in result.stderr
    assert "Point --api-key-file at a new path" in result.stderr
    assert "Traceback" not in result.stderr
    assert users_file.read_text() == "Chapter 1\n"
    assert users_file.stat().st_mode & 0o777 == 0o644
    assert folder.stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("value", ["0", "65", "4.5", "many"])
def test_serve_refuses_parallel_outside_1_to_64(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--parallel", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --parallel: parallel requests are a whole number from 1 to 64, not '{value}'"
        in err
    )


class Stop(Exception):
    """Raised by the stand-in for config_for: the test has seen what it needs."""


@pytest.mark.parametrize(
    ("argv", "asked"),
    [
        ([], (None, None, None)),
        (["--parallel", "6"], (None, None, 6)),
        (["--threads", "3", "--batch-threads", "5"], (3, 5, None)),
    ],
)
def test_serve_passes_threads_and_parallel_to_the_load_settings(
    argv: list[str], asked: tuple[int | None, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[object] = []

    def config_for(*args: object) -> None:
        seen.append(args)
        raise Stop

    monkeypatch.setattr(serve_cli, "config_for", config_for)
    assert main(["serve", "--model", "m.gguf", "--ctx", "2048", *argv]) == 2
    assert seen == [("m.gguf", 2048, *asked)]  # None: the planner's choice


def test_serve_takes_parallel_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEARTHSIDE_PARALLEL", "3")
    assert build_parser().parse_args(["serve"]).parallel == 3


def test_serve_says_how_many_requests_it_answers_at_once() -> None:
    assert serve_cli.slots_note(EngineConfig("m.gguf", n_ctx=8192, n_parallel=4)) == (
        "Answers 4 requests at once, 8192 tokens each."
    )
    assert serve_cli.slots_note(EngineConfig("m.gguf", n_ctx=4096)) == (
        "Answers one request at a time (4096 tokens); others wait their turn."
    )


def test_serve_takes_how_many_models_requests_may_keep_loaded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert build_parser().parse_args(["serve"]).max_models == 2
    assert build_parser().parse_args(["serve", "--max-models", "3"]).max_models == 3
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["serve", "--max-models", "0"])
    assert exit_.value.code == 2
    assert "give a whole number of at least 1, not '0'" in capsys.readouterr().err
