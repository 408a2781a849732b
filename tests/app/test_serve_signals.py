"""Ctrl-C and SIGTERM stop `hearthside serve` and its engine workers whatever a load is doing
(issue 36): `serve` runs as its own process (in a session of its own, so a Ctrl-C can reach
its whole process group, workers included, as a terminal's does); a load hangs because its
real worker is stopped with SIGSTOP (it never answers, nor notices anything), and the signal
must end `serve` and every worker within seconds."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from hearthside.core.models.store import ModelStore
from tests.app.test_serve_cli import free_port
from tests.gguf_samples import write_tiny_gguf

STOPPED_WITHIN_S = 10.0  # serve's own deadline is 5 s (STOP_GRACE_S)
WORKER_MODULE = "hearthside.core.engine.worker"


class Serve:
    def __init__(self, process: subprocess.Popen[bytes], port: int) -> None:
        self.process = process
        self.base = f"http://127.0.0.1:{port}"
        self.seen_workers: set[int] = set()

    def workers(self) -> set[int]:
        """Its engine worker children alive now (every one is remembered)."""
        found = set()
        try:
            children = psutil.Process(self.process.pid).children()
        except psutil.NoSuchProcess:
            return found
        for child in children:
            try:
                if WORKER_MODULE in " ".join(child.cmdline()):
                    found.add(child.pid)
            except psutil.Error:
                continue
        self.seen_workers |= found
        return found

    def new_worker(self, known: set[int], within_s: float = 60) -> int:
        deadline = time.monotonic() + within_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, "serve exited early"
            if fresh := self.workers() - known:
                return fresh.pop()
            time.sleep(0.005)
        raise AssertionError("no engine worker started")

    def up(self) -> bool:
        try:
            return httpx.get(f"{self.base}/health", timeout=2).is_success
        except httpx.TransportError:
            return False

    def wait_until_up(self) -> None:
        deadline = time.monotonic() + 120
        while not self.up():
            assert self.process.poll() is None, "serve exited early"
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.1)

    def other_threads(self) -> list[int]:
        """Its threads besides the main one (a job's, the service's, a worker's readers)."""
        tasks = Path(f"/proc/{self.process.pid}/task")
        return [int(task.name) for task in tasks.iterdir() if int(task.name) != self.process.pid]

    def signal_thread(self, thread: int, sig: signal.Signals) -> None:
        """`sig` to one thread of serve: where the kernel delivers a process's signal to a
        thread other than the main one (any thread not blocking it may take it)."""
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.tgkill(self.process.pid, thread, int(sig)) != 0:
            raise OSError(ctypes.get_errno(), f"tgkill {thread}")

    def signal(self, sig: signal.Signals) -> None:
        if sig == signal.SIGINT:
            os.killpg(self.process.pid, sig)  # a terminal's Ctrl-C: the whole group
        else:
            self.process.send_signal(sig)


@pytest.fixture
def serve(tmp_path: Path, hearthside_home: Path) -> Iterator[Serve]:
    served = write_tiny_gguf(tmp_path / "served.gguf", seed=0, loadable=True)
    with ModelStore(hearthside_home) as store:
        other = write_tiny_gguf(tmp_path / "other.gguf", seed=1, loadable=True)
        store.add(other, check_native=False)
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "hearthside.app.cli", "serve", "--model", str(served),
         "--port", str(port), "--ctx", "256", "--no-key"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
        start_new_session=True,
    )  # fmt: skip
    running = Serve(process, port)
    try:
        yield running
    finally:
        for pid in [process.pid, *running.seen_workers]:
            kill(pid)


def kill(pid: int) -> None:
    """Leave nothing behind, whatever the test found."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def all_gone(pids: set[int], within_s: float) -> set[int]:
    """The pids still running (not zombies) after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        left = set()
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    left.add(pid)
            except psutil.NoSuchProcess:
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_during_a_hung_load_stops_serve_and_every_worker(
    serve: Serve, sig: signal.Signals
) -> None:
    serve.wait_until_up()
    known = serve.workers()  # the served model's
    body = {"model": "other", "prompt": "hi", "max_tokens": 2}
    asking = threading.Thread(
        target=lambda: httpx.post(f"{serve.base}/v1/completions", json=body, timeout=60),
        daemon=True,
    )
    asking.start()
    loading = serve.new_worker(known)
    os.kill(loading, signal.SIGSTOP)  # the load hangs: no answer, no reaction to anything
    time.sleep(0.5)
    serve.signal(sig)
    serve.process.wait(STOPPED_WITHIN_S)
    assert all_gone(serve.seen_workers, within_s=1) == set()
    assert serve.seen_workers >= known | {loading}
    assert serve.process.stderr is not None
    assert b"Traceback" not in serve.process.stderr.read()


@pytest.mark.slow
def test_sigterm_while_the_served_model_loads_stops_serve_and_its_worker(serve: Serve) -> None:
    loading = serve.new_worker(set())
    os.kill(loading, signal.SIGSTOP)
    serve.signal(signal.SIGTERM)
    serve.process.wait(STOPPED_WITHIN_S)
    assert all_gone({loading}, within_s=1) == set()


@pytest.mark.slow
def test_sigterm_taken_by_another_thread_while_the_served_model_loads_stops_serve(
    serve: Serve,
) -> None:
    """Python runs signal handlers in the main thread only; a SIGTERM taken by the loading
    job's thread must still wake a main thread that waits for the load."""
    loading = serve.new_worker(set())
    os.kill(loading, signal.SIGSTOP)
    time.sleep(0.5)  # the main thread is asleep waiting for the load
    serve.signal_thread(serve.other_threads()[0], signal.SIGTERM)
    serve.process.wait(STOPPED_WITHIN_S)
    assert all_gone({loading}, within_s=1) == set()
