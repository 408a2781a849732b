"""The API's front door over real HTTP: uvicorn in a thread, a tiny app behind SecurityMiddleware.

Each promise in SECURITY.md about the API has a test here: the exact Host allowlist (DNS
rebinding), Origin/CORS, the key on every route, JSON-only POSTs, the body cap, OpenAI-shaped
errors that leak nothing, and streams that are not buffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.types import Message

from hearthside.core.server import security
from hearthside.core.server.security import SecurityMiddleware, SecurityPolicy, openai_error

KEY = "test-key-" + "k" * 40
WRONG_KEY = "test-key-" + "w" * 40
ORIGIN = "http://localhost:3000"
FOREIGN_ORIGIN = "http://evil.example"
CAP_BYTES = 1 << 20
STREAM_CHUNKS = 5
STREAM_PAUSE_S = 0.2
START_TIMEOUT_S = 10.0

ROUTES = [
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("POST", "/v1/echo"),
    ("GET", "/v1/stream"),
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/no-such-route"),
]


# ---- the server under test ---------------------------------------------------------------------


@dataclass
class LiveServer:
    port: int
    app: FastAPI
    echoed_body_sizes: list[int] = field(default_factory=list)
    family: socket.AddressFamily = socket.AF_INET

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        address = "[::1]" if self.family == socket.AF_INET6 else "127.0.0.1"
        return f"http://{address}:{self.port}"

    def client(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=5.0)


def build_app(echoed_body_sizes: list[int]) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.started = True
        yield

    app = FastAPI(lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": []}

    @app.post("/v1/echo")
    async def echo(request: Request) -> JSONResponse:
        body = await request.body()
        echoed_body_sizes.append(len(body))
        return JSONResponse(json.loads(body))

    @app.get("/v1/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for index in range(STREAM_CHUNKS):
                if index:
                    await asyncio.sleep(STREAM_PAUSE_S)
                yield f"chunk {index}\n".encode()

        return StreamingResponse(chunks(), media_type="text/plain")

    return app


def bound_socket(family: socket.AddressFamily) -> socket.socket:
    """A socket on a free loopback port, handed to uvicorn so no other process can take it."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::1" if family == socket.AF_INET6 else "127.0.0.1", 0))
    return sock


