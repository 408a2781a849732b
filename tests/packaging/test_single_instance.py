"""One Hearthside per user and data dir: two real app processes on the offscreen platform.

The first process is `hearthside gui` with a model path that does not exist, so it opens
its window and shows an error instead of loading an engine (nothing here needs the engine);
HEARTHSIDE_STARTUP_MARKER makes it write `shown` / `activated` lines we can wait for.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtCore import QDir

from hearthside.app.gui.single_instance import (
    ActivationRequest,
    ForwardResult,
    forward_to_running_instance,
    instance_key,
)

pytestmark = [pytest.mark.gui, pytest.mark.slow]

START_TIMEOUT_S = 90.0  # a cold start on a busy 2-core machine
SECOND_LAUNCH_TIMEOUT_S = 60.0
NOTICE = "Hearthside is already running"


def test_requests_round_trip_and_junk_is_refused() -> None:
    for request in (ActivationRequest(), ActivationRequest(model="qwen3-0.6b")):
        encoded = request.encode()
        assert encoded.endswith(b"\n") and ActivationRequest.decode(encoded.strip()) == request
    junk_messages = (b"", b"\xff\xfe", b"[]", b'{"action": "quit"}')
    for junk in (*junk_messages, b'{"action": "activate", "model": ""}'):
        with pytest.raises(ValueError):
            ActivationRequest.decode(junk)


def test_the_key_differs_per_user_and_data_dir_and_fits_a_socket_path(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    keys = {instance_key(one, "ann"), instance_key(two, "ann"), instance_key(one, "bob")}
    assert len(keys) == 3
    assert instance_key(one, "ann") == instance_key(one / ".." / "one", "ann")
    assert all(len(key) < 60 and key.isascii() for key in keys)  # sun_path holds 108 bytes


def test_nobody_listening_is_reported_as_such(tmp_path: Path) -> None:
    key = instance_key(tmp_path, "nobody")
    assert forward_to_running_instance(key, ActivationRequest()) is ForwardResult.NO_INSTANCE


@pytest.mark.skipif(sys.platform == "win32", reason="named pipes leave no stale file behind")
def test_a_second_launch_raises_the_first_window_and_exits_at_once(
    hearthside_home: Path, tmp_path: Path
) -> None:
    # The first instance starts where a crashed one left its socket file: it must take over.
    stale = Path(QDir.tempPath()) / instance_key(_data_root(hearthside_home))
    _leave_stale_socket(stale)
    marker = tmp_path / "marker.txt"
    try:
        with _first_instance(hearthside_home, tmp_path, marker):
            started = time.monotonic()
            second = _launch(hearthside_home, marker, ["gui", "--no-probe"])
            elapsed = time.monotonic() - started
            assert second.returncode == 0, second.stderr
            assert NOTICE in second.stderr
            _wait_for_event(marker, "activated", timeout_s=10)
            assert _events(marker).count("shown") == 1  # the second launch opened no window
    finally:
        stale.unlink(missing_ok=True)
    # Loose bound (shared CI cores): it exits after the CLI's imports, with no window or engine.
    assert elapsed < SECOND_LAUNCH_TIMEOUT_S


# ---- helpers ----------------------------------------------------------------------------------


def _data_root(home: Path) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    return home


def _env(home: Path, marker: Path) -> dict[str, str]:
    return dict(
        os.environ,
        HEARTHSIDE_HOME=str(home),
        QT_QPA_PLATFORM="offscreen",
        HEARTHSIDE_STARTUP_MARKER=str(marker),
    )


def _launch(home: Path, marker: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", *args],
        capture_output=True,
        text=True,
        env=_env(home, marker),
        stdin=subprocess.DEVNULL,
        timeout=SECOND_LAUNCH_TIMEOUT_S * 2,
    )


@contextmanager
def _first_instance(home: Path, tmp_path: Path, marker: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`hearthside gui` with a model file that does not exist: a window, no engine load."""
    missing_model = tmp_path / "no-such-model.gguf"
    with (tmp_path / "first.log").open("wb") as log:
        child = subprocess.Popen(
            [sys.executable, "-m", "hearthside.app.cli", "gui", "--no-probe"]
            + ["--model", str(missing_model)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_env(home, marker),
        )
        try:
            _wait_for_event(marker, "shown", START_TIMEOUT_S, child)
            yield child
        finally:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _events(marker: Path) -> list[str]:
    try:
        return [line.split()[0] for line in marker.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _wait_for_event(
    marker: Path, event: str, timeout_s: float, child: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if event in _events(marker):
            return
        if child is not None and child.poll() is not None:
            pytest.fail(f"the first instance exited ({child.returncode}) before '{event}'")
        time.sleep(0.05)
    pytest.fail(f"no '{event}' within {timeout_s} s (events: {_events(marker)})")


def _leave_stale_socket(path: Path) -> None:
    """What a killed instance leaves: a socket file nobody listens on."""
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.close()  # closed without unlinking: connections are now refused
    assert path.exists()


def test_the_smoke_run_answers_one_prompt_and_quits(
    hearthside_home: Path, tmp_path: Path, default_model_file: Path
) -> None:
    """`hearthside gui --smoke`, as the bundle check runs it: window, model, one reply, exit 0."""
    marker = tmp_path / "marker.txt"
    result = _launch(
        hearthside_home,
        marker,
        ["gui", "--smoke", "--no-probe", "--ctx", "1024", "--model", str(default_model_file)],
    )
    assert result.returncode == 0, result.stderr[-2000:]
    [reply] = [line for line in result.stdout.splitlines() if line.startswith("smoke: reply: ")]
    assert reply.removeprefix("smoke: reply: ").strip()
    assert _events(marker) == ["qt-ready", "window-built", "shown", "engine-ready"]
