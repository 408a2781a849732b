"""EngineService: one worker thread, a bounded FIFO queue, a cancel event per job."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.service import EngineService, Job
from hearthside.core.errors import EngineError, JobCancelledError, QueueFullError
from tests.timing import Try, best_of


@pytest.fixture
def service() -> Iterator[EngineService]:
    running = EngineService(max_queue=2).start()
    yield running
    running.stop()


def blocking_job(release: threading.Event, started: threading.Event | None = None) -> Job[str]:
    def run(_engine: Engine | None, cancel: threading.Event) -> str:
        if started is not None:
            started.set()
        while not (release.is_set() or cancel.is_set()):
            time.sleep(0.005)
        return "cancelled" if cancel.is_set() else "released"

    return Job(run)


def test_jobs_run_in_submission_order(service: EngineService) -> None:
    order: list[int] = []
    jobs = [service.submit(Job(lambda _e, _c, i=i: order.append(i))) for i in range(2)]
    for job in jobs:
        job.result(timeout=5)
    assert order == [0, 1]


def test_full_queue_refuses_at_once(service: EngineService) -> None:
    release, started = threading.Event(), threading.Event()
    running = service.submit(blocking_job(release, started))
    started.wait(5)
    begin = time.perf_counter()
    service.submit(blocking_job(release))
    service.submit(blocking_job(release))
    accepted_s = (time.perf_counter() - begin) / 2  # the baseline: a submit that queues

    def refused() -> Try:
        begin = time.perf_counter()
        with pytest.raises(QueueFullError) as error:
            service.submit(blocking_job(release))
        assert error.value.hint
        # at once: no waiting for room (the running job never ends by itself)
        return Try(time.perf_counter() - begin, max(0.05, 10 * accepted_s))

    taken = best_of(refused)
    assert any(t.within for t in taken), taken
    release.set()
    assert running.result(timeout=5) == "released"


def test_cancelling_a_running_job_leaves_the_next_one_alone(service: EngineService) -> None:
    release, started = threading.Event(), threading.Event()
    first = service.submit(blocking_job(release, started))
    second = service.submit(blocking_job(release))
    started.wait(5)
    first.cancel()
    assert first.result(timeout=5) == "cancelled"
    release.set()
    assert second.result(timeout=5) == "released"


def test_a_queued_job_cancelled_before_it_starts_never_runs(service: EngineService) -> None:
    release, started = threading.Event(), threading.Event()
    ran: list[bool] = []
    service.submit(blocking_job(release, started))
    queued = service.submit(Job(lambda _e, _c: ran.append(True)))
    started.wait(5)
    queued.cancel()
    release.set()
    with pytest.raises(JobCancelledError):
        queued.result(timeout=5)
    assert ran == []


def test_a_failing_job_does_not_stop_the_worker(service: EngineService) -> None:
    def explode(_engine: Engine | None, _cancel: threading.Event) -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        service.submit(Job(explode)).result(timeout=5)
    assert service.submit(Job(lambda _e, _c: 42)).result(timeout=5) == 42


def test_chat_without_a_model_is_a_clear_error(service: EngineService) -> None:
    with pytest.raises(EngineError, match="No model is loaded"):
        service.chat([ChatMessage("user", "hi")], SamplingParams()).result(timeout=5)


def test_submitting_to_a_stopped_service_is_refused() -> None:
    stopped = EngineService().start()
    stopped.stop()
    with pytest.raises(EngineError):
        stopped.submit(Job(lambda _e, _c: None))


def test_chat_through_the_service_on_the_real_model(default_model_file: Path) -> None:
    pieces: list[str] = []
    threads: set[str] = set()

    def on_text(piece: str) -> None:
        pieces.append(piece)
        threads.add(threading.current_thread().name)

    with EngineService() as service:
        service.load(EngineConfig(model_path=str(default_model_file), n_ctx=1024)).result(60)
        job = service.chat(
            [ChatMessage("user", "Name a colour.")],
            SamplingParams(temperature=0, max_tokens=16),
            on_text=on_text,
        )
        result = job.result(timeout=60)
    assert result.text and "".join(pieces) == result.text
    # one thread hands the text on: the one reading the engine worker's answers
    assert len(threads) == 1 and threading.main_thread().name not in threads
