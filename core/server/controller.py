"""Starts and stops the API server: in a thread for the window's switch, or in the foreground
for `hearthside serve`."""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable
from types import FrameType

import uvicorn

from hearthside.core.engine.service import EngineService
from hearthside.core.errors import HearthsideError
from hearthside.core.server.app import RequestCounter, ServerSettings, create_app
from hearthside.core.server.http_protocol import HttpLimits, protocol_with
from hearthside.core.server.keys import check_bind_is_safe
from hearthside.core.server.metrics import MeterFactory
from hearthside.core.server.model_pool import ModelPool, OnDemandModels, PoolEvent
from hearthside.core.server.request_log import RequestListener, RequestLog, RequestLogMiddleware

START_TIMEOUT_S = 10.0
# Requests with more header bytes than this are refused (431) by the HTTP protocol.
MAX_HEADER_BYTES = HttpLimits().max_header_bytes


class ServerStartError(HearthsideError):
    """The API server could not start (port taken, unsafe bind...)."""


class BindAddressError(ServerStartError):
    """The address to listen on is one the API cannot, or should not, bind."""


def check_bind_address(host: str) -> None:
    """Refuse IPv4 addresses written as IPv6 (`::ffff:127.0.0.1`): the server's IPv6 socket is
    IPv6-only, so binding one fails with a bare `[Errno 22]` after the model has loaded."""
    try:
        address = ipaddress.ip_address(host.strip().removeprefix("[").removesuffix("]"))
    except ValueError:
        return
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        raise BindAddressError(
            f"The API cannot listen on {host}: it is the IPv4 address "
            f"{address.ipv4_mapped} written in IPv6 form.",
            hint=f"Use --host {address.ipv4_mapped} instead.",
        )


def model_pool(
    settings: ServerSettings, service: EngineService, on_demand: OnDemandModels | None
) -> ModelPool:
    """The models the API answers for: `service`'s, and (with `on_demand`) any installed one."""
    return ModelPool(
        service,
        settings.model_id,
        on_demand,
        max_loaded=settings.max_on_demand_models,
        created_s=settings.created_at,
        idle_unload_s=settings.idle_unload_s,
        unload_served_when_idle=settings.unload_served_when_idle,
    )


def uvicorn_config(
    settings: ServerSettings,
    service: EngineService,
    counter: RequestCounter | None = None,
    limits: HttpLimits | None = None,
    pool: ModelPool | None = None,
    request_log: RequestLog | None = None,
    meters: MeterFactory | None = None,
) -> uvicorn.Config:
    check_bind_address(settings.host)
    check_bind_is_safe(settings.host, settings.api_key)
    limits = limits or HttpLimits()
    app = create_app(settings, service, counter, pool, meters)
    if request_log is not None:  # outermost: refusals by the security checks are logged too
        app.add_middleware(RequestLogMiddleware, log=request_log)
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        http=protocol_with(limits),
        log_level="warning",
        access_log=False,  # request lines can carry prompts in query strings; keep them out
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=limits.keep_alive_s,
        timeout_graceful_shutdown=2,
    )


class ServerController:
    """The API on a background thread; `start()` returns once it accepts connections."""

    def __init__(
        self,
        settings: ServerSettings,
        service: EngineService,
        limits: HttpLimits | None = None,
        on_demand: OnDemandModels | None = None,
        on_request: RequestListener | None = None,
        meters: MeterFactory | None = None,
    ) -> None:
        """`on_request` hears each finished request (`request_log`) on the server's thread;
        `meters` makes each loaded model's speed-of-light gauge for /metrics."""
        self.settings = settings
        self._counter = RequestCounter()
        self.request_log = RequestLog(on_request)
        self.pool = model_pool(settings, service, on_demand)
        config = uvicorn_config(
            settings, service, self._counter, limits, self.pool, self.request_log, meters
        )
        self._server = uvicorn.Server(config)
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
        self.pool.stop()


class _StoppingServer(uvicorn.Server):
    """uvicorn's server; on Ctrl-C or SIGTERM it also stops the pool at once (requests waiting
    for a load are answered, so uvicorn's shutdown does not wait for them) and tells
    `on_signal`."""

    def __init__(
        self, config: uvicorn.Config, pool: ModelPool, on_signal: Callable[[int], None]
    ) -> None:
        super().__init__(config)
        self._pool = pool
        self._on_signal = on_signal

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        threading.Thread(target=self._pool.stop, name="stop-pool", daemon=True).start()
        self._on_signal(sig)


def serve_foreground(
    settings: ServerSettings,
    service: EngineService,
    on_demand: OnDemandModels | None = None,
    on_signal: Callable[[int], None] = lambda _sig: None,
    on_pool_event: Callable[[PoolEvent], None] | None = None,
    meters: MeterFactory | None = None,
) -> None:
    """Run until Ctrl-C or SIGTERM (uvicorn handles the signal and shuts down cleanly);
    `on_signal` hears each one, in the signal handler (it must not block); `on_pool_event`
    hears each model loaded or unloaded on the pool's threads."""
    pool = model_pool(settings, service, on_demand)
    if on_pool_event is not None:
        pool.add_listener(on_pool_event)
    try:
        config = uvicorn_config(settings, service, pool=pool, meters=meters)
        _StoppingServer(config, pool, on_signal).run()
    finally:
        pool.stop()
