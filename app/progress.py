"""A progress line on stderr for long work, redrawn in place; silent when stderr is a file."""

from __future__ import annotations

import sys
from types import TracebackType


class ProgressLine:
    """A `label: 42%` line on stderr, redrawn with \\r, only when stderr is a terminal."""

    def __init__(self, label: str) -> None:
        self._label = label
        self._last_percent = -1
        self._open_line = False
        self.callback = self._report if sys.stderr.isatty() else None

    def _report(self, done_bytes: int, total_bytes: int) -> None:
        percent = 100 if total_bytes <= 0 else min(100, done_bytes * 100 // total_bytes)
        if percent == self._last_percent:
            return
        self._last_percent = percent
        self.show(f"{percent:3d}%")

    def show(self, text: str) -> None:
        """Redraw the line as `label: text`."""
        if not sys.stderr.isatty():
            return
        sys.stderr.write(f"\r{self._label}: {text}\033[K")
        sys.stderr.flush()
        self._open_line = True

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._open_line:
            sys.stderr.write("\n")
            sys.stderr.flush()
