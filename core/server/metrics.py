"""`GET /metrics`: the API's counters in Prometheus' text format (what llama-server exports).

`ApiMetrics` keeps the counts, fed from three places: `RequestMetricsMiddleware` notes each
HTTP request as its answer ends (by route template and status, refusals by the security
checks included), the served `EngineService` hands over each job's result (a generation's
token counts and speeds, a model load) and its notices (worker crashes and restarts), and the
model pool tells of the models it loads on demand. Queue depth and busy slots are read from
the service when scraped. Route labels are the app's route templates, never the raw path, so
a client cannot grow the label set.

With a `MeterFactory` (the app layer's `SpeedMeter`, autotune/speed_meter.py: core knows
neither the calibration nor the planner), each loaded model gets a speed-of-light gauge: its
limit on this machine, and the last reply's decode speed and share of the limit at that
reply's context, the figure the chat footer and `hearthside bench` show. The `model` label
is the served model's id or an installed model's, so the label set is bounded by the store.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.service import EngineNotice, EngineService
from hearthside.core.server.model_pool import ModelPool, PoolEvent

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNMATCHED_ROUTE = "unmatched"  # a path no route serves (its 404)
NO_STATUS = "none"  # the client left before any answer started

Labels = tuple[tuple[str, str], ...]


class SpeedReading(Protocol):
    """One reply's decode speed against the limit (autotune's SpeedOfLight)."""

    @property
    def measured_tps(self) -> float: ...
    @property
    def limit_tps(self) -> float: ...  # at the reply's context
    @property
    def share(self) -> float: ...


class SpeedLimitLike(Protocol):
    @property
    def limit_tps(self) -> float: ...  # with an empty context


class SpeedGauge(Protocol):
    """Hears a service's results (`observe`) and keeps its model's limit and last reading."""

    def observe(self, result: object) -> None: ...
    @property
    def limit(self) -> SpeedLimitLike | None: ...
    @property
    def last(self) -> SpeedReading | None: ...


MeterFactory = Callable[[], SpeedGauge]


@dataclass(frozen=True)
class _Family:
    name: str
    kind: str  # "counter" | "gauge"
    help: str
    samples: Sequence[tuple[Labels, float]]

    def lines(self) -> list[str]:
        head = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        return head + [
            f"{self.name}{_label_text(labels)} {_value_text(value)}"
            for labels, value in self.samples
        ]


def _label_text(labels: Labels) -> str:
    if not labels:
        return ""
    pairs = ",".join(f'{name}="{_escaped(value)}"' for name, value in labels)
    return "{" + pairs + "}"


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _value_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class ApiMetrics:
    """The counters; every method may be called from any thread."""

    def __init__(self, service: EngineService, meters: MeterFactory | None = None) -> None:
        self._service = service
        self._meters = meters
        self._gauges: dict[str, SpeedGauge] = {}  # by model id, while it is loaded
        self._lock = threading.Lock()
        self._requests: Counter[tuple[str, str]] = Counter()
        self._input_tokens = 0
        self._output_tokens = 0
        self._generations = 0
        self._last_prefill_tok_s = math.nan
        self._last_decode_tok_s = math.nan
        self._model_loads = 0
        self._worker_crashes = 0
        self._worker_restarts = 0

    # ---- what feeds them -------------------------------------------------------------

    def note_request(self, route: str, status: int | None) -> None:
        with self._lock:
            self._requests[(route, NO_STATUS if status is None else str(status))] += 1

    def note_result(self, result: object) -> None:
        """An engine job's result (`EngineService.add_result_listener`)."""
        if isinstance(result, EngineConfig | RemoteConfig):
            self._add_load()
        elif isinstance(result, GenerationResult):
            self._add_generation(result)

    def note_notice(self, notice: EngineNotice) -> None:
        with self._lock:
            if notice.kind == "crashed":
                self._worker_crashes += 1
            elif notice.kind == "restarted":
                self._worker_restarts += 1

    def note_pool_event(self, event: PoolEvent) -> None:
        if event.kind == "loaded":
            self._add_load()
            if event.service is not None:
                self.meter(event.model_id, event.service)
        elif event.kind == "unloaded" and not event.served:
            with self._lock:
                self._gauges.pop(event.model_id, None)

    def meter(self, model_id: str, service: EngineService) -> None:
        """Give `service`'s model a speed-of-light gauge (nothing without a MeterFactory)."""
        if self._meters is None:
            return
        gauge = self._meters()
        service.add_result_listener(gauge.observe)
        if service.loaded_config is not None:  # loaded before the API started
            gauge.observe(service.loaded_config)
        with self._lock:
            self._gauges[model_id] = gauge

    def _add_load(self) -> None:
        with self._lock:
            self._model_loads += 1

    def _add_generation(self, result: GenerationResult) -> None:
        metrics = result.metrics
        with self._lock:
            self._generations += 1
            self._input_tokens += metrics.prompt_tokens
            self._output_tokens += metrics.completion_tokens
            if metrics.prompt_tok_s is not None:
                self._last_prefill_tok_s = metrics.prompt_tok_s
            if metrics.decode_tok_s is not None:
                self._last_decode_tok_s = metrics.decode_tok_s

    # ---- the exposition --------------------------------------------------------------

    def exposition(self) -> str:
        """Every metric in Prometheus' text format (version 0.0.4)."""
        lines: list[str] = []
        for family in self._families():
            lines += family.lines()
        return "\n".join(lines) + "\n"

    def _families(self) -> list[_Family]:
        service = self._service
        with self._lock:
            requests = sorted(self._requests.items())
            counts = (self._input_tokens, self._output_tokens, self._generations)
            speeds = (self._last_prefill_tok_s, self._last_decode_tok_s)
            events = (self._model_loads, self._worker_crashes, self._worker_restarts)
            gauges = sorted(self._gauges.items())
        return [
            _Family(
                "hearthside_requests_total",
                "counter",
                "HTTP requests answered, by route template and status.",
                [((("route", route), ("status", status)), n) for (route, status), n in requests],
            ),
            _counter("hearthside_input_tokens_total", "Prompt tokens read.", counts[0]),
            _counter("hearthside_output_tokens_total", "Tokens generated.", counts[1]),
            _counter("hearthside_generations_total", "Generations finished.", counts[2]),
            _gauge("hearthside_queue_depth", "Jobs waiting for the engine.", service.waiting_jobs),
            _gauge("hearthside_slots_busy", "Engine slots running a job.", service.running_jobs),
            _gauge("hearthside_slots_total", "Engine slots (parallel generations).", service.slots),
            _gauge(
                "hearthside_last_prefill_tokens_per_second",
                "Prompt evaluation speed of the last generation (NaN: none yet).",
                speeds[0],
            ),
            _gauge(
                "hearthside_last_decode_tokens_per_second",
                "Generation speed of the last generation (NaN: none yet).",
                speeds[1],
            ),
            _counter("hearthside_model_loads_total", "Models loaded.", events[0]),
            _counter("hearthside_worker_crashes_total", "Engine worker crashes.", events[1]),
            _counter(
                "hearthside_worker_restarts_total",
                "Engine workers started again after a crash.",
                events[2],
            ),
            *_speed_of_light_families(gauges),
        ]


