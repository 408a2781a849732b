"""Idle unload (issue 34): a model no request has used for the idle time is unloaded, its
engine worker ends and its memory returns; the next request waits while it loads again and
its answer says so. Real `hearthside serve` processes and a real in-process server on
loopback, the real default chat model (SmolLM2 135M) and tiny real GGUFs, the real `openai`
client and httpx."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import uvicorn

from hearthside.app.api_models import LoadKnobs, on_demand_models
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.models.store import ModelStore
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import uvicorn_config
from hearthside.core.server.model_load import LOAD_WAIT_HEADER, LOADED_MODEL_HEADER
from hearthside.core.server.model_pool import ModelPool
from hearthside.core.server.request_log import FinishedRequest, RequestLog
from tests.app.test_serve_cli import free_port
from tests.gguf_samples import write_tiny_gguf

IDLE_S = 1
CLIENT_TIMEOUT_S = 30.0
UNLOADED_WITHIN_S = 15.0  # the idle time, the watcher's tick and a worker's exit, on a busy box
WORKER_MODULE = "hearthside.core.engine.worker"
MIB = 1 << 20
# What serve itself may keep after answering a few requests (httpx, pydantic and SSE buffers,
# allocator arenas): far below the ~100 MiB its model's worker holds.
KEPT_BY_SERVE_BYTES = 24 * MIB
SAY_ONE_WORD = [{"role": "user", "content": "Say one word."}]


def live_workers(parent: int) -> set[int]:
    """`parent`'s engine worker children that are running (not zombies)."""
    found = set()
    try:
        children = psutil.Process(parent).children()
    except psutil.NoSuchProcess:
        return found
    for child in children:
        try:
            if child.status() != psutil.STATUS_ZOMBIE and WORKER_MODULE in " ".join(
                child.cmdline()
            ):
                found.add(child.pid)
        except psutil.Error:
            continue
    return found


def tree_rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and its engine workers (not a short-lived hardware probe
    it may run meanwhile)."""
    total = psutil.Process(pid).memory_info().rss
    for worker in live_workers(pid):
        try:
            total += psutil.Process(worker).memory_info().rss
        except psutil.Error:  # a worker that ended meanwhile
            continue
    return total


def wait_until(condition: Callable[[], bool], within_s: float, what: str) -> float:
    """Seconds until `condition` held; fails after `within_s`."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < within_s, f"{what} within {within_s} s"
        time.sleep(0.05)
    return time.monotonic() - started


# ---- `hearthside serve`: its own model --------------------------------------------------------


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    port: int

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.root}/v1", api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )

    def workers(self) -> set[int]:
        return live_workers(self.process.pid)

    def loaded(self) -> bool:
        models = httpx.get(f"{self.root}/v1/models", timeout=CLIENT_TIMEOUT_S).json()["data"]
        return bool(models[0]["loaded"])


def start_serve(model: Path, idle_s: int) -> Serve:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(model),
         "--port", str(port), "--ctx", "512", "--parallel", "1", "--no-key",
         "--idle-unload-s", str(idle_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
    )  # fmt: skip
    serve = Serve(process, port)

    def up() -> bool:
        assert process.poll() is None, process.communicate()[1].decode()[-2000:]
        try:
            return httpx.get(f"{serve.root}/health", timeout=2).is_success
        except httpx.TransportError:
            return False

    wait_until(up, 120, "serve came up")
    return serve


@pytest.fixture
def serve(chat_model_file: Path) -> Iterator[Serve]:
    running = start_serve(chat_model_file, IDLE_S)
    try:
        yield running
    finally:
        for pid in [*running.workers(), running.process.pid]:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        running.process.wait(10)


def stream_one_word(serve: Serve) -> tuple[httpx.Headers, str, str | None]:
    """A streamed chat through the real openai client: its headers, text and finish reason."""
    with serve.client().chat.completions.with_streaming_response.create(
        model="default", messages=SAY_ONE_WORD, max_tokens=8, temperature=0, stream=True
    ) as response:
        text, finish = "", None
        for chunk in response.parse():
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
        return response.headers, text, finish


@pytest.mark.slow
def test_serve_unloads_its_idle_model_gives_its_memory_back_and_loads_it_for_the_next_request(
    serve: Serve,
) -> None:
    wait_until(lambda: not serve.workers(), UNLOADED_WITHIN_S, "the idle model was unloaded")
    assert not serve.loaded()
    before_load = tree_rss_bytes(serve.process.pid)

    headers, text, finish = stream_one_word(serve)  # waits for the load, does not fail
    assert text and finish in ("stop", "length")
    assert headers[LOADED_MODEL_HEADER] == serve.client().models.list().data[0].id
    assert float(headers[LOAD_WAIT_HEADER]) > 0
    (worker,) = serve.workers()
    loaded = tree_rss_bytes(serve.process.pid)
    again, _text, _finish = stream_one_word(serve)  # loaded now: no load, no header
    assert LOADED_MODEL_HEADER not in again

    wait_until(lambda: not psutil.pid_exists(worker), UNLOADED_WITHIN_S, "the worker ended")
    after_unload = tree_rss_bytes(serve.process.pid)
    model_bytes = os.path.getsize(serve_model_path(serve))
    print(
        f"serve tree RSS: before load {before_load / MIB:.1f} MiB, loaded {loaded / MIB:.1f} "
        f"MiB, after idle unload {after_unload / MIB:.1f} MiB"
    )
    assert loaded - before_load > model_bytes / 2  # the model's weights were resident
    assert after_unload <= before_load + KEPT_BY_SERVE_BYTES


