"""Real OpenAI-compatible servers in their own processes, for the remote-engine tests.

`start_llama_cpp_server` runs llama-cpp-python's own server (`python -m llama_cpp.server`) on
the default model; `start_hearthside_serve` runs `hearthside serve`. Both bind loopback on a
free port and are stopped by the fixture that started them.

The default model is a base model without a chat template. llama-cpp-python's server then falls
back to the llama-2 format, after which this model ends its reply at once (an empty answer);
the alpaca format gets real, deterministic greedy answers from it. One thread: llama.cpp's
threads spin while they wait for each other, which on a shared two-core machine made a
12-token reply take 15 s with two threads and 2 s with one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    port: int
    api_key: str | None
    log: IO[bytes]  # stderr goes to a file: a chatty server would fill a pipe and stall

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> int | None:
        """Ctrl-C, then a kill if it does not end; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        return self.process.returncode

    def stderr_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")


def wait_for_models(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {server.api_key}"} if server.api_key else {}
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"the server exited early:\n{server.stderr_text()[-2000:]}")
        try:
            if httpx.get(f"{server.base_url}/models", headers=headers, timeout=2).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise AssertionError("the server did not come up")


@contextlib.contextmanager
def llama_cpp_server(model: Path, api_key: str | None) -> Iterator[ServerProcess]:
    port = free_port()
    command = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--port", str(port),
        "--n_ctx", "1024", "--chat_format", "alpaca", "--n_threads", "1", "--n_threads_batch", "1",
    ]  # fmt: skip
    if api_key:
        command += ["--api_key", api_key]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
        server = ServerProcess(process, port, api_key, log)
        try:
            wait_for_models(server)
            yield server
        finally:
            server.stop()


@contextlib.contextmanager
def hearthside_serve(model_ref: str, home: Path) -> Iterator[ServerProcess]:
    """`hearthside serve` with its own data dir `home` (its key is `home/api_key`)."""
    port = free_port()
    command = [
        sys.executable, "-m", "hearthside.app.cli", "serve", "--model", model_ref,
        "--port", str(port), "--ctx", "1024",
    ]  # fmt: skip
    env = {**os.environ, "HEARTHSIDE_HOME": str(home)}
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log, env=env)
        server = ServerProcess(process, port, None, log)
        try:
            server.api_key = _wait_for_key(home / "api_key", process)
            wait_for_models(server)
            yield server
        finally:
            server.stop()


def _wait_for_key(key_file: Path, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not key_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError("hearthside serve wrote no key file")
        time.sleep(0.1)
    return key_file.read_text().strip()
