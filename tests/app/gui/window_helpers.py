"""Shared pieces for the window tests: a loaded window per module, waiting, a lag meter."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from PySide6.QtCore import QEventLoop, QTimer

from hearthside.app.gui.chat_settings_dialog import ChatSettings
from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.model_loader import LoadOptions
from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.service import EngineService

TEST_CONTEXT_TOKENS = 2048
LOAD_TIMEOUT_S = 120.0
POLL_MS = 20


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Run the event loop until `condition()` holds (for fixtures, where qtbot is absent)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        run_event_loop(POLL_MS)


def run_event_loop(ms: int) -> None:
    """Run Qt's event loop for `ms`. Not `QTest.qWait`: PySide6 holds the GIL through it, so
    the app's own Python threads (installing the default model, preparing a load) starved
    beside it (a sha256 of 300 MB on a thread took 6.1 s instead of 0.18 s)."""
    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


@contextmanager
def open_window(
    home: Path,
    model: str,
    *,
    probe: bool = False,
    n_ctx: int = TEST_CONTEXT_TOKENS,
    threads: int | None = None,
    parallel: int | None = None,
    before_start: Callable[[MainWindow], None] | None = None,
) -> Iterator[MainWindow]:
    """A shown, started MainWindow on its own EngineService, with `model` loaded (on `threads`
    threads: one keeps a test steady on cores other processes are busy on)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEARTHSIDE_HOME", str(home))
        service = EngineService().start()
        options = LoadOptions(
            n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_parallel=parallel
        )
        window = MainWindow(service, load_options=options)
        try:
            window.show()
            if before_start is not None:
                before_start(window)
            window.start(model, probe=probe)
            wait_until(lambda: window.bridge.loaded_model is not None, LOAD_TIMEOUT_S, "the model")
            yield window
        finally:
            window.close()
            service.stop()


def use_settings(window: MainWindow, **sampling: object) -> None:
    """Greedy, short replies unless a test asks otherwise."""
    values: dict[str, object] = {"temperature": 0.0, "max_tokens": 32, "seed": 1}
    values.update(sampling)
    system_prompt = str(values.pop("system_prompt", ""))
    window.session.apply_settings(ChatSettings(system_prompt, SamplingParams(**values)))  # type: ignore[arg-type]


class LagMeter:
    """Ticks every 10 ms on the GUI thread; keeps the longest gap between ticks."""

    INTERVAL_MS = 10

    def __init__(self) -> None:
        self.worst_gap_s = 0.0
        self.ticks = 0
        self._last = 0.0
        self._timer = QTimer()
        self._timer.setInterval(self.INTERVAL_MS)
        self._timer.timeout.connect(self._tick)

    def start(self) -> None:
        self._last = time.perf_counter()
        self._timer.start()

    def stop(self) -> None:
        self._timer.stop()

    def _tick(self) -> None:
        now = time.perf_counter()
        self.worst_gap_s = max(self.worst_gap_s, now - self._last)
        self._last = now
        self.ticks += 1
