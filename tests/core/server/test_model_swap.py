"""Requests that race model swaps (issue 36): a real server on loopback, real httpx clients, a
real store of three tiny llama GGUFs loaded on demand in real engine workers, at most one at
a time. Before the pool held models for their requests, a load evicted the model it had just
loaded for the requests waiting on it (their handoff grace had run out while they waited), and
they met a stopped engine: 500 "The engine is not running."."""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import uvicorn

from hearthside.app.api_models import LoadKnobs, on_demand_models
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.models.store import ModelStore
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import uvicorn_config
from hearthside.core.server.model_pool import ModelPool
from tests.core.server.test_api import free_port
from tests.gguf_samples import write_tiny_gguf

MODELS = ("swap-a", "swap-b", "swap-c")
MAX_LOADED = 1
WAIT_S = 8.0  # how long a request waits for its model here (30 s in `serve`)
HUNG_WAIT_S = 3.0  # the same, where the load never ends: the wait is all the test does
WORKER_MODULE = "hearthside.core.engine.worker"


@dataclass
class Pooled:
    base: str
    pool: ModelPool
    service: EngineService


@contextmanager
def serving_on_demand(home: Path, files: Path, wait_s: float = WAIT_S) -> Iterator[Pooled]:
    with ModelStore(home) as store:
        for seed, name in enumerate(MODELS, start=1):
            tiny = write_tiny_gguf(files / f"{name}.gguf", seed=seed, loadable=True)
            store.add(tiny, check_native=False)
    served = write_tiny_gguf(files / "served.gguf", seed=0, loadable=True)
    service = EngineService().start()
    service.load(EngineConfig(model_path=str(served), n_ctx=256)).result()
    settings = ServerSettings(port=free_port(), model_id="served")
    knobs = LoadKnobs(n_ctx=256, n_parallel=1)
    pool = ModelPool(
        service, "served", on_demand_models(home, knobs), max_loaded=MAX_LOADED, wait_s=wait_s
    )
    server = uvicorn.Server(uvicorn_config(settings, service, pool=pool))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.02)
    try:
        yield Pooled(f"http://127.0.0.1:{settings.port}/v1", pool, service)
    finally:
        server.should_exit = True
        thread.join(10)
        pool.stop()
        service.stop()


@pytest.fixture
def pooled(tmp_path: Path, hearthside_home: Path) -> Iterator[Pooled]:
    with serving_on_demand(hearthside_home, tmp_path / "files") as running:
        yield running


@pytest.fixture
def pooled_briefly(tmp_path: Path, hearthside_home: Path) -> Iterator[Pooled]:
    with serving_on_demand(hearthside_home, tmp_path / "files", HUNG_WAIT_S) as running:
        yield running


def live_workers(exclude: set[int]) -> set[int]:
    """This process's engine worker children that are running (not zombies)."""
    found = set()
    for child in psutil.Process().children():
        try:
            if child.pid in exclude or child.status() == psutil.STATUS_ZOMBIE:
                continue
            if WORKER_MODULE in " ".join(child.cmdline()):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


class WorkerCount:
    """The most engine workers alive at once, sampled every 20 ms on a thread."""

    def __init__(self) -> None:
        self._before = live_workers(set())  # other tests' workers, left out
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, len(live_workers(self._before)))
            time.sleep(0.02)

    def __enter__(self) -> WorkerCount:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()


def complete(base: str, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "hi", "max_tokens": 2, "temperature": 0}
    return httpx.post(f"{base}/completions", json=body, timeout=60)


@pytest.mark.slow
def test_requests_racing_model_swaps_get_their_model_or_a_503_never_a_500(
    pooled: Pooled,
) -> None:
    statuses: collections.Counter[int] = collections.Counter()
    answered: collections.Counter[str] = collections.Counter()
    refusals: list[httpx.Response] = []
    with WorkerCount() as workers, ThreadPoolExecutor(18) as clients:
        for _round in range(2):
            asked = [MODELS[i % len(MODELS)] for i in range(18)]
            replies = clients.map(lambda model: complete(pooled.base, model), asked)
            for model, reply in zip(asked, replies, strict=True):
                statuses[reply.status_code] += 1
                if reply.status_code == 200:
                    assert reply.json()["model"] == model
                    answered[model] += 1
                else:
                    refusals.append(reply)
    assert set(statuses) <= {200, 503}, statuses
    for refusal in refusals:
        assert refusal.headers["Retry-After"].isdigit()
        assert refusal.json()["error"]["code"] == "queue_full"
    assert answered  # (which models got their turn within WAIT_S depends on the machine's speed)
    assert workers.peak <= MAX_LOADED + 1  # the served model's worker, and one on demand


@pytest.mark.slow
def test_a_hung_load_makes_other_models_wait_a_bounded_time_then_503(
    pooled_briefly: Pooled,
) -> None:
    before = live_workers(set())
    with ThreadPoolExecutor(2) as clients:
        first = clients.submit(complete, pooled_briefly.base, "swap-a")
        hung = wait_for_new_worker(before)
        os.kill(hung, signal.SIGSTOP)  # its load hangs: it never answers
        try:
            started = time.monotonic()
            other = complete(pooled_briefly.base, "swap-b")
            waited_s = time.monotonic() - started
            assert other.status_code == 503 and other.headers["Retry-After"].isdigit()
            assert "could not be loaded within" in other.json()["error"]["message"]
            assert waited_s < HUNG_WAIT_S + 3
            assert first.result().status_code == 503
        finally:
            os.kill(hung, signal.SIGCONT)


def wait_for_new_worker(before: set[int]) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if new := live_workers(before):
            return new.pop()
        time.sleep(0.005)
    raise AssertionError("no engine worker started for the load")
