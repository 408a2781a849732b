"""The API's front door: a pure ASGI middleware that refuses anything SECURITY.md forbids.

Checks run in this order on every HTTP request, before the app sees it:
1. Host is one of the exact allowed values (DNS rebinding; Ollama CVE-2024-28224).
2. An `Origin`, when present, is one of the configured origins; preflights are answered here.
3. The API key, when one is set, on every route (compared in constant time), sent as
   `Authorization: Bearer <key>` (OpenAI's clients) or `x-api-key: <key>` (Anthropic's).
4. POST/PUT/PATCH carry `Content-Type: application/json`.
5. The body fits the cap: a large Content-Length is refused unread, a chunked body is read at
   most one chunk past the cap and never reaches the app.

Decisions read the raw ASGI scope (headers as bytes); no URL is rebuilt. Responses pass
through untouched apart from CORS headers, so streams are not buffered. Nothing here logs a
key, a header value or a body. Refusals come in OpenAI's error shape, or in Anthropic's on the
Anthropic Messages routes (`/v1/messages...`), whose clients read only that one.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

LOOPBACK_HOST_NAMES = ("127.0.0.1", "localhost", "[::1]")
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
PREFLIGHT_ALLOW_METHODS = b"GET, POST"
PREFLIGHT_ALLOW_HEADERS = b"authorization, content-type, x-api-key, anthropic-version"
PREFLIGHT_MAX_AGE_S = 600
ANTHROPIC_ROUTES = "/v1/messages"  # and the paths under it
# Anthropic's error type for each status (its "Errors" page); others by class: 4xx, 5xx.
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


@dataclass(frozen=True)
class SecurityPolicy:
    port: int
    api_key: str | None = None  # None: no key required (only allowed on loopback binds)
    extra_hosts: tuple[str, ...] = ()  # extra exact Host values for LAN mode, "name:port"
    cors_origins: tuple[str, ...] = ()  # exact origins allowed to call from a browser
    max_body_bytes: int = 1 << 20

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("an empty api_key would accept an empty token; pass None instead")

    def allowed_hosts(self) -> frozenset[str]:
        """Every Host header value accepted, lower-cased."""
        loopback = (f"{name}:{self.port}" for name in LOOPBACK_HOST_NAMES)
        return frozenset(host.lower() for host in (*loopback, *self.extra_hosts))


def openai_error(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """An error in the shape OpenAI's clients parse: {"error": {message, type, param, code}}."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


