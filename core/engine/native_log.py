"""llama.cpp's own log lines, kept off the terminal and remembered for error messages.

llama.cpp writes loader chatter to stderr even when asked to be quiet; Hearthside routes it
to the `hearthside.llama_cpp` logger at DEBUG and keeps the most recent lines, so a failed
load can say what llama.cpp reported (e.g. "failed to allocate buffer").
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import threading
from collections.abc import Iterator

import llama_cpp

from hearthside.core.display_text import shortened

log = logging.getLogger("hearthside.llama_cpp")
_RECENT_LINES = 64
_recent: collections.deque[str] = collections.deque(maxlen=_RECENT_LINES)
_lock = threading.Lock()
_partial = [""]
_captures: list[list[str]] = []


@llama_cpp.llama_log_callback
def _on_native_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    piece = text.decode("utf-8", errors="replace")
    with _lock:
        buffered = _partial[0] + piece
        *lines, _partial[0] = buffered.split("\n")
        for line in lines:
            if line.strip():
                _recent.append(line)
                log.debug("%s", line)
                for captured in _captures:
                    captured.append(line)


def install() -> None:
    """Route llama.cpp's logging here (idempotent; the callback lives for the process)."""
    llama_cpp.llama_log_set(_on_native_log, ctypes.c_void_p(0))


@contextlib.contextmanager
def captured_lines() -> Iterator[list[str]]:
    """Every line llama.cpp logs while the block runs (e.g. a load's buffer sizes)."""
    install()
    captured: list[str] = []
    with _lock:
        _captures.append(captured)
    try:
        yield captured
    finally:
        with _lock:
            if _partial[0].strip():
                captured.append(_partial[0])
            _captures.remove(captured)


def forget() -> None:
    """Start a fresh record, e.g. right before loading a model."""
    with _lock:
        _recent.clear()


# What llama.cpp and numpy say when an allocation fails: "failed to allocate buffer for kv
# cache", "failed to allocate compute pp buffers", "Unable to allocate 512. MiB for an array".
ALLOCATION_WORDS = ("alloc", "memory")


def is_allocation_message(line: str | None) -> bool:
    lowered = (line or "").lower()
    return any(word in lowered for word in ALLOCATION_WORDS)


def last_failure_line() -> str | None:
    """The latest line where llama.cpp explains a failure, to show alongside our message."""
    with _lock:
        lines = list(_recent)
    for line in reversed(lines):
        lowered = line.lower()
        if "error" in lowered or "failed" in lowered:
            return shortened(line.strip())  # the line may hold a megabyte of model metadata
    return None
