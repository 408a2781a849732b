"""`ReplyWriter`: saves a streaming reply on its own thread, so a slow disk never freezes the
window.

With synchronous=FULL every save waits for the disk. On a busy disk (a model download, other
programs) one save took 370 ms here, and on the GUI thread that froze the window for as long.
So the window hands each flushed text to this writer and shows it only once the writer reports
it saved: the screen may trail the model by one write, but never runs ahead of the disk — a
`kill -9` loses nothing that was shown. While the disk is slow, newer texts of the same reply
replace the one still waiting, so the writer never falls behind.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from hearthside.core.errors import HearthsideError
from hearthside.core.history.store import ConversationStore

if TYPE_CHECKING:  # the engine module pulls in llama.cpp: not before the window shows
    from hearthside.core.engine.engine import GenerationMetrics


@dataclass(frozen=True)
class SavedText:
    message_id: int
    text: str
    final: bool  # the reply has ended and is marked complete with its metrics


@dataclass(frozen=True)
class _Save:
    message_id: int
    text: str
    metrics: GenerationMetrics | None = None
    final: bool = False


class ReplyWriter(QObject):
    """One thread with its own connection to history.db, writing replies in order."""

    saved = Signal(object)  # SavedText, once it is on disk (or could not be: see `failed`)
    failed = Signal(object)  # HearthsideError: the disk refused; the text is shown anyway

    def __init__(self, root: Path, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._root = root
        self._pending: deque[_Save] = deque()
        self._condition = threading.Condition()
        self._busy = False
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, name="hearthside-history-writer", daemon=True
        )
        self._thread.start()

    # ---- the GUI thread's side ---------------------------------------------------------

    def save(self, message_id: int, text: str) -> None:
        """Save the reply's text so far (replacing a not-yet-written text of the same reply)."""
        self._put(_Save(message_id, text))

    def finish(self, message_id: int, text: str, metrics: GenerationMetrics) -> None:
        """Save the reply's final text and metrics and mark it complete."""
        self._put(_Save(message_id, text, metrics, final=True))

    def wait_until_idle(self, timeout_s: float = 5.0) -> bool:
        """Block until everything handed over is written (for error paths and shutdown)."""
        with self._condition:
            return self._condition.wait_for(
                lambda: not self._pending and not self._busy, timeout=timeout_s
            )

    def close(self, timeout_s: float = 5.0) -> None:
        """Write what is pending, then end the thread."""
        with self._condition:
            self._closing = True
            self._condition.notify_all()
        self._thread.join(timeout_s)

    def _put(self, save: _Save) -> None:
        with self._condition:
            if self._closing:
                raise HearthsideError("The chat history is closed.")
            last = self._pending[-1] if self._pending else None
            if last is not None and not last.final and last.message_id == save.message_id:
                self._pending.pop()  # superseded: the newer text contains it
            self._pending.append(save)
            self._condition.notify_all()

    # ---- the writer thread -------------------------------------------------------------

    def _run(self) -> None:
        store: ConversationStore | None = None
        try:
            while (save := self._next()) is not None:
                try:
                    store = store or ConversationStore(self._root)
                    _write(store, save)
                except HearthsideError as exc:
                    self.failed.emit(exc)
                self.saved.emit(SavedText(save.message_id, save.text, save.final))
                with self._condition:
                    self._busy = False
                    self._condition.notify_all()
        finally:
            if store is not None:
                store.close()

    def _next(self) -> _Save | None:
        with self._condition:
            self._condition.wait_for(lambda: self._pending or self._closing)
            if not self._pending:
                return None
            self._busy = True
            return self._pending.popleft()


def _write(store: ConversationStore, save: _Save) -> None:
    if save.final and save.metrics is not None:
        store.finish_message(save.message_id, save.text, save.metrics)
    else:
        store.update_message(save.message_id, save.text)