def anthropic_error(
    status: int, message: str, *, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    """An error in the shape Anthropic's clients parse: {"type": "error", "error": {type,
    message}}, the type named by the status as Anthropic names it."""
    fallback = "invalid_request_error" if status < 500 else "api_error"
    kind = ANTHROPIC_ERROR_TYPES.get(status, fallback)
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


def is_anthropic_route(path: str) -> bool:
    return path == ANTHROPIC_ROUTES or path.startswith(ANTHROPIC_ROUTES + "/")


@dataclass(frozen=True)
class _Refusal:
    status: int
    message: str
    code: str
    type_: str = "invalid_request_error"
    headers: Mapping[str, str] | None = None

    def response(self, *, close: bool = False, anthropic: bool = False) -> JSONResponse:
        headers = dict(self.headers or {})
        if close:
            headers["Connection"] = "close"
        if anthropic:
            return anthropic_error(self.status, self.message, headers=headers)
        return openai_error(
            self.status, self.message, type_=self.type_, code=self.code, headers=headers
        )


def host_not_allowed(port: int) -> _Refusal:
    """The 403 for a Host outside the allowlist, saying how to add a name (the Host sent is
    not echoed: a refusal repeats nothing the client sent)."""
    return _Refusal(
        403,
        f"This Host is not allowed. The API answers requests addressed to 127.0.0.1:{port}, "
        f"localhost:{port}, [::1]:{port} and the names it was started with. To use another "
        "name or address (for example from another computer), start it with "
        "`hearthside serve --lan-host NAME` (repeatable), NAME being the host in your URL.",
        "host_not_allowed",
    )


ORIGIN_NOT_ALLOWED = _Refusal(403, "This web origin is not allowed.", "origin_not_allowed")
MISSING_KEY = _Refusal(
    401,
    "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' or as "
    "'x-api-key: <key>'.",
    "missing_api_key",
    headers={"WWW-Authenticate": "Bearer"},
)
WRONG_KEY = _Refusal(
    401, "Incorrect API key provided.", "invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
)
NOT_JSON = _Refusal(
    415, "The request body must be JSON (Content-Type: application/json).", "unsupported_media_type"
)
BAD_LENGTH = _Refusal(400, "The Content-Length header is invalid.", "invalid_content_length")
TOO_LARGE = _Refusal(413, "The request body is too large.", "request_too_large")
WEBSOCKET_CLOSE_POLICY_VIOLATION = 1008


class SecurityMiddleware:
    def __init__(self, app: ASGIApp, policy: SecurityPolicy) -> None:
        self.app = app
        self.policy = policy
        self._allowed_hosts = {host.encode("latin-1") for host in policy.allowed_hosts()}
        self._host_refusal = host_not_allowed(policy.port)
        self._allowed_origins = {o.lower().encode("latin-1") for o in policy.cors_origins}
        self._key = policy.api_key.encode() if policy.api_key is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            await self._handle_http(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": WEBSOCKET_CLOSE_POLICY_VIOLATION})

    async def _handle_http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _RequestHeaders(scope)
        if not self._host_allowed(headers):
            await self._refuse(self._host_refusal, scope, receive, send)
            return
        origin = headers.only(b"origin")
        if headers.count(b"origin") > 1 or (origin is not None and not self._origin_ok(origin)):
            await self._refuse(ORIGIN_NOT_ALLOWED, scope, receive, send)
            return
        if origin is not None and _is_preflight(scope, headers):
            await _answer_preflight(origin, send)
            return
        send = _with_cors_headers(send, origin)
        refusal = self._auth_refusal(headers) or _content_refusal(scope, headers, self.policy)
        if refusal is not None:
            await self._refuse(refusal, scope, receive, send)
            return
        body = await _read_body_within(receive, self.policy.max_body_bytes)
        if body is _TOO_LARGE:
            await self._refuse(TOO_LARGE, scope, receive, send)
        elif isinstance(body, bytes):
            await self.app(scope, _replay_then(body, receive), send)
        # else: the client left while sending its body; there is no one to answer

    def _host_allowed(self, headers: _RequestHeaders) -> bool:
        host = headers.only(b"host")
        if host is None or headers.count(b"host") != 1:
            return False
        return host.lower() in self._allowed_hosts

    def _origin_ok(self, origin: bytes) -> bool:
        # Browsers send scheme and host lower-case; a configured "http://Studio.local" still counts.
        return origin.lower() in self._allowed_origins

    def _auth_refusal(self, headers: _RequestHeaders) -> _Refusal | None:
        if self._key is None:
            return None
        tokens = _sent_keys(headers)
        if not tokens:
            return MISSING_KEY
        # Every key sent must be right: a wrong one beside a right one is still refused.
        matches = [hmac.compare_digest(token, self._key) for token in tokens]
        return None if all(matches) else WRONG_KEY

    async def _refuse(self, refusal: _Refusal, scope: Scope, receive: Receive, send: Send) -> None:
        log.debug("refused a %s request: %s", scope.get("method", "?"), refusal.code)
        close = refusal is TOO_LARGE or _may_carry_large_body(_RequestHeaders(scope), self.policy)
        anthropic = is_anthropic_route(str(scope.get("path", "")))
        await refusal.response(close=close, anthropic=anthropic)(scope, receive, send)


def _sent_keys(headers: _RequestHeaders) -> list[bytes]:
    """The keys a request sends, `Authorization: Bearer` first, then `x-api-key`; empty when
    either header is repeated or the Authorization scheme is not Bearer (no key was given as
    the API asks)."""
    if headers.count(b"authorization") > 1 or headers.count(b"x-api-key") > 1:
        return []
    tokens = []
    authorization = headers.only(b"authorization")
    if authorization is not None:
        scheme, _, token = authorization.partition(b" ")
        if scheme.lower() != b"bearer":
            return []
        tokens.append(token.strip())
    api_key = headers.only(b"x-api-key")
    if api_key is not None:
        tokens.append(api_key.strip())
    return tokens


class _RequestHeaders:
    """The scope's raw headers, looked up by lower-case name (ASGI servers send them so)."""

    def __init__(self, scope: Scope) -> None:
        self._pairs: list[tuple[bytes, bytes]] = list(scope.get("headers", ()))

    def count(self, name: bytes) -> int:
        return sum(1 for key, _ in self._pairs if key.lower() == name)

    def only(self, name: bytes) -> bytes | None:
        """The first value of `name` as sent, or None when absent."""
        for key, value in self._pairs:
            if key.lower() == name:
                return value
        return None


def _content_refusal(
    scope: Scope, headers: _RequestHeaders, policy: SecurityPolicy
) -> _Refusal | None:
    if scope["method"] in BODY_METHODS and not _is_json(headers):
        return NOT_JSON
    length = headers.only(b"content-length")
    if length is None:
        return None
    if not length.strip().isdigit():
        return BAD_LENGTH
    return TOO_LARGE if int(length) > policy.max_body_bytes else None


def _may_carry_large_body(headers: _RequestHeaders, policy: SecurityPolicy) -> bool:
    """After a refusal the server would drain an unread body to keep the connection; for a
    body that may be large (or unbounded, when chunked) closing is cheaper."""
    if headers.count(b"transfer-encoding"):
        return True
    length = headers.only(b"content-length") or b"0"
    return not length.strip().isdigit() or int(length) > policy.max_body_bytes


def _is_json(headers: _RequestHeaders) -> bool:
    content_type = headers.only(b"content-type")
    if content_type is None or headers.count(b"content-type") != 1:
        return False
    media_type = content_type.split(b";", 1)[0].strip().lower()
    return media_type == b"application/json"


def _is_preflight(scope: Scope, headers: _RequestHeaders) -> bool:
    return scope["method"] == "OPTIONS" and headers.count(b"access-control-request-method") > 0


async def _answer_preflight(origin: bytes, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 204,
            "headers": [
                (b"access-control-allow-origin", origin),
                (b"vary", b"Origin"),
                (b"access-control-allow-methods", PREFLIGHT_ALLOW_METHODS),
                (b"access-control-allow-headers", PREFLIGHT_ALLOW_HEADERS),
                (b"access-control-max-age", str(PREFLIGHT_MAX_AGE_S).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def _with_cors_headers(send: Send, origin: bytes | None) -> Send:
    """Strip any CORS headers the app set; echo an allowed origin (callers checked it)."""

    async def send_with_cors(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [
                (name, value)
                for name, value in message.get("headers", ())
                if not name.lower().startswith(b"access-control-")
            ]
            if origin is not None:
                headers += [(b"access-control-allow-origin", origin), (b"vary", b"Origin")]
            message = {**message, "headers": headers}
        await send(message)

    return send_with_cors


class _TooLarge:
    pass


_TOO_LARGE = _TooLarge()


async def _read_body_within(receive: Receive, limit_bytes: int) -> bytes | _TooLarge | None:
    """The whole body, `_TOO_LARGE` once it passes the limit, or None if the client left.

    Read before the app runs so a 413 can still be sent: once the app has started its own
    response, there is no way left to refuse the request.
    """
    parts: list[bytes] = []
    received_bytes = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        received_bytes += len(chunk)
        if received_bytes > limit_bytes:
            return _TOO_LARGE
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay_then(body: bytes, receive: Receive) -> Receive:
    """A `receive` that yields the already-read body once, then the server's own messages
    (so the app still learns about a disconnect)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay
