"""Issue 36 item 5: a named pipe (or folder, or device) where the API key file belongs is
refused with a plain error at once; opening a FIFO for reading used to block `serve` forever
without a word."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hearthside.core.paths import data_dir
from hearthside.core.server.keys import (
    ApiKeyFileError,
    load_or_create_api_key,
    load_or_create_user_key_file,
    read_private_text,
)

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX's"),
    pytest.mark.beside,
]
WAIT_S = 5.0


def outcome_within(function: object, path: Path, wait_s: float = WAIT_S) -> BaseException | None:
    """What `function(path)` raised, run on a thread that must finish within `wait_s`."""
    raised: list[BaseException | None] = []

    def call() -> None:
        try:
            function(path)  # type: ignore[operator]
        except BaseException as exc:
            raised.append(exc)
        else:
            raised.append(None)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(wait_s)
    if thread.is_alive():
        with open(path, "wb"):  # unblock a reader stuck on the pipe, so the test can end
            pass
        pytest.fail(f"{getattr(function, '__name__', function)} blocked on the named pipe")
    return raised[0]


@pytest.mark.parametrize(
    "function", [load_or_create_api_key, load_or_create_user_key_file, read_private_text]
)
def test_a_named_pipe_as_key_file_is_refused_at_once(function: object, tmp_path: Path) -> None:
    pipe = tmp_path / "api_key"
    os.mkfifo(pipe, 0o600)
    error = outcome_within(function, pipe)
    assert isinstance(error, ApiKeyFileError)
    assert error.message == f"{pipe} is a named pipe, not an ordinary file, so Hearthside " + (
        "cannot keep a key in it."
    )
    assert f"Remove or rename {pipe}" in (error.hint or "")
    assert pipe.exists()  # never replaced behind the user's back


def test_a_folder_as_key_file_is_refused_as_a_folder(tmp_path: Path) -> None:
    folder = tmp_path / "api_key"
    folder.mkdir()
    with pytest.raises(ApiKeyFileError, match="is a folder, not an ordinary file"):
        load_or_create_api_key(folder)


def test_an_ordinary_key_file_still_works(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    key = load_or_create_api_key(path)
    assert load_or_create_api_key(path) == key
    assert read_private_text(path) == key + "\n"


def test_serve_with_a_pipe_as_its_key_file_says_so_and_exits(default_model_file: Path) -> None:
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.mkfifo(folder / "api_key", 0o600)
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(default_model_file),
         "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.startswith("error: ")
    assert "is a named pipe, not an ordinary file" in result.stderr
    assert "Traceback" not in result.stderr