def serve_model_path(serve: Serve) -> str:
    args = psutil.Process(serve.process.pid).cmdline()
    return args[args.index("--model") + 1]


def test_a_model_in_use_for_longer_than_the_idle_time_stays_loaded(tmp_path: Path) -> None:
    """The watcher counts a running job as use: the engine busy for five idle periods keeps
    its model, which is unloaded once it has been idle for one."""
    idle_s = 0.3
    model = write_tiny_gguf(tmp_path / "busy.gguf", seed=3, loadable=True)
    with EngineService() as service:
        service.load(EngineConfig(model_path=str(model), n_ctx=256)).result()
        pool = ModelPool(service, "busy", idle_unload_s=idle_s, unload_served_when_idle=True)
        try:
            worker = service.worker_pid
            busy = service.call(lambda _engine: time.sleep(5 * idle_s), "busy")
            busy.result()
            assert service.worker_pid == worker and worker is not None and _running(worker)
            waited = wait_until(
                lambda: service.loaded_config is None and not _running(worker),
                UNLOADED_WITHIN_S,
                "unloaded",
            )
            print(f"unloaded {waited:.2f} s after the job ended (idle time {idle_s} s)")
        finally:
            pool.stop()


# ---- the window's API: models loaded on request, the window's own model stays ---------------


@dataclass
class Window:
    base: str
    service: EngineService
    pool: ModelPool
    log: RequestLog


@contextmanager
def window_api(home: Path, files: Path) -> Iterator[Window]:
    with ModelStore(home) as store:
        store.add(write_tiny_gguf(files / "asked.gguf", seed=1, loadable=True), check_native=False)
    served = write_tiny_gguf(files / "chat.gguf", seed=0, loadable=True)
    service = EngineService().start()
    service.load(EngineConfig(model_path=str(served), n_ctx=256)).result()
    settings = ServerSettings(port=free_port(), model_id="chat", idle_unload_s=IDLE_S)
    pool = ModelPool(
        service,
        "chat",
        on_demand_models(home, LoadKnobs(n_ctx=256, n_parallel=1)),
        idle_unload_s=settings.idle_unload_s,
        unload_served_when_idle=settings.unload_served_when_idle,  # False: the window's
    )
    log = RequestLog()
    server = uvicorn.Server(uvicorn_config(settings, service, pool=pool, request_log=log))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 30, "the API started")
    try:
        yield Window(f"http://127.0.0.1:{settings.port}/v1", service, pool, log)
    finally:
        server.should_exit = True
        thread.join(10)
        pool.stop()
        service.stop()


def test_the_window_keeps_its_model_while_one_loaded_on_request_is_unloaded(
    tmp_path: Path, hearthside_home: Path
) -> None:
    with window_api(hearthside_home, tmp_path / "files") as window:
        client = openai.OpenAI(
            base_url=window.base, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT_S
        )
        chat_worker = window.service.worker_pid
        assert chat_worker is not None
        first = client.completions.with_raw_response.create(
            model="asked", prompt="hi", max_tokens=2
        )
        assert first.headers[LOADED_MODEL_HEADER] == "asked"
        asked_worker = window.pool.loaded_worker_pids()["asked"]
        assert asked_worker is not None and psutil.pid_exists(asked_worker)

        wait_until(
            lambda: "asked" not in window.pool.loaded_worker_pids(),
            UNLOADED_WITHIN_S,
            "the model loaded on request was unloaded",
        )
        wait_until(lambda: not _running(asked_worker), UNLOADED_WITHIN_S, "its worker ended")
        time.sleep(2 * IDLE_S)
        assert window.service.worker_pid == chat_worker and _running(chat_worker)
        assert client.completions.create(model="chat", prompt="hi", max_tokens=2).choices

        again = client.completions.with_raw_response.create(
            model="asked", prompt="hi", max_tokens=2
        )
        assert again.headers[LOADED_MODEL_HEADER] == "asked"
    loads = [entry for entry in window.log.entries() if entry.loaded_model is not None]
    assert [_load_of(entry) for entry in loads] == [("asked", 200)] * 2
    assert all(entry.load_wait_s and entry.load_wait_s > 0 for entry in loads)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _load_of(entry: FinishedRequest) -> tuple[str | None, int | None]:
    return entry.loaded_model, entry.status
