"""Starts and stops the API server: in a thread for the window's switch, or in the foreground
for `hearthside serve`."""

from __future__ import annotations

import threading
import time

import uvicorn

from hearthside.core.engine.service import EngineService
from hearthside.core.errors import HearthsideError
from hearthside.core.server.app import RequestCounter, ServerSettings, create_app
from hearthside.core.server.keys import check_bind_is_safe

START_TIMEOUT_S = 10.0
# Requests with more header bytes than this are refused by the HTTP parser.
MAX_HEADER_BYTES = 16 * 1024


class ServerStartError(HearthsideError):
    """The API server could not start (port taken, unsafe bind...)."""


def uvicorn_config(
    settings: ServerSettings, service: EngineService, counter: RequestCounter | None = None
) -> uvicorn.Config:
    check_bind_is_safe(settings.host, settings.api_key)
    return uvicorn.Config(
        create_app(settings, service, counter),
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,  # request lines can carry prompts in query strings; keep them out
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
        timeout_graceful_shutdown=2,
    )


class ServerController:
    """The API on a background thread; `start()` returns once it accepts connections."""

    def __init__(self, settings: ServerSettings, service: EngineService) -> None:
        self.settings = settings
        self._counter = RequestCounter()
        self._server = uvicorn.Server(uvicorn_config(settings, service, self._counter))
        self._thread = threading.Thread(target=self._server.run, name="hearthside-api", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.settings.host}]" if ":" in self.settings.host else self.settings.host
        return f"http://{host}:{self.settings.port}/v1"

    @property
    def requests_served(self) -> int:
        """Requests answered since start (past the Host/key checks; refusals are not counted)."""
        return self._counter.count

    @property
    def running(self) -> bool:
        return self._thread.is_alive() and self._server.started

    def start(self) -> None:
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self._server.should_exit = True
                raise ServerStartError(
                    f"The API could not start on port {self.settings.port}.",
                    hint="Another program may be using that port; choose another with --port.",
                )
            time.sleep(0.02)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def serve_foreground(settings: ServerSettings, service: EngineService) -> None:
    """Run until Ctrl-C (uvicorn handles the signal and shuts down cleanly)."""
    uvicorn.Server(uvicorn_config(settings, service)).run()
