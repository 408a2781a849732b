"""`run_in_background`: the work runs off the UI thread, its outcome arrives on it."""

from __future__ import annotations

import threading

import pytest
from pytestqt.qtbot import QtBot

from hearthside.app.gui.workers import MainThreadRelay, run_in_background

pytestmark = [pytest.mark.gui, pytest.mark.beside]


def test_work_runs_on_a_worker_and_the_result_comes_back_on_the_ui_thread(qtbot: QtBot) -> None:
    ui_thread = threading.get_ident()
    seen: dict[str, object] = {}

    def work() -> int:
        seen["worker"] = threading.get_ident()
        return 42

    def done(result: int) -> None:
        seen["result"], seen["callback"] = result, threading.get_ident()

    task = run_in_background(work, done)
    with qtbot.wait_signal(task.finished, timeout=5000):
        pass
    assert seen == {"worker": seen["worker"], "result": 42, "callback": ui_thread}
    assert seen["worker"] != ui_thread and task.done() and task.result == 42


def test_an_exception_goes_to_on_error_not_to_on_done(qtbot: QtBot) -> None:
    failures: list[BaseException] = []
    task = run_in_background(
        lambda: 1 / 0, lambda _result: pytest.fail("on_done called"), failures.append
    )
    with qtbot.wait_signal(task.failed, timeout=5000) as failed:
        pass
    assert isinstance(failures[0], ZeroDivisionError) and failed.args == [failures[0]]


def test_the_ui_thread_keeps_running_while_the_work_blocks(qtbot: QtBot) -> None:
    release = threading.Event()
    task = run_in_background(lambda: release.wait(10))
    ticks: list[int] = []
    relay = MainThreadRelay(ticks.append)
    for tick in range(3):
        relay.post(tick)
    qtbot.waitUntil(lambda: ticks == [0, 1, 2], timeout=2000)  # delivered while work blocks
    assert not task.done()
    release.set()
    assert task.wait(5) and task.result is True
