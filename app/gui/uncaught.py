"""Exceptions nobody caught, while the window runs: logged, shown, and the window lives on.

PySide6 hands an exception that escapes a slot (a click, a timer, a signal) to
`sys.excepthook`, and a dying thread's to `threading.excepthook`; Python's default hooks print
a traceback on a terminal the user of a window never sees. `UncaughtErrorReporter` replaces
both while it is installed: the traceback goes to the log file (`describe_error`) and the
message bar says what happened and where the log is. Ctrl-C still goes to the old hook.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType

from PySide6.QtCore import QObject, Signal, Slot

from hearthside.core.errors import describe_error

ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


class UncaughtErrorReporter(QObject):
    """Between `install()` and `uninstall()`, shows every uncaught exception with `show(text)`
    on the thread this object lives on (the UI thread), whichever thread raised it."""

    caught = Signal(str)

    def __init__(self, show: Callable[[str], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._show = show
        self._previous_hook: ExceptHook | None = None
        self._previous_thread_hook: Callable[[threading.ExceptHookArgs], object] | None = None
        self.caught.connect(self._show_text)  # queued when emitted from another thread

    def install(self) -> None:
        if self._previous_hook is not None:
            return
        self._previous_hook = sys.excepthook
        self._previous_thread_hook = threading.excepthook
        sys.excepthook = self._on_uncaught
        threading.excepthook = self._on_uncaught_in_thread

    def uninstall(self) -> None:
        if self._previous_hook is None:
            return
        # Only put back what we replaced: someone who hooked in after us keeps their hook.
        if sys.excepthook == self._on_uncaught:
            sys.excepthook = self._previous_hook
        if threading.excepthook == self._on_uncaught_in_thread and self._previous_thread_hook:
            threading.excepthook = self._previous_thread_hook
        self._previous_hook = self._previous_thread_hook = None

    def _on_uncaught(
        self, kind: type[BaseException], error: BaseException, trace: TracebackType | None
    ) -> None:
        if not isinstance(error, Exception):  # Ctrl-C, SystemExit: not ours to report
            (self._previous_hook or sys.__excepthook__)(kind, error, trace)
            return
        self.report(error.with_traceback(trace) if trace is not None else error)

    def _on_uncaught_in_thread(self, args: threading.ExceptHookArgs) -> None:
        if not isinstance(args.exc_value, Exception):
            (self._previous_thread_hook or threading.__excepthook__)(args)
            return
        self.report(args.exc_value)

    def report(self, error: Exception) -> None:
        """Log `error` with its traceback and show it in words; safe from any thread."""
        self.caught.emit(describe_error(error))

    @Slot(str)
    def _show_text(self, text: str) -> None:
        self._show(text)
