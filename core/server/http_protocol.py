"""HTTP/1.1 for the API with every wait bounded: uvicorn's h11 protocol plus deadlines.

uvicorn bounds only the quiet time *between* requests (`timeout_keep_alive`, and only until
the first byte of the next one), and h11 checks the header size only while the head is still
incomplete, so a client could hold a connection forever by sending its head a byte at a time or
a body shorter than its Content-Length, and a 20 KB head that arrives in one read passed. Here:

- the request head must arrive within `header_timeout_s` of the connection (or of the end of
  the previous reply) and be at most `max_header_bytes`: else 408 or 431, and the connection
  closes;
- the body must arrive within `body_timeout_s` of its head: else 408 and close;
- a head with both Content-Length and Transfer-Encoding is refused (400): the two disagree on
  where the body ends (request smuggling);
- at most `max_waiting_connections` connections wait for a head at once; past that, the one
  that has waited longest is closed (a real client sends its head at once; slow-loris does not);
- at most `max_receiving_bodies` connections are in the middle of receiving a body at once
  (each buffers up to the 1 MiB body cap): past that a new one is answered 503 with
  Retry-After and closed. Six hundred slow 1 MiB bodies once held 407 MB.

Refusals are OpenAI-shaped JSON, like the app's own.
"""

from __future__ import annotations

import asyncio
import http
import json
import weakref
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

_Phase = Literal["head", "body", "other"]


@dataclass(frozen=True)
class HttpLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0  # the whole body, at most 1 MiB: ~35 KB/s at the slowest
    max_header_bytes: int = 16 * 1024
    max_waiting_connections: int = 64
    # Bodies buffered at once, each at most the 1 MiB body cap: 32 MiB in all, far more than
    # the bounded request queue can take in while they arrive.
    max_receiving_bodies: int = 32
    busy_retry_after_s: int = 1
    keep_alive_s: int = 5  # uvicorn's: how long an idle connection stays open between requests


@dataclass(frozen=True)
class _Refusal:
    status: int
    code: str
    message: str
    retry_after_s: int | None = None


def _head_too_large(limits: HttpLimits) -> _Refusal:
    return _Refusal(
        431,
        "headers_too_large",
        f"The request headers are larger than {limits.max_header_bytes} bytes. "
        "Send fewer or shorter headers.",
    )


AMBIGUOUS_LENGTH = _Refusal(
    400,
    "ambiguous_body_length",
    "The request has both Content-Length and Transfer-Encoding. Send only one of them.",
)
INVALID_HTTP = _Refusal(
    400,
    "invalid_http",
    "The request is not valid HTTP/1.1. Check the request line and the headers.",
)


def _head_slow(limits: HttpLimits) -> _Refusal:
    return _Refusal(
        408,
        "request_timeout",
        f"The request headers did not arrive within {limits.header_timeout_s:g} s. "
        "Send the whole request at once.",
    )


def _body_slow(limits: HttpLimits) -> _Refusal:
    return _Refusal(
        408,
        "request_timeout",
        f"The request body did not arrive within {limits.body_timeout_s:g} s: it is shorter "
        "than its Content-Length, or too slow. Send the whole body with a correct length.",
    )


def _too_many_bodies(limits: HttpLimits) -> _Refusal:
    return _Refusal(
        503,
        "server_busy",
        f"The server is already receiving {limits.max_receiving_bodies} request bodies, the "
        "most it takes at once. Try again in a moment, and send each body at once.",
        retry_after_s=limits.busy_retry_after_s,
    )


