"""A frozen engine worker has a deadline (issue 36): the real worker process, stopped with
SIGSTOP, is killed once it has been silent for `silence_s`; the call gets a plain
EngineUnresponsiveError, the service starts a new worker, and a load that overruns its own
deadline fails the same way. Through the real server, the request gets a 503 with
Retry-After saying the engine is being restarted."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import psutil
import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import (
    EngineUnresponsiveError,
    WorkerDeadlines,
    WorkerEngine,
)
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from tests.core.server.test_api import free_port
from tests.gguf_samples import write_tiny_gguf

SILENCE_S = 2.0
GREEDY = SamplingParams(temperature=0.0, max_tokens=4)
HI = [ChatMessage("user", "hi")]
WORKER_MODULE = "hearthside.core.engine.worker"


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "tiny.gguf", loadable=True)


def config_of(model: Path) -> EngineConfig:
    return EngineConfig(model_path=str(model), n_ctx=256)


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_worker_is_killed_after_its_silence_and_the_call_says_so(
    tiny_model: Path,
) -> None:
    engine = WorkerEngine(config_of(tiny_model), deadlines=WorkerDeadlines(silence_s=SILENCE_S))
    try:
        os.kill(engine.pid, signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(EngineUnresponsiveError) as error:
            engine.chat(HI, GREEDY)
        waited_s = time.monotonic() - started
        assert SILENCE_S - 1.0 < waited_s < SILENCE_S + 5  # (the last beat came up to 1 s ago)
        assert "stopped responding" in error.value.message
        assert "Send the request again" in error.value.message
        assert gone_within(engine.pid, 5)
        assert not engine.alive
    finally:
        engine.close()


def stop_the_next_worker(before: set[int]) -> threading.Thread:
    """SIGSTOP the first engine worker this process starts that is not in `before`."""

    def watch() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for child in psutil.Process().children():
                with contextlib.suppress(psutil.Error):
                    if child.pid not in before and WORKER_MODULE in " ".join(child.cmdline()):
                        os.kill(child.pid, signal.SIGSTOP)
                        return
            time.sleep(0.001)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    return watcher


def test_a_load_past_its_deadline_is_stopped(tiny_model: Path) -> None:
    # the worker is frozen from its start: its load cannot finish, whatever the machine
    stop_the_next_worker({child.pid for child in psutil.Process().children()})
    started = time.monotonic()
    with pytest.raises(EngineUnresponsiveError) as error:
        WorkerEngine(config_of(tiny_model), deadlines=WorkerDeadlines(load_s=1.0))
    assert "loading tiny.gguf, nothing for 1 s" in error.value.message
    assert time.monotonic() - started < 10
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # gone or a zombie: stopped either way
            assert WORKER_MODULE not in " ".join(child.cmdline()), child


def busy_for(_engine: object, seconds: float) -> float:
    """Runs in the worker: a long computation that releases the GIL, as llama.cpp's does."""
    time.sleep(seconds)
    return seconds


def test_a_worker_busy_longer_than_the_silence_deadline_is_not_killed(tiny_model: Path) -> None:
    """Its heartbeats count: one call busy for longer than `silence_s` is answered."""
    engine = WorkerEngine(config_of(tiny_model), deadlines=WorkerDeadlines(silence_s=SILENCE_S))
    try:
        assert engine.run(busy_for, SILENCE_S + 2) == SILENCE_S + 2
        assert engine.alive
    finally:
        engine.close()


@pytest.fixture
def api(tiny_model: Path) -> Iterator[tuple[ServerController, EngineService]]:
    deadlines = WorkerDeadlines(silence_s=SILENCE_S)
    service = EngineService(engine_factory=partial(WorkerEngine, deadlines=deadlines)).start()
    service.load(config_of(tiny_model)).result()
    controller = ServerController(ServerSettings(port=free_port(), model_id="tiny"), service)
    controller.start()
    yield controller, service
    controller.stop()
    service.stop()


def test_a_request_to_a_frozen_engine_gets_a_503_and_the_engine_comes_back(
    api: tuple[ServerController, EngineService],
) -> None:
    controller, service = api
    frozen = service.worker_pid
    assert frozen is not None
    os.kill(frozen, signal.SIGSTOP)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    reply = httpx.post(f"{controller.url}/chat/completions", json=body, timeout=30)
    assert reply.status_code == 503
    assert reply.headers["Retry-After"].isdigit()
    error = reply.json()["error"]
    assert error["code"] == "engine_unavailable"
    assert "stopped responding" in error["message"] and "starting it again" in error["message"]
    assert gone_within(frozen, 5)
    again = httpx.post(f"{controller.url}/chat/completions", json=body, timeout=30)
    assert again.status_code == 200
    assert service.worker_pid not in (None, frozen)
