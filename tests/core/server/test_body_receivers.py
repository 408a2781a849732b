"""Issue 36 item 5: slow request bodies cannot hold the server's memory.

Six hundred authenticated connections, each sending a 1 MiB body slowly, once held 407 MB.
Now at most `max_receiving_bodies` connections receive a body at once; the next one gets a 503
with Retry-After at once. The real server (uvicorn in a thread) on loopback, raw sockets.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import pytest

from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from hearthside.core.server.http_protocol import HttpLimits

KEY = "bodies-key-" + "b" * 30
LIMITS = HttpLimits(header_timeout_s=2.0, body_timeout_s=3.0, max_receiving_bodies=4)
BODY_BYTES = 1 << 20
WAIT_S = 5.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def server() -> Iterator[ServerController]:
    with EngineService() as service:  # no model: the refusals need none
        controller = ServerController(
            ServerSettings(port=free_port(), api_key=KEY), service, LIMITS
        )
        controller.start()
        yield controller
        controller.stop()


def post_head(port: int, content_length: int) -> bytes:
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {KEY}",
        "Content-Type: application/json",
        f"Content-Length: {content_length}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def start_slow_body(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
    conn.sendall(post_head(port, BODY_BYTES) + b" " * 4096)  # the rest never comes
    return conn


def read_until_closed(conn: socket.socket) -> bytes:
    reply = b""
    while chunk := conn.recv(65536):
        reply += chunk
    return reply


def still_open(conn: socket.socket) -> bool:
    conn.setblocking(False)
    try:
        conn.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True  # nothing sent, not closed: the server only answers right before closing
    except ConnectionResetError:
        return False
    finally:
        conn.setblocking(True)
    return False


def status_headers_error(reply: bytes) -> tuple[int, bytes, dict[str, object]]:
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split()[1]), head.lower(), json.loads(body).get("error") or {}


def test_past_the_limit_a_new_body_gets_503_at_once(server: ServerController) -> None:
    port = server.settings.port
    slow = [start_slow_body(port) for _ in range(LIMITS.max_receiving_bodies)]
    try:
        time.sleep(0.3)  # the server has read every head
        started = time.monotonic()
        with start_slow_body(port) as one_too_many:
            reply = read_until_closed(one_too_many)
        took_s = time.monotonic() - started
        status, head, error = status_headers_error(reply)
        assert status == 503 and took_s < 1.0
        assert b"retry-after: 1" in head
        assert error["code"] == "server_busy"
        assert error["type"] == "server_error"
        assert f"already receiving {LIMITS.max_receiving_bodies} request bodies" in str(
            error["message"]
        )
        assert all(still_open(conn) for conn in slow)  # those already receiving carry on
    finally:
        for conn in slow:
            conn.close()


def test_a_finished_or_abandoned_body_frees_its_place(server: ServerController) -> None:
    port = server.settings.port
    for _round in range(3):  # more bodies in all than the limit, never more at once
        slow = [start_slow_body(port) for _ in range(LIMITS.max_receiving_bodies)]
        time.sleep(0.2)
        for conn in slow:
            conn.close()
        time.sleep(0.2)
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as conn:
        conn.sendall(post_head(port, len(body)))
        time.sleep(0.2)  # head and body apart: this request does receive a body
        conn.sendall(body)
        reply = read_until_closed(conn)
    _, _, error = status_headers_error(reply)
    assert error.get("code") != "server_busy"