def _head_size(request: h11.Request) -> int:
    """Bytes of the request line and headers, as sent less optional whitespace."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


class _CheckedConnection(h11.Connection):
    """h11's server side, refusing heads that h11 accepts but we must not."""

    def __init__(self, limits: HttpLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.limits = limits
        self.refusal: _Refusal | None = None

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            too_large = exc.error_status_hint == http.HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            self.refusal = _head_too_large(self.limits) if too_large else INVALID_HTTP
            raise
        if isinstance(event, h11.Request):
            self.refusal = self._refusal_for(event)
            if self.refusal is not None:
                raise h11.RemoteProtocolError(self.refusal.message, self.refusal.status)
        return event

    def _refusal_for(self, request: h11.Request) -> _Refusal | None:
        if _head_size(request) > self.limits.max_header_bytes:
            return _head_too_large(self.limits)
        names = {name for name, _ in request.headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            return AMBIGUOUS_LENGTH
        return None


# Per server: the connections waiting for a request head, longest-waiting first.
_waiting_by_server: weakref.WeakKeyDictionary[ServerState, dict[BoundedH11Protocol, None]] = (
    weakref.WeakKeyDictionary()
)
# Per server: the connections receiving a request body.
_receiving_by_server: weakref.WeakKeyDictionary[ServerState, set[BoundedH11Protocol]] = (
    weakref.WeakKeyDictionary()
)


class BoundedH11Protocol(H11Protocol):
    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn: _CheckedConnection = _CheckedConnection(self.limits)
        self._phase: _Phase = "other"
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting = _waiting_by_server.setdefault(server_state, {})
        self._receiving = _receiving_by_server.setdefault(server_state, set())

    # -- uvicorn's hooks, each followed by a look at where the request now stands --

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._follow_request()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter("other")
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._enter("other")
        self._answer_and_close(self.conn.refusal or INVALID_HTTP)

    # -- deadlines --

    def _follow_request(self) -> None:
        state = self.conn.their_state
        if self.transport.is_closing():
            phase: _Phase = "other"
        elif state is h11.IDLE:
            phase = "head"
        elif state is h11.SEND_BODY:
            phase = "body"
        else:
            phase = "other"
        if phase != self._phase:
            self._enter(phase)

    def _enter(self, phase: _Phase) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._waiting.pop(self, None)
        self._receiving.discard(self)
        self._phase = phase
        if phase == "head":
            self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._head_late)
            self._waiting[self] = None
            self._close_longest_waiting()
        elif phase == "body":
            self._start_receiving_body()

    def _start_receiving_body(self) -> None:
        # Called from data_received, before the app's task has run: nothing is sent yet.
        if len(self._receiving) >= self.limits.max_receiving_bodies:
            self._phase = "other"
            self._answer_and_close(_too_many_bodies(self.limits))
            return
        self._receiving.add(self)
        self._deadline = self.loop.call_later(self.limits.body_timeout_s, self._body_late)

    def _close_longest_waiting(self) -> None:
        while len(self._waiting) > self.limits.max_waiting_connections:
            longest = next(iter(self._waiting))
            longest._enter("other")
            longest.transport.close()

    def _head_late(self) -> None:
        self._deadline = None
        self._enter("other")
        if self.transport.is_closing():
            return
        partial_head, _ = self.conn.trailing_data
        if partial_head:
            self._answer_and_close(_head_slow(self.limits))
        else:
            self.transport.close()

    def _body_late(self) -> None:
        self._deadline = None
        self._enter("other")
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
        else:
            self._answer_and_close(_body_slow(self.limits))

    def _answer_and_close(self, refusal: _Refusal) -> None:
        """Answer directly on the socket: h11's state no longer matters once we close."""
        kind = "invalid_request_error" if refusal.status < 500 else "server_error"
        error = {"message": refusal.message, "type": kind}
        body = json.dumps({"error": {**error, "param": None, "code": refusal.code}}).encode()
        reason = http.HTTPStatus(refusal.status).phrase
        retry = "" if refusal.retry_after_s is None else f"retry-after: {refusal.retry_after_s}\r\n"
        head = (
            f"HTTP/1.1 {refusal.status} {reason}\r\ncontent-type: application/json\r\n"
            f"{retry}content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        self.transport.write(head.encode("ascii") + body)
        self.transport.close()


def protocol_with(limits: HttpLimits) -> type[BoundedH11Protocol]:
    """The protocol class uvicorn builds a connection with, bound to these limits."""

    class Configured(BoundedH11Protocol):
        pass

    Configured.limits = limits
    return Configured
