"""A reply's decode threads make way for a core another program takes, and come back when it
is free again (`core/engine/thread_governor.py`): the rule on recorded CPU times, then the
real engine beside real busy processes started by the test."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.thread_governor import (
    FIRST_LOOK_S,
    CpuTimes,
    ThreadGovernor,
    others_busy_cores,
    threads_left,
    usable_cores,
)
from hearthside.core.probe.cpu_use import busy_seconds

BUSY_LOOP = "while True: pass"


def test_a_core_kept_busy_is_taken_and_a_little_use_is_not() -> None:
    assert threads_left(2, 0.0, 2) == 2
    assert threads_left(2, 0.3, 2) == 2  # a browser tab: not a core
    assert threads_left(2, 0.6, 2) == 1  # a busy program beside our spinning threads
    assert threads_left(2, 1.0, 2) == 1
    assert threads_left(2, 2.0, 2) == 1  # never below one
    assert threads_left(8, 2.7, 16) == 8  # room left on a big machine: nothing changes
    assert threads_left(8, 2.7, 8) == 5


def test_other_programs_cpu_is_all_the_cpu_less_this_process() -> None:
    before = CpuTimes(10.0, 100.0, 40.0)
    after = CpuTimes(12.0, 104.0, 42.0)  # 4 s of CPU in 2 s, 2 of them ours
    assert others_busy_cores(before, after) == pytest.approx(1.0)
    assert others_busy_cores(before, before) is None


def test_programs_at_a_lower_priority_take_no_core_unless_we_are_lowered_too() -> None:
    """A niced compile beside the chat (the kernel's "nice" time) makes way for our threads at
    once; when Hearthside itself runs niced, everyone else's time counts."""
    counters = {"user": 50.0, "nice": 30.0, "system": 10.0, "idle": 100.0, "iowait": 5.0}
    assert busy_seconds(counters, niceness=0) == 60.0
    assert busy_seconds(counters, niceness=10) == 90.0
    assert busy_seconds({**counters, "guest": 20.0}, niceness=0) == 60.0  # counted in user


def test_the_threads_follow_the_machine_and_come_back() -> None:
    times = iter(
        [
            CpuTimes(0.0, 0.0, 0.0),
            CpuTimes(1.0, 2.0, 1.2),  # others 0.8 core
            CpuTimes(2.0, 4.0, 2.2),  # 1.0
            CpuTimes(3.0, 6.0, 4.1),  # 0.1: they stopped
        ]
    )
    applied: list[tuple[int, int]] = []
    governor = ThreadGovernor(
        2, 2, lambda d, b: applied.append((d, b)), cores=2, clock=lambda: next(times)
    )
    assert governor.look() == (1, 1)
    assert governor.look() == (1, 1)
    assert governor.look() == (2, 2)
    assert applied == [(1, 1), (2, 2)]  # set only when it changes


def test_a_slow_half_second_of_a_busy_program_does_not_give_its_core_back() -> None:
    times = iter(
        [
            CpuTimes(0.0, 0.0, 0.0),
            CpuTimes(1.0, 2.0, 1.2),  # others 0.8 core: taken
            CpuTimes(2.0, 3.4, 2.2),  # 0.4: a lull, still busy
            CpuTimes(3.0, 5.3, 3.1),  # 1.0
            CpuTimes(4.0, 7.3, 5.1),  # 0.0: they stopped
        ]
    )
    applied: list[tuple[int, int]] = []
    governor = ThreadGovernor(
        2, 2, lambda d, b: applied.append((d, b)), cores=2, clock=lambda: next(times)
    )
    assert [governor.look() for _ in range(4)] == [(1, 1), (1, 1), (1, 1), (2, 2)]
    assert applied == [(1, 1), (2, 2)]


def test_what_others_did_between_two_replies_does_not_count() -> None:
    times = iter(
        [
            CpuTimes(0.0, 0.0, 0.0),  # loaded
            CpuTimes(10.0, 10.0, 0.0),  # the reply starts after others kept a core busy 10 s
            CpuTimes(10.2, 10.45, 0.4),  # during it: its own 2 cores, others 0.25 core
        ]
        + [CpuTimes(10.2 + n, 10.45 + 2 * n, 0.4 + 2 * n) for n in range(1, 5)]
    )
    governor = ThreadGovernor(2, 2, lambda d, b: None, cores=2, clock=lambda: next(times))

    def tokens() -> Iterator[int]:
        for token in range(3):
            time.sleep(FIRST_LOOK_S)
            yield token

    assert list(governor.governed(tokens())) == [0, 1, 2]
    assert governor.current == (2, 2)


@pytest.fixture(scope="module")
def engine(chat_model_file: Path) -> Iterator[Engine]:
    cores = usable_cores()
    loaded = Engine(
        EngineConfig(str(chat_model_file), n_ctx=1024, n_threads=cores, n_threads_batch=cores)
    )
    yield loaded
    loaded.close()


def reply(engine: Engine) -> None:
    question = [ChatMessage("user", "Count from one to forty in words.")]
    engine.chat(question, SamplingParams(temperature=0.0, max_tokens=96))


@pytest.mark.skipif(usable_cores() < 2, reason="one core: nothing to make way with")
def test_a_reply_beside_busy_programs_decodes_with_the_cores_they_leave(engine: Engine) -> None:
    cores = usable_cores()
    reply(engine)
    assert engine.threads.current == (cores, cores)  # a quiet machine: all of them
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(cores - 1)]
    try:
        time.sleep(0.3)  # looping before the reply's first look (it failed once without)
        reply(engine)
        assert engine.threads.current == (1, 1)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    reply(engine)
    assert engine.threads.current == (cores, cores)  # given back once they stopped


@pytest.mark.skipif(usable_cores() < 2, reason="one core: nothing to make way with")
def test_a_niced_program_beside_a_reply_leaves_it_every_thread(engine: Engine) -> None:
    cores = usable_cores()
    lowered = [
        subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", BUSY_LOOP])
        for _ in range(cores)
    ]
    try:
        reply(engine)
        assert engine.threads.current == (cores, cores)
    finally:
        for process in lowered:
            process.kill()
            process.wait()
