"""The engine in a worker process: real crashes (signals sent to the real worker mid-reply)
end the reply with a typed error, the service restarts the worker and serves the next one."""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from hearthside.core.engine.cancel import CancelEvent
from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, TextCallback
from hearthside.core.engine.service import EngineNotice, EngineService
from hearthside.core.engine.worker import COALESCE_S, _PendingText
from hearthside.core.engine.worker_engine import WorkerEngine, describe_exit
from hearthside.core.errors import EngineCrashedError, EngineLoadError, ModelFileError
from hearthside.core.models.spec import spec_from_gguf
from tests.timing import Try, best_of, cancel_bound_s, decode_step_s

LONG_REPLY = SamplingParams(temperature=0, max_tokens=400)
STORY = [ChatMessage("user", "Tell me a long story about a lighthouse keeper.")]


@pytest.fixture
def config(chat_model_file: Path) -> EngineConfig:
    return EngineConfig(str(chat_model_file), n_ctx=1024, flash_attn=True)


@pytest.fixture
def worker(config: EngineConfig) -> Iterator[WorkerEngine]:
    engine = WorkerEngine(config)
    yield engine
    engine.close()


def kill_after_first_text(pid: int, sig: signal.Signals) -> tuple[list[str], TextCallback]:
    """The pieces received, and an on_text that sends `sig` to the worker at the third."""
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        pieces.append(piece)
        if len(pieces) == 3:
            os.kill(pid, sig)

    return pieces, on_text


def test_the_model_lives_in_another_process(worker: WorkerEngine) -> None:
    assert worker.pid != os.getpid()
    child = psutil.Process(worker.pid)
    assert child.memory_info().rss > 50 * 2**20  # the weights are there, not here
    result = worker.chat(
        [ChatMessage("user", "Name a colour.")], SamplingParams(temperature=0, max_tokens=8)
    )
    assert result.text and result.metrics.completion_tokens > 0
    assert worker.n_ctx == 1024 and worker.n_vocab > 1000


def test_text_streams_back_as_it_is_written(worker: WorkerEngine) -> None:
    arrivals: list[float] = []
    pieces: list[str] = []

    def on_text(piece: str) -> None:
        arrivals.append(time.perf_counter())
        pieces.append(piece)

    result = worker.chat(STORY, SamplingParams(temperature=0, max_tokens=60), on_text=on_text)
    assert "".join(pieces) == result.text
    assert len(arrivals) >= 4
    assert arrivals[-1] - arrivals[0] > 0.05  # spread over the reply, not all at the end
    assert result.metrics.completion_tokens == 60
    # at most one frame per COALESCE_S while decoding, and the last: however fast this CPU is
    decode_s = result.metrics.total_s - (result.metrics.ttft_s or 0.0)
    assert len(pieces) <= decode_s / COALESCE_S + 2, (len(pieces), decode_s)


def test_pieces_closer_than_the_coalescing_interval_share_one_frame() -> None:
    """What the worker does with tokens faster than COALESCE_S, whatever this CPU's speed:
    the first goes at once, the rest wait for the next frame instead of a wake-up each."""
    sent: list[tuple[float, str]] = []
    pending = _PendingText(lambda text: sent.append((time.monotonic(), text)))
    pieces = [f"{index} " for index in range(60)]
    for piece in pieces:  # microseconds apart
        pending.add(piece)
    pending.flush()  # the reply's end sends what waits at once
    assert "".join(text for _, text in sent) == "".join(pieces)
    assert sent[0][1] == "0 "
    while_decoding = [at for at, _ in sent[:-1]]
    assert all(b - a >= COALESCE_S for a, b in itertools.pairwise(while_decoding))
    assert len(sent) < 10, sent  # (more only if this thread stalled for 20 ms, eight times)


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGKILL])
def test_a_signal_mid_reply_ends_it_with_a_typed_error(
    worker: WorkerEngine, sig: signal.Signals
) -> None:
    pieces, on_text = kill_after_first_text(worker.pid, sig)
    with pytest.raises(EngineCrashedError) as crash:
        worker.chat(STORY, LONG_REPLY, on_text=on_text)
    assert len(pieces) >= 3
    assert crash.value.cause.startswith(sig.name)
    assert sig.name in crash.value.user_text() and crash.value.hint
    assert crash.value.native_lines  # llama.cpp's log lines, kept for the crash report
    with pytest.raises(EngineCrashedError):
        worker.tokenize("hello")  # a dead worker says so at once, it does not hang


