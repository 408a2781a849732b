"""HTTP framing and timeouts of the real API server (ServerController: uvicorn in a thread) on
loopback, driven by raw sockets for what well-behaved clients never send, and httpx.

A client that sends its head a byte at a time, nothing at all, or a body shorter than its
Content-Length is cut off after a bounded time; heads over 16 KB and bodies framed two ways are
refused; a flood of slow connections never locks a normal request out.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import BindAddressError, ServerController
from hearthside.core.server.http_protocol import HttpLimits

KEY = "framing-key-" + "f" * 30
SHORT = HttpLimits(header_timeout_s=1.0, body_timeout_s=1.0, max_waiting_connections=64)
SLOW_CLIENTS = 300
REPLY_WAIT_S = 5.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def service() -> Iterator[EngineService]:
    with EngineService() as running:  # no model: /health and the refusals need none
        yield running


def start(service: EngineService, limits: HttpLimits | None) -> ServerController:
    controller = ServerController(ServerSettings(port=free_port(), api_key=KEY), service, limits)
    controller.start()
    return controller


@pytest.fixture(scope="module")
def server(service: EngineService) -> Iterator[ServerController]:
    controller = start(service, SHORT)
    yield controller
    controller.stop()


def head(port: int, *extra: str, method: str = "GET", path: str = "/health") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Authorization: Bearer {KEY}"]
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def connect(port: int, wait_s: float = REPLY_WAIT_S) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=wait_s)


def read_until_closed(conn: socket.socket) -> bytes:
    reply = b""
    while chunk := conn.recv(65536):
        reply += chunk
    return reply


def status_and_error(reply: bytes) -> tuple[int, dict[str, object]]:
    status_line, _, rest = reply.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), json.loads(body)["error"]


def health_works(controller: ServerController) -> bool:
    headers = {"Authorization": f"Bearer {KEY}"}
    base = controller.url.removesuffix("/v1")
    return httpx.get(f"{base}/health", headers=headers, timeout=REPLY_WAIT_S).status_code == 200


def exchange(port: int, request: bytes, wait_s: float = REPLY_WAIT_S) -> tuple[float, bytes]:
    """Send `request`, read until the server closes; the seconds that took and the reply."""
    with connect(port, wait_s) as conn:
        started = time.monotonic()
        conn.sendall(request)
        reply = read_until_closed(conn)
        return time.monotonic() - started, reply


# ---- header size ---------------------------------------------------------------------------


def test_an_8_kb_header_is_accepted(server: ServerController) -> None:
    port = server.settings.port
    _, reply = exchange(port, head(port, "X-Pad: " + "a" * 8192, "Connection: close"))
    assert reply.startswith(b"HTTP/1.1 200 ")


def test_a_20_kb_header_is_refused(server: ServerController) -> None:
    port = server.settings.port
    _, reply = exchange(port, head(port, "X-Pad: " + "a" * 20_000))
    status, error = status_and_error(reply)
    assert status == 431
    assert error["code"] == "headers_too_large"
    assert "larger than 16384 bytes" in str(error["message"])
    assert health_works(server)


def test_a_20_kb_header_sent_in_pieces_is_refused(server: ServerController) -> None:
    port = server.settings.port
    request = head(port, "X-Pad: " + "a" * 20_000)
    with connect(port) as conn:
        try:
            for start_at in range(0, len(request), 4096):
                conn.sendall(request[start_at : start_at + 4096])
                time.sleep(0.01)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the rest was sent
        reply = read_until_closed(conn)
    assert status_and_error(reply)[0] == 431


def test_many_small_headers_over_16_kb_are_refused(server: ServerController) -> None:
    port = server.settings.port
    _, reply = exchange(port, head(port, *(f"X-Pad-{i}: {'b' * 90}" for i in range(200))))
    assert status_and_error(reply)[0] == 431


# ---- framing -------------------------------------------------------------------------------


def test_content_length_with_chunked_encoding_is_refused_at_once(
    server: ServerController,
) -> None:
    port = server.settings.port
    framing = ("Content-Type: application/json", "Content-Length: 2", "Transfer-Encoding: chunked")
    request = head(port, *framing, method="POST", path="/v1/chat/completions")
    took_s, reply = exchange(port, request + b"{}")
    status, error = status_and_error(reply)
    assert status == 400
    assert error["code"] == "ambiguous_body_length"
    assert "Send only one of them" in str(error["message"])
    assert took_s < SHORT.body_timeout_s  # refused on sight, not after waiting for a body
    assert health_works(server)


# ---- timeouts ------------------------------------------------------------------------------


def test_a_connection_that_sends_nothing_is_closed(server: ServerController) -> None:
    took_s, reply = exchange(server.settings.port, b"")
    assert reply == b""
    assert SHORT.header_timeout_s * 0.8 <= took_s < SHORT.header_timeout_s + 2


def test_a_head_sent_a_byte_at_a_time_is_cut_off_with_408(server: ServerController) -> None:
    port = server.settings.port
    request = head(port)
    with connect(port) as conn:
        started = time.monotonic()
        try:
            for byte in request[:-4]:  # never finishes the head
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass
        reply = read_until_closed(conn)
        took_s = time.monotonic() - started
    status, error = status_and_error(reply)
    assert status == 408
    assert "headers did not arrive within 1 s" in str(error["message"])
    assert took_s < SHORT.header_timeout_s + 2


def test_a_slow_head_on_a_kept_alive_connection_is_cut_off(server: ServerController) -> None:
    port = server.settings.port
    with connect(port) as conn:
        conn.sendall(head(port))
        first = conn.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        conn.sendall(b"GET /health HTTP/1.1\r\nHo")  # the next request, never finished
        reply = read_until_closed(conn)
        took_s = time.monotonic() - started
    assert status_and_error(reply)[0] == 408
    assert took_s < SHORT.header_timeout_s + 2  # well before uvicorn's 5 s keep-alive


def test_a_body_shorter_than_its_content_length_gets_408(server: ServerController) -> None:
    port = server.settings.port
    request = head(port, "Content-Type: application/json", "Content-Length: 100",
                   method="POST", path="/v1/chat/completions")  # fmt: skip
    took_s, reply = exchange(port, request + b'{"model":')
    status, error = status_and_error(reply)
    assert status == 408
    assert "shorter than its Content-Length" in str(error["message"])
    assert took_s < SHORT.body_timeout_s + 2
    assert health_works(server)


@pytest.mark.slow
def test_three_hundred_slow_connections_do_not_lock_others_out(server: ServerController) -> None:
    port = server.settings.port
    slow = [connect(port) for _ in range(SLOW_CLIENTS)]
    try:
        for conn in slow:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1")  # a head never finished
        started = time.monotonic()
        assert health_works(server)
        assert time.monotonic() - started < 2.0
        time.sleep(0.2)
        assert count_open(slow) <= SHORT.max_waiting_connections
        time.sleep(SHORT.header_timeout_s + 1)
        assert count_open(slow) == 0
        assert health_works(server)
    finally:
        for conn in slow:
            conn.close()


def count_open(connections: list[socket.socket]) -> int:
    """How many the server has not closed: a peek that would block means nothing came (the
    server only ever sends a refusal right before it closes)."""
    still_open = 0
    for conn in connections:
        conn.setblocking(False)
        try:
            conn.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            still_open += 1
        except ConnectionResetError:
            pass
    return still_open


@pytest.mark.slow
def test_the_real_limits_cut_off_a_slow_head(service: EngineService) -> None:
    """The defaults `hearthside serve` and the window use, not the short ones above."""
    controller = start(service, None)
    try:
        port = controller.settings.port
        limit_s = HttpLimits().header_timeout_s
        partial = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1"
        took_s, reply = exchange(port, partial, wait_s=limit_s + 5)
        assert status_and_error(reply)[0] == 408
        assert took_s < limit_s + 2
        assert health_works(controller)
    finally:
        controller.stop()


# ---- the bind address ----------------------------------------------------------------------


@pytest.mark.parametrize("host", ["::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::ffff:10.0.0.5"])
def test_an_ipv4_mapped_bind_is_refused_with_the_address_to_use(
    service: EngineService, host: str
) -> None:
    with pytest.raises(BindAddressError) as refused:
        ServerController(ServerSettings(host=host, port=free_port(), api_key=KEY), service)
    ipv4 = host.rsplit(":", 1)[1].rstrip("]")
    assert "written in IPv6 form" in refused.value.message
    assert refused.value.hint == f"Use --host {ipv4} instead."


# ---- the Host allowlist ----------------------------------------------------------------------


def test_a_foreign_host_is_told_how_to_allow_it(server: ServerController) -> None:
    base = server.url.removesuffix("/v1")
    headers = {"Host": "studio.local", "Authorization": f"Bearer {KEY}"}
    refused = httpx.get(f"{base}/health", headers=headers, timeout=REPLY_WAIT_S)
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "host_not_allowed"
    port = server.settings.port
    assert f"127.0.0.1:{port}, localhost:{port}, [::1]:{port}" in error["message"]
    assert "`hearthside serve --lan-host NAME`" in error["message"]
    assert "studio.local" not in error["message"]  # nothing the client sent is echoed