@contextlib.contextmanager
def serve(
    make_policy: Callable[[int], SecurityPolicy], family: socket.AddressFamily = socket.AF_INET
) -> Iterator[LiveServer]:
    sock = bound_socket(family)
    port = sock.getsockname()[1]
    echoed: list[int] = []
    app = build_app(echoed)
    app.add_middleware(SecurityMiddleware, policy=make_policy(port))
    config = uvicorn.Config(
        app,
        http="h11",
        lifespan="on",
        log_config=None,
        log_level="warning",
        access_log=False,
        h11_max_incomplete_event_size=16 * 1024,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_until_started(server, thread)
        yield LiveServer(port=port, app=app, echoed_body_sizes=echoed, family=family)
    finally:
        server.should_exit = True
        thread.join(timeout=START_TIMEOUT_S)
        sock.close()
    assert not thread.is_alive(), "the uvicorn thread did not stop"


def wait_until_started(server: uvicorn.Server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped during startup"
        assert time.monotonic() < deadline, "uvicorn did not start in time"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def open_server() -> Iterator[LiveServer]:
    """No key, no CORS: the default loopback setup."""
    with serve(lambda port: SecurityPolicy(port=port, extra_hosts=(f"studio.local:{port}",))) as s:
        yield s


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[LiveServer]:
    """A key and one allowed web origin."""
    with serve(lambda port: SecurityPolicy(port=port, api_key=KEY, cors_origins=(ORIGIN,))) as s:
        yield s


# ---- helpers -----------------------------------------------------------------------------------


def call(
    server: LiveServer, method: str, path: str, *, key: str | None = None, **headers: str
) -> httpx.Response:
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {}
    if method == "POST":
        body = {"json": {"hello": "world"}}
    with server.client(**headers) as client:
        return client.request(method, path, **body)


def raw_exchange(server: LiveServer, request: bytes, *, body: bytes = b"") -> tuple[int, bytes]:
    """Send bytes as they are and read the reply until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=5.0) as conn:
        conn.sendall(request + body)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    status_line, _, _ = reply.partition(b"\r\n")
    return int(status_line.split()[1]), reply


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}


def assert_openai_error(response: httpx.Response | bytes, status: int, code: str) -> None:
    if isinstance(response, httpx.Response):
        assert response.status_code == status
        text = response.text
    else:
        text = response.partition(b"\r\n\r\n")[2].decode()
    error = json.loads(text)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    assert error["param"] is None
    assert isinstance(error["type"], str) and error["message"]
    assert_leaks_nothing(text)


def assert_leaks_nothing(text: str) -> None:
    for secret in (KEY, WRONG_KEY, "Traceback", security.__file__, "site-packages", "/work/"):
        assert secret not in text


# ---- Host allowlist (DNS rebinding) ------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1:{p}", "localhost:{p}", "[::1]:{p}", "LOCALHOST:{p}", "studio.local:{p}"],
)
def test_allowed_host_forms(open_server: LiveServer, host: str) -> None:
    response = call(open_server, "GET", "/health", Host=host.format(p=open_server.port))
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "host",
    [
        "evil.com:{p}",
        "127.0.0.1",
        "localhost",
        "127.0.0.1:{p}.evil.com",
        "127.0.0.1:{other}",
        "127.0.0.2:{p}",
        "0.0.0.0:{p}",
        "studio.local",
        "127.0.0.1:{p}@evil.com",
    ],
)
def test_rebinding_host_forms_are_refused(open_server: LiveServer, host: str) -> None:
    value = host.format(p=open_server.port, other=open_server.port + 1)
    response = call(open_server, "GET", "/health", Host=value)
    assert_openai_error(response, 403, "host_not_allowed")


def test_empty_host_is_refused(open_server: LiveServer) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: \r\nConnection: close\r\n\r\n"
    status, reply = raw_exchange(open_server, request)
    assert status in (400, 403)
    assert b'"ok"' not in reply


def test_missing_host_http11_is_refused(open_server: LiveServer) -> None:
    # h11 itself answers 400 to an HTTP/1.1 request without Host; either way the app never runs.
    status, reply = raw_exchange(open_server, b"GET /health HTTP/1.1\r\n\r\n")
    assert status in (400, 403)
    assert b'"ok"' not in reply


def test_missing_host_http10_is_refused(open_server: LiveServer) -> None:
    status, reply = raw_exchange(open_server, b"GET /health HTTP/1.0\r\n\r\n")
    assert status == 403
    assert_openai_error(reply, 403, "host_not_allowed")


def test_duplicate_host_headers_are_refused(open_server: LiveServer) -> None:
    request = (
        f"GET /health HTTP/1.1\r\nHost: {open_server.host}\r\nHost: evil.com\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    status, reply = raw_exchange(open_server, request)
    assert status in (400, 403)
    assert b'"ok"' not in reply


def test_host_is_checked_before_the_key(keyed_server: LiveServer) -> None:
    response = call(keyed_server, "GET", "/health", key=KEY, Host="evil.com")
    assert_openai_error(response, 403, "host_not_allowed")


def test_allowed_hosts_are_lower_cased() -> None:
    policy = SecurityPolicy(port=8765, extra_hosts=("Studio.Local:8765",))
    assert policy.allowed_hosts() == {
        "127.0.0.1:8765",
        "localhost:8765",
        "[::1]:8765",
        "studio.local:8765",
    }


@pytest.mark.parametrize("api_key", ["", "  "])
def test_empty_key_is_a_configuration_error(api_key: str) -> None:
    with pytest.raises(ValueError):
        SecurityPolicy(port=8765, api_key=api_key)


def ipv6_loopback_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback_available(), reason="no IPv6 loopback on this machine")
def test_ipv6_loopback_connection_is_allowed() -> None:
    with serve(lambda port: SecurityPolicy(port=port), family=socket.AF_INET6) as server:
        with server.client() as client:
            assert client.get("/health").status_code == 200
        with server.client(Host=f"evil.com:{server.port}") as client:
            assert client.get("/health").status_code == 403


# ---- Origin and CORS ---------------------------------------------------------------------------


def test_no_cors_headers_without_configured_origins(open_server: LiveServer) -> None:
    response = call(open_server, "GET", "/health")
    assert response.status_code == 200
    assert cors_headers(response) == {}


@pytest.mark.parametrize("origin", [FOREIGN_ORIGIN, ORIGIN, "null"])
def test_any_origin_is_refused_when_none_configured(open_server: LiveServer, origin: str) -> None:
    response = call(open_server, "GET", "/health", Origin=origin)
    assert_openai_error(response, 403, "origin_not_allowed")
    assert cors_headers(response) == {}


def test_foreign_preflight_is_refused(open_server: LiveServer) -> None:
    response = call(
        open_server,
        "OPTIONS",
        "/v1/echo",
        Origin=FOREIGN_ORIGIN,
        **{"Access-Control-Request-Method": "POST"},
    )
    assert response.status_code == 403
    assert cors_headers(response) == {}


@pytest.mark.parametrize(
    "origin", [FOREIGN_ORIGIN, "null", ORIGIN + ".evil.example", "https://localhost:3000"]
)
def test_foreign_origin_is_refused_even_with_the_key(keyed_server: LiveServer, origin: str) -> None:
    response = call(keyed_server, "GET", "/health", key=KEY, Origin=origin)
    assert_openai_error(response, 403, "origin_not_allowed")
    assert cors_headers(response) == {}


def test_configured_origin_gets_an_exact_echo(keyed_server: LiveServer) -> None:
    response = call(keyed_server, "GET", "/health", key=KEY, Origin=ORIGIN)
    assert response.status_code == 200
    assert cors_headers(response) == {"access-control-allow-origin": ORIGIN}
    assert "Origin" in response.headers.get_list("vary")


def test_configured_origin_can_read_auth_errors(keyed_server: LiveServer) -> None:
    response = call(keyed_server, "GET", "/health", Origin=ORIGIN)
    assert_openai_error(response, 401, "missing_api_key")
    assert response.headers["access-control-allow-origin"] == ORIGIN


def test_preflight_for_configured_origin(keyed_server: LiveServer) -> None:
    response = call(
        keyed_server,
        "OPTIONS",
        "/v1/echo",
        Origin=ORIGIN,
        **{
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    assert response.status_code == 204
    headers = cors_headers(response)
    assert headers["access-control-allow-origin"] == ORIGIN
    assert headers["access-control-allow-methods"] == "GET, POST"
    allowed = "authorization, content-type, x-api-key, anthropic-version"
    assert headers["access-control-allow-headers"] == allowed
    assert "access-control-allow-credentials" not in headers
    assert all("*" not in value for value in headers.values())
    assert "Origin" in response.headers.get_list("vary")


# ---- the API key -------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_missing_key_is_refused_on_every_route(
    keyed_server: LiveServer, method: str, path: str
) -> None:
    response = call(keyed_server, method, path)
    assert_openai_error(response, 401, "missing_api_key")
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_wrong_key_is_refused_on_every_route(
    keyed_server: LiveServer, method: str, path: str
) -> None:
    response = call(keyed_server, method, path, key=WRONG_KEY)
    assert_openai_error(response, 401, "invalid_api_key")
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_right_key_is_accepted_on_every_route(
    keyed_server: LiveServer, method: str, path: str
) -> None:
    response = call(keyed_server, method, path, key=KEY)
    assert response.status_code == (404 if path == "/no-such-route" else 200)


@pytest.mark.parametrize(
    "authorization",
    [
        f"Basic {KEY}",
        KEY,
        f"Bearer {KEY[:-1]}",
        f"Bearer {KEY}x",
        "Bearer",
        f"Bearer  x{KEY}",
        f"Token {KEY}",
    ],
)
def test_malformed_authorization_is_refused(keyed_server: LiveServer, authorization: str) -> None:
    response = call(keyed_server, "GET", "/health", Authorization=authorization)
    assert response.status_code == 401
    assert_leaks_nothing(response.text)


def test_bearer_scheme_is_case_insensitive(keyed_server: LiveServer) -> None:
    response = call(keyed_server, "GET", "/health", Authorization=f"bearer {KEY}")
    assert response.status_code == 200


def test_key_in_the_query_string_is_not_accepted(keyed_server: LiveServer) -> None:
    response = call(keyed_server, "GET", f"/health?api_key={KEY}")
    assert response.status_code == 401


def test_key_is_compared_in_constant_time(
    keyed_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, Any]] = []
    real_compare = security.hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        calls.append((a, b))
        return real_compare(a, b)

    monkeypatch.setattr(security.hmac, "compare_digest", spy)
    assert call(keyed_server, "GET", "/health", key=KEY).status_code == 200
    assert call(keyed_server, "GET", "/health", key=WRONG_KEY).status_code == 401
    assert calls == [(KEY.encode(), KEY.encode()), (WRONG_KEY.encode(), KEY.encode())]


# ---- JSON-only bodies --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
     "application/jsonp", "application/json-seq"],
)  # fmt: skip
def test_post_without_json_content_type_is_refused(
    open_server: LiveServer, content_type: str | None
) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    before = list(open_server.echoed_body_sizes)
    with open_server.client(**headers) as client:
        response = client.post("/v1/echo", content=b'{"a": 1}')
    assert_openai_error(response, 415, "unsupported_media_type")
    assert open_server.echoed_body_sizes == before


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_post_with_json_content_type_is_accepted(
    open_server: LiveServer, content_type: str
) -> None:
    with open_server.client(**{"Content-Type": content_type}) as client:
        response = client.post("/v1/echo", content=b'{"a": 1}')
    assert response.status_code == 200
    assert response.json() == {"a": 1}


def test_key_is_checked_before_content_type(keyed_server: LiveServer) -> None:
    with keyed_server.client(**{"Content-Type": "text/plain"}) as client:
        response = client.post("/v1/echo", content=b"{}")
    assert_openai_error(response, 401, "missing_api_key")


# ---- the body cap ------------------------------------------------------------------------------


def json_body_of(size_bytes: int) -> bytes:
    body = b'{"p":"' + b"x" * (size_bytes - 8) + b'"}'
    assert len(body) == size_bytes
    return body


def test_body_at_the_cap_is_accepted(open_server: LiveServer) -> None:
    with open_server.client(**{"Content-Type": "application/json"}) as client:
        response = client.post("/v1/echo", content=json_body_of(CAP_BYTES))
    assert response.status_code == 200
    assert open_server.echoed_body_sizes[-1] == CAP_BYTES


def test_chunked_body_within_the_cap_is_accepted(open_server: LiveServer) -> None:
    body = json_body_of(200_000)
    pieces = (body[i : i + 50_000] for i in range(0, len(body), 50_000))
    with open_server.client(**{"Content-Type": "application/json"}) as client:
        response = client.post("/v1/echo", content=pieces)
    assert response.status_code == 200
    assert open_server.echoed_body_sizes[-1] == len(body)


def test_content_length_over_the_cap_is_refused_unread(open_server: LiveServer) -> None:
    before = list(open_server.echoed_body_sizes)
    # Headers only: a reply that arrives without any body sent proves nothing was read first.
    request = (
        f"POST /v1/echo HTTP/1.1\r\nHost: {open_server.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {CAP_BYTES + 1}\r\n\r\n"
    ).encode()
    status, reply = raw_exchange(open_server, request)
    assert status == 413
    assert_openai_error(reply, 413, "request_too_large")
    assert open_server.echoed_body_sizes == before


def test_refused_request_with_a_large_body_closes_instead_of_draining(
    keyed_server: LiveServer,
) -> None:
    request = (
        f"POST /v1/echo HTTP/1.1\r\nHost: {keyed_server.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {100 * CAP_BYTES}\r\n\r\n"
    ).encode()
    status, reply = raw_exchange(keyed_server, request)  # returns only once the server closes
    assert status == 401
    assert_openai_error(reply, 401, "missing_api_key")


def test_chunked_body_over_the_cap_is_refused(open_server: LiveServer) -> None:
    before = list(open_server.echoed_body_sizes)
    request = (
        f"POST /v1/echo HTTP/1.1\r\nHost: {open_server.host}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    piece = b"x" * 65536
    # Exactly the cap, then one byte more; the final 0-chunk is never sent, so the server
    # must decide from the count alone.
    chunks = (b"10000\r\n" + piece + b"\r\n") * (CAP_BYTES // len(piece)) + b"1\r\nx\r\n"
    status, reply = raw_exchange(open_server, request, body=chunks)
    assert status == 413
    assert_openai_error(reply, 413, "request_too_large")
    assert open_server.echoed_body_sizes == before


def test_app_never_sees_more_than_the_cap() -> None:
    seen: list[bytes] = []

    async def inner_app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message.get("body", b""))
            if not message.get("more_body"):
                break

    incoming: list[Message] = [
        {"type": "http.request", "body": b"x" * 600, "more_body": True},
        {"type": "http.request", "body": b"x" * 600, "more_body": True},
        {"type": "http.request", "body": b"x" * 600, "more_body": False},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = SecurityMiddleware(inner_app, SecurityPolicy(port=1, max_body_bytes=1000))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/echo",
        "headers": [(b"host", b"127.0.0.1:1"), (b"content-type", b"application/json")],
    }
    asyncio.run(middleware(scope, receive, send))
    assert seen == []
    assert sent[0]["status"] == 413


# ---- responses pass through --------------------------------------------------------------------


def read_stream_timed(client: httpx.Client, path: str) -> tuple[list[float], bytes, httpx.Response]:
    started = time.monotonic()
    arrivals: list[float] = []
    received = b""
    with client.stream("GET", path) as response:
        for piece in response.iter_raw():
            arrivals.append(time.monotonic() - started)
            received += piece
    return arrivals, received, response


def assert_streamed_unbuffered(arrivals: list[float], received: bytes) -> None:
    assert received == b"".join(f"chunk {i}\n".encode() for i in range(STREAM_CHUNKS))
    total_pause_s = STREAM_PAUSE_S * (STREAM_CHUNKS - 1)
    assert len(arrivals) >= 3
    assert arrivals[0] < total_pause_s / 2, "the first chunk waited for the whole stream"
    assert arrivals[-1] - arrivals[0] >= total_pause_s * 0.75


def test_streaming_response_is_not_buffered(open_server: LiveServer) -> None:
    with open_server.client() as client:
        arrivals, received, _ = read_stream_timed(client, "/v1/stream")
    assert_streamed_unbuffered(arrivals, received)


def test_streaming_with_key_and_origin_is_not_buffered(keyed_server: LiveServer) -> None:
    with keyed_server.client(Authorization=f"Bearer {KEY}", Origin=ORIGIN) as client:
        arrivals, received, response = read_stream_timed(client, "/v1/stream")
    assert_streamed_unbuffered(arrivals, received)
    assert response.headers["access-control-allow-origin"] == ORIGIN


def test_lifespan_reaches_the_app(open_server: LiveServer) -> None:
    assert open_server.app.state.started is True


def test_websockets_are_refused() -> None:
    app_called = False

    async def inner_app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal app_called
        app_called = True

    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "websocket.connect"}

    async def send(message: Message) -> None:
        sent.append(message)

    middleware = SecurityMiddleware(inner_app, SecurityPolicy(port=1))
    scope = {"type": "websocket", "path": "/ws", "headers": [(b"host", b"127.0.0.1:1")]}
    asyncio.run(middleware(scope, receive, send))
    assert not app_called
    assert sent == [{"type": "websocket.close", "code": 1008}]


# ---- error shape -------------------------------------------------------------------------------


def test_openai_error_shape() -> None:
    response = openai_error(
        503, "Busy.", type_="server_error", code="queue_full", headers={"Retry-After": "1"}
    )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "1"
    assert json.loads(response.body) == {
        "error": {"message": "Busy.", "type": "server_error", "param": None, "code": "queue_full"}
    }