def test_a_worker_stopped_on_purpose_is_no_crash_in_the_log(
    worker: WorkerEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A tuning budget's deadline ends a candidate's worker with SIGTERM: the log says it was
    stopped, where a crash would be an error the user's log calls "died"."""
    _, on_text = kill_after_first_text(worker.pid, signal.SIGTERM)
    with caplog.at_level(logging.WARNING), pytest.raises(EngineCrashedError):
        worker.chat(STORY, LONG_REPLY, on_text=on_text)
    said = [
        (r.levelno, r.getMessage()) for r in caplog.records if "engine worker" in r.getMessage()
    ]
    assert said == [(logging.WARNING, f"engine worker {worker.pid} was stopped by SIGTERM")]


@pytest.mark.parametrize("make_event", [CancelEvent, threading.Event])
def test_cancel_stops_a_reply_within_250_ms(
    worker: WorkerEngine, make_event: Callable[[], threading.Event]
) -> None:
    def stop_mid_reply() -> Try:
        cancel = make_event()  # the service's CancelEvent, or a plain event (looked at by polling)
        cancelled_at: list[float] = []

        def press_stop() -> None:
            cancelled_at.append(time.perf_counter())
            cancel.set()

        threading.Timer(0.3, press_stop).start()
        result = worker.chat(STORY, LONG_REPLY, cancel=cancel)
        stopped_s = time.perf_counter() - cancelled_at[0]
        assert result.metrics.stop_reason == "cancelled"
        # the baseline: this reply's own decode steps before the cancel
        return Try(stopped_s, cancel_bound_s(decode_step_s(result.metrics.decode_tok_s)))

    taken = best_of(stop_mid_reply)
    assert any(t.within for t in taken), taken


def test_llama_cpp_runs_on_one_team_of_threads_whichever_request_asks(
    worker: WorkerEngine,
) -> None:
    """OpenMP gives each thread that calls llama.cpp a team of its own, and a team's threads
    spin on after their work: requests that ran on the thread that took them made decode
    4-5x slower once two teams took turns on two cores. So all of them run on one thread."""
    tokens = list(range(1, 34))
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: worker.time_decode(tokens), range(12)))
    threads = psutil.Process(worker.pid).threads()
    # the main thread only reads the pipe (and imported the modules)
    busy = [t for t in threads if t.id != worker.pid and t.user_time + t.system_time > 0.5]
    assert 1 <= len(busy) <= (os.cpu_count() or 1), busy


def test_a_waiting_call_sleeps_until_its_answer(worker: WorkerEngine) -> None:
    """With a CancelEvent the caller's thread does not poll while the worker decodes: every
    wake-up on a small CPU stalls the decode threads (3% of decode speed at 50 a second)."""
    switches: list[int] = []

    def voluntary_switches() -> int:
        thread = psutil.Process().threads()  # only to be sure psutil reads this process
        assert thread
        status = Path(f"/proc/self/task/{threading.get_native_id()}/status").read_text()
        return int(status.split("voluntary_ctxt_switches:")[1].split()[0])

    def chat() -> None:
        before = voluntary_switches()
        result = worker.chat(
            STORY, SamplingParams(temperature=0, max_tokens=120), cancel=CancelEvent()
        )
        switches.append(voluntary_switches() - before)
        switches.append(result.metrics.completion_tokens)
        switches.append(int(result.metrics.total_s * 1000))

    thread = threading.Thread(target=chat)
    thread.start()
    thread.join()
    woke, tokens, took_ms = switches
    assert tokens > 20 and took_ms > 200
    # The text arrives on the reader thread; this one wakes for the result (and a few GIL
    # hand-offs), not 50 times a second.
    assert woke < max(8, took_ms / 1000 * 10), (woke, took_ms)


