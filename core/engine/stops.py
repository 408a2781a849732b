"""Stop sequences over streamed text: nothing that might be the start of a stop is shown early."""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feeds streamed text through; returns what is safe to show and whether a stop was hit.

    Text that could still grow into a stop sequence is held back until the next piece shows
    it does not, so a stop split across tokens never leaks into the reply.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(stop for stop in stops if stop)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        self._pending += text
        cut = self._earliest_stop()
        if cut is not None:
            shown, self._pending = self._pending[:cut], ""
            return shown, True
        keep = self._longest_partial_stop()
        shown = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(shown) :]
        return shown, False

    def flush(self, text: str = "") -> str:
        """The held-back text, once the stream has ended without a stop."""
        rest, self._pending = self._pending + text, ""
        return rest

    def _earliest_stop(self) -> int | None:
        found = [index for stop in self._stops if (index := self._pending.find(stop)) >= 0]
        return min(found) if found else None

    def _longest_partial_stop(self) -> int:
        """Length of the longest tail of the pending text that begins some stop sequence."""
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:size]):
                    longest = size
                    break
        return longest
