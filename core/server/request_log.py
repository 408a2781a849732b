"""A short log of the requests the API finished, for the window's Local API panel.

`RequestLogMiddleware` is the outermost ASGI layer (refusals by the security checks show too,
so a user sees why their editor gets 401/403). For each HTTP request it notes the time, the
method and path (never the query string or body: prompts stay out), the status, the
tokens generated when the answer says (`usage` in a JSON body, or in a stream's chunk when
the client asked for it), and the model the request waited for to load, if it did (the
answer's X-Hearthside-Loaded-Model header, core/server/model_load.py). `RequestLog` keeps
the latest entries and calls a listener on the server's thread; the window turns that into a
Qt signal.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearthside.core.server.model_load import LOAD_WAIT_HEADER, LOADED_MODEL_HEADER

MAX_ENTRIES = 200
MAX_PARSED_BODY_BYTES = 1 << 20  # larger JSON bodies are not searched for `usage`


@dataclass(frozen=True)
class FinishedRequest:
    finished_at: float  # time.time() when the answer ended (or the client left)
    method: str
    path: str
    status: int | None  # None: the connection closed before any answer
    completion_tokens: int | None  # None: the answer did not say
    duration_s: float
    loaded_model: str | None = None  # the model loaded before this request was answered
    load_wait_s: float | None = None  # how long the request waited for that load


RequestListener = Callable[[FinishedRequest], None]


class RequestLog:
    """The latest finished requests; thread-safe. `listener` runs on the server's thread."""

    def __init__(self, listener: RequestListener | None = None, size: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._entries: deque[FinishedRequest] = deque(maxlen=size)
        self._listener = listener

    def add(self, entry: FinishedRequest) -> None:
        with self._lock:
            self._entries.append(entry)
        if self._listener is not None:
            self._listener(entry)

    def entries(self) -> list[FinishedRequest]:
        with self._lock:
            return list(self._entries)


def completion_tokens_in(body: bytes) -> int | None:
    """Tokens generated, from the last `usage` object in a JSON body or SSE chunks."""
    if b'"usage"' not in body or len(body) > MAX_PARSED_BODY_BYTES:
        return None
    found = None
    for chunk in _json_documents(body):
        usage = chunk.get("usage") if isinstance(chunk, dict) else None
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens", usage.get("output_tokens"))
            found = tokens if isinstance(tokens, int) else found
    return found


def _json_documents(body: bytes) -> list[object]:
    text = body.decode("utf-8", errors="replace")
    lines = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    documents = []
    for piece in lines or [text]:
        if '"usage"' in piece:
            try:
                documents.append(json.loads(piece))
            except ValueError:
                continue
    return documents


def load_in(headers: Headers) -> tuple[str, float] | None:
    """(model, seconds waited) when the answer says its request waited for a load."""
    model = headers.get(LOADED_MODEL_HEADER)
    if model is None:
        return None
    try:
        return model, float(headers.get(LOAD_WAIT_HEADER, "0"))
    except ValueError:
        return model, 0.0


class RequestLogMiddleware:
    def __init__(self, app: ASGIApp, log: RequestLog) -> None:
        self.app = app
        self.log = log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status: int | None = None
        tokens: int | None = None
        load: tuple[str, float] | None = None

        async def noting_send(message: Message) -> None:
            nonlocal status, tokens, load
            if message["type"] == "http.response.start":
                status = int(message["status"])
                load = load_in(Headers(raw=message.get("headers", [])))
            elif message["type"] == "http.response.body":
                found = completion_tokens_in(message.get("body", b""))
                tokens = found if found is not None else tokens
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            self.log.add(
                FinishedRequest(
                    finished_at=time.time(),
                    method=str(scope.get("method", "")),
                    path=str(scope.get("path", "")),
                    status=status,
                    completion_tokens=tokens,
                    duration_s=time.monotonic() - started,
                    loaded_model=load[0] if load else None,
                    load_wait_s=load[1] if load else None,
                )
            )