def test_closing_ends_the_process_and_frees_its_memory(config: EngineConfig) -> None:
    engine = WorkerEngine(config)
    child = psutil.Process(engine.pid)
    engine.close()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE


def test_a_bad_file_fails_before_any_process_starts(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelFileError):
        WorkerEngine(EngineConfig(str(broken)))


def context_beyond_memory(model_path: str) -> int:
    """A context whose KV cache needs 4x this machine's memory and swap: one allocation the
    kernel refuses at once. (Far larger ones spend seconds to minutes building llama.cpp's
    per-cell bookkeeping first: 2**26 took 8-34 s here, 2**30 84 s and 21 GB.)"""
    memory = psutil.virtual_memory().total + psutil.swap_memory().total
    per_token = spec_from_gguf(model_path).kv_bytes_per_token()
    return 1 << math.ceil(math.log2(4 * memory / per_token))


def test_a_crash_while_loading_is_a_load_error(config: EngineConfig) -> None:
    # llama.cpp refuses (or the kernel kills it); either way the caller gets a load error,
    # never a hang or a dead app.
    with pytest.raises(EngineLoadError):
        WorkerEngine(config.with_changes(n_ctx=context_beyond_memory(config.model_path)))


def test_exit_descriptions_name_the_signal() -> None:
    assert describe_exit(-signal.SIGSEGV) == "SIGSEGV, a segmentation fault"
    assert describe_exit(-signal.SIGKILL).startswith("SIGKILL, killed")
    assert describe_exit(3) == "exit status 3"


# ---- the service restarts the worker --------------------------------------------------------


@pytest.fixture
def service() -> Iterator[tuple[EngineService, list[EngineNotice]]]:
    notices: list[EngineNotice] = []
    running = EngineService().start()
    running.add_listener(notices.append)
    yield running, notices
    running.stop()


def crash_a_reply(service: EngineService, sig: signal.Signals) -> EngineCrashedError:
    pid = service.worker_pid
    assert pid is not None
    pieces, on_text = kill_after_first_text(pid, sig)
    job = service.chat(STORY, LONG_REPLY, on_text=on_text)
    with pytest.raises(EngineCrashedError) as crash:
        job.result(60)
    assert len(pieces) >= 3  # the part written before the crash reached the caller
    return crash.value


def wait_for(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_after_a_crash_the_service_restarts_the_worker_and_serves_the_next_chat(
    service: tuple[EngineService, list[EngineNotice]], config: EngineConfig
) -> None:
    engine, notices = service
    engine.load(config).result(60)
    first_pid = engine.worker_pid
    crash_a_reply(engine, signal.SIGSEGV)
    reply = engine.chat(STORY, SamplingParams(temperature=0, max_tokens=8)).result(60)
    assert reply.text
    assert engine.worker_pid not in (None, first_pid)
    assert [notice.kind for notice in notices] == ["crashed", "restarted"]
    assert "SIGSEGV" in notices[0].message and "same settings" in notices[0].message
    assert engine.loaded_config == config


def test_a_second_crash_in_a_row_falls_back_to_the_safest_settings(
    service: tuple[EngineService, list[EngineNotice]], config: EngineConfig
) -> None:
    engine, notices = service
    engine.load(config.with_changes(type_k="q8_0", type_v="q8_0")).result(60)
    crash_a_reply(engine, signal.SIGKILL)
    wait_for(lambda: len(notices) == 2)
    crash_a_reply(engine, signal.SIGSEGV)
    wait_for(lambda: len(notices) == 4)
    assert "safest settings" in notices[2].message
    loaded = engine.loaded_config
    assert isinstance(loaded, EngineConfig)
    assert (loaded.flash_attn, loaded.type_k, loaded.type_v) == (False, "f16", "f16")
    assert engine.chat(STORY, SamplingParams(temperature=0, max_tokens=4)).result(60).text


def test_unloading_ends_the_worker(
    service: tuple[EngineService, list[EngineNotice]], config: EngineConfig
) -> None:
    engine, _notices = service
    engine.load(config).result(60)
    pid = engine.worker_pid
    assert pid is not None
    child = psutil.Process(pid)
    engine.stop()
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
