"""A cancel flag that tells its listeners the moment it is set.

A thread that waits for something else (the engine worker's next answer) learns of a cancel
through a listener instead of waking up every few milliseconds to look at the flag. On a small
CPU every such wake-up lands in the middle of a decode step and stalls its threads: polling 50
times a second cost 3% of decode speed on two cores (benchmarks/worker_overhead.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Listener = Callable[[], None]


class CancelEvent(threading.Event):
    """`threading.Event` whose `set` also calls, once, every listener added by `when_set`."""

    def __init__(self) -> None:
        super().__init__()
        self._listeners_lock = threading.Lock()
        self._listeners: list[Listener] = []

    def set(self) -> None:
        super().set()
        with self._listeners_lock:
            listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener()

    def when_set(self, listener: Listener) -> Callable[[], None]:
        """Call `listener` once this event is set (at once if it already is); returns a
        function that takes the listener back."""
        with self._listeners_lock:
            if not self.is_set():
                self._listeners.append(listener)
                return lambda: self._forget(listener)
        listener()
        return lambda: None

    def _forget(self, listener: Listener) -> None:
        with self._listeners_lock:
            if listener in self._listeners:
                self._listeners.remove(listener)


__all__ = ["CancelEvent"]
