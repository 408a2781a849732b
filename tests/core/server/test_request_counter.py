"""The controller's live request count (the window's API switch shows it), over real HTTP."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

KEY = "counter-key-" + "c" * 30
COUNT_DEADLINE_S = 5.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture()
def controller() -> Iterator[ServerController]:
    service = EngineService().start()  # no model: these routes don't need one
    running = ServerController(ServerSettings(port=free_port(), api_key=KEY), service)
    running.start()
    yield running
    running.stop()
    service.stop()


def wait_for_count(controller: ServerController, expected: int) -> int:
    """The count once it reaches `expected` (it moves just after the client has its answer)."""
    deadline = time.monotonic() + COUNT_DEADLINE_S
    while controller.requests_served < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return controller.requests_served


def test_answered_requests_are_counted_and_refused_ones_are_not(
    controller: ServerController,
) -> None:
    assert controller.requests_served == 0
    base = controller.url.removesuffix("/v1")
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}) as client:
        assert client.get("/health").status_code == 200
        assert wait_for_count(controller, 1) == 1
        assert client.get("/v1/models").status_code == 200
        no_model = client.post("/v1/chat/completions", json={"messages": []})
        assert no_model.status_code >= 400  # an error answer is still an answer
        assert wait_for_count(controller, 3) == 3
    with httpx.Client(base_url=base, headers={"Authorization": "Bearer wrong"}) as stranger:
        assert stranger.get("/health").status_code == 401
    time.sleep(0.2)
    assert controller.requests_served == 3


def test_each_controller_counts_from_zero(controller: ServerController) -> None:
    base = controller.url.removesuffix("/v1")
    httpx.get(f"{base}/health", headers={"Authorization": f"Bearer {KEY}"})
    assert wait_for_count(controller, 1) == 1
    service = EngineService().start()
    fresh = ServerController(ServerSettings(port=free_port(), api_key=KEY), service)
    try:
        assert fresh.requests_served == 0
    finally:
        service.stop()
