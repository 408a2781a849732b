"""Issue 36 item 5: a crash quotes only the log lines of the work in flight, and the worker,
not the app, is what the OOM killer picks.

The worker's log lines used to pile up across requests, so a crash message could quote lines
an earlier request left (another client's prompt, in principle) as the crash's "last words".
The real worker process with the real default chat model; the functions below run inside it
(`WorkerEngine.run` sends them by name) and write to its real stderr, as llama.cpp does.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.worker_engine import WorkerEngine
from hearthside.core.errors import EngineCrashedError

EARLIER = "llama_decode: failed for the earlier request: SECRET PROMPT OF ANOTHER CLIENT"
OWN = "ggml_backend: failed in this request's own work"
LOG_READ_S = 0.3  # the parent's log reader takes the earlier lines off the pipe meanwhile


def log_line(_engine: Any, line: str) -> None:
    os.write(2, line.encode() + b"\n")


def log_line_and_die(_engine: Any, line: str | None) -> None:
    if line is not None:
        os.write(2, line.encode() + b"\n")
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.fixture
def worker(chat_model_file: Path) -> Iterator[WorkerEngine]:
    engine = WorkerEngine(EngineConfig(str(chat_model_file), n_ctx=512))
    yield engine
    engine.close()


def crash_after_an_earlier_request(worker: WorkerEngine, own_line: str | None) -> Any:
    worker.run(log_line, EARLIER)
    time.sleep(LOG_READ_S)
    with pytest.raises(EngineCrashedError) as crash:
        worker.run(log_line_and_die, own_line)
    return crash.value


def test_a_crash_does_not_quote_what_an_earlier_request_logged(worker: WorkerEngine) -> None:
    crash = crash_after_an_earlier_request(worker, None)
    assert "SECRET" not in crash.message
    assert not any("SECRET" in line for line in crash.native_lines)
    assert crash.message == "The engine crashed (SIGKILL, killed, most often by the system " + (
        "for want of memory)."
    )


def test_a_crash_quotes_its_own_request_s_last_words(worker: WorkerEngine) -> None:
    crash = crash_after_an_earlier_request(worker, OWN)
    assert crash.message.endswith(f"; llama.cpp's last words: {OWN}")
    assert OWN in crash.native_lines
    assert not any("SECRET" in line for line in crash.native_lines)


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux's OOM killer")
def test_the_oom_killer_picks_the_worker_before_the_app(worker: WorkerEngine) -> None:
    # Under a memory limit the kernel kills the largest process; while the worker starts that
    # was the app, which died without a word (the real cgroup run is in tests/app).
    assert Path(f"/proc/{worker.pid}/oom_score_adj").read_text().strip() == "1000"
    assert int(Path("/proc/self/oom_score_adj").read_text()) < 1000