def _speed_of_light_families(gauges: Sequence[tuple[str, SpeedGauge]]) -> list[_Family]:
    if not gauges:
        return []
    limits = [(model, gauge.limit) for model, gauge in gauges]
    readings = [(model, gauge.last) for model, gauge in gauges]

    def per_model(values: Iterable[tuple[str, float | None]]) -> list[tuple[Labels, float]]:
        return [((("model", model),), math.nan if v is None else v) for model, v in values]

    return [
        _Family(
            "hearthside_speed_limit_tokens_per_second",
            "gauge",
            "This machine's decode limit for the model from an empty context, from its "
            "calibration (NaN: not known yet, or not calibrated).",
            per_model((m, limit.limit_tps if limit else None) for m, limit in limits),
        ),
        _Family(
            "hearthside_speed_of_light_ratio",
            "gauge",
            "The last reply's decode speed as a share of this machine's limit at that "
            "reply's context (0.81: 81%, as the chat footer and bench show; NaN: none yet).",
            per_model((m, reading.share if reading else None) for m, reading in readings),
        ),
        _Family(
            "hearthside_speed_of_light_decode_tokens_per_second",
            "gauge",
            "The last reply's decode speed, the ratio's numerator (NaN: none yet).",
            per_model((m, reading.measured_tps if reading else None) for m, reading in readings),
        ),
        _Family(
            "hearthside_speed_of_light_limit_tokens_per_second",
            "gauge",
            "The limit at the last reply's context, the ratio's denominator (NaN: none yet).",
            per_model((m, reading.limit_tps if reading else None) for m, reading in readings),
        ),
    ]


def _counter(name: str, help_text: str, value: float) -> _Family:
    return _Family(name, "counter", help_text, [((), value)])


def _gauge(name: str, help_text: str, value: float) -> _Family:
    return _Family(name, "gauge", help_text, [((), value)])


# ---- counting requests -------------------------------------------------------------------


class RequestMetricsMiddleware:
    """Notes each HTTP request once its answer has ended (a stream when it ends or its client
    leaves), labelled with the route template it matched."""

    def __init__(self, app: ASGIApp, metrics: ApiMetrics, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # the app's own list: routes added later count too

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def noting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            self.metrics.note_request(route_template(self.routes, scope), status)


def route_template(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """The path template of the route `scope` is for ("/v1/models/{model_id:path}"), whether
    or not it takes the request's method; UNMATCHED_ROUTE when none is."""
    for route in routes:
        match, _ = route.matches(scope)
        if match != Match.NONE:
            return str(getattr(route, "path", UNMATCHED_ROUTE))
    return UNMATCHED_ROUTE


def install_metrics(
    app: FastAPI, service: EngineService, pool: ModelPool, meters: MeterFactory | None = None
) -> ApiMetrics:
    """Add `GET /metrics` and the request counting to `app` (call it last in the factory: the
    counting then sits outside the security checks and sees their refusals too)."""
    metrics = ApiMetrics(service, meters)
    service.add_result_listener(metrics.note_result)
    if not service.is_remote:  # a remote server's machine is not this one
        metrics.meter(pool.served_id, service)
    service.add_listener(metrics.note_notice)
    pool.add_listener(metrics.note_pool_event)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), media_type=PROMETHEUS_CONTENT_TYPE)

    app.add_middleware(RequestMetricsMiddleware, metrics=metrics, routes=app.router.routes)
    return metrics
