"""Blocking work off the UI thread, with its result delivered back on the UI thread.

    task = run_in_background(lambda: probe_in_subprocess(), on_done=page.show_profile,
                             on_error=page.show_error)

`fn` runs on a worker thread and must not touch widgets; `on_done(result)` or
`on_error(exception)` then runs on the thread that called `run_in_background` (the UI thread),
through a queued Qt signal. `MainThreadRelay` does the same for values reported while the
work runs (progress), and a `threading.Event` is the way to ask the work to stop: a queued
slot cannot reach a worker that is busy.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import shiboken6
from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

log = logging.getLogger(__name__)
T = TypeVar("T")
# Tasks block on disks, child processes and sockets rather than on the CPU, so a few more
# threads than cores keep one slow task from queueing the others behind it.
MAX_BACKGROUND_THREADS = 8

_pool: QThreadPool | None = None
_running: set[BackgroundTask[Any]] = set()  # keeps each task alive until its callback ran


def _thread_pool() -> QThreadPool:
    global _pool
    if _pool is None:
        _pool = QThreadPool()
        _pool.setMaxThreadCount(MAX_BACKGROUND_THREADS)
    return _pool


class BackgroundTask(QObject, Generic[T]):
    """One call of `fn` on a worker thread. Lives on the thread that created it."""

    succeeded = Signal(object)
    failed = Signal(object)
    finished = Signal()
    # Emitted on the worker thread; `_deliver` then runs on this object's thread (queued).
    _outcome = Signal()

    def __init__(
        self,
        fn: Callable[[], T],
        on_done: Callable[[T], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        super().__init__()
        self._fn = fn
        self._on_done = on_done
        self._on_error = on_error
        self._finished_running = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None
        self._outcome.connect(self._deliver)

    def run(self) -> None:
        """The worker-thread part: call `fn`, keep what it returned or raised."""
        try:
            self.result = self._fn()
        except Exception as exc:  # delivered to on_error; a worker thread must not die of it
            self.error = exc
        finally:
            self._finished_running.set()
            # at exit Qt may have deleted this object while fn ran: nobody is left to tell
            if shiboken6.isValid(self):
                self._outcome.emit()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until `fn` has returned or raised (not until the callbacks ran)."""
        return self._finished_running.wait(timeout_s)

    def done(self) -> bool:
        return self._finished_running.is_set()

    @Slot()
    def _deliver(self) -> None:
        try:
            if self.error is not None:
                self._report_error(self.error)
            else:
                if self._on_done is not None and _owner_alive(self._on_done):
                    self._on_done(self.result)  # type: ignore[arg-type]
                self.succeeded.emit(self.result)
        finally:
            self.finished.emit()
            _running.discard(self)

    def _report_error(self, error: BaseException) -> None:
        if self._on_error is not None and _owner_alive(self._on_error):
            self._on_error(error)
        else:
            log.error("background task failed", exc_info=error)
        self.failed.emit(error)


class _Runnable(QRunnable):
    def __init__(self, task: BackgroundTask[Any]) -> None:
        super().__init__()
        self._task = task

    def run(self) -> None:
        self._task.run()


def run_in_background(
    fn: Callable[[], T],
    on_done: Callable[[T], None] | None = None,
    on_error: Callable[[BaseException], None] | None = None,
) -> BackgroundTask[T]:
    """Run `fn()` on a worker thread; call `on_done(result)` or `on_error(exc)` on this one."""
    task: BackgroundTask[T] = BackgroundTask(fn, on_done, on_error)
    _running.add(task)
    _thread_pool().start(_Runnable(task))
    return task


class MainThreadRelay(QObject):
    """`post(value)` from any thread calls `callback(value)` on the relay's own thread."""

    _posted = Signal(object)

    def __init__(self, callback: Callable[[Any], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._callback = callback
        self._posted.connect(self._call)

    def post(self, value: Any) -> None:
        self._posted.emit(value)

    @Slot(object)
    def _call(self, value: Any) -> None:
        self._callback(value)


def _owner_alive(callback: Callable[..., object]) -> bool:
    """False when `callback` is a method of a widget Qt has deleted since the task started (a
    page closed while it planned): calling it would raise from the deleted widget."""
    owner = getattr(callback, "__self__", None)
    return not isinstance(owner, QObject) or shiboken6.isValid(owner)
