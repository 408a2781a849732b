"""`create_app(settings, service)`: the OpenAI-compatible API over the shared EngineService.

No module globals: everything a route needs comes from the factory's arguments. Every request
becomes a job in the same bounded queue the chat window uses, so a request never pre-empts
another's generation, a full queue answers 503 at once, and a client that goes away cancels
its own job within one token.

When the service holds a `RemoteEngine`, the API is a proxy: chat, completion and embedding
requests go to the remote server as they came (tools and response_format included), through
the same queue, and its answers come back with this server's model name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from hearthside.core.engine.config import EngineConfigError, SamplingParams
from hearthside.core.engine.engine import ChatMessage, GenerationResult
from hearthside.core.engine.grammar_limits import GrammarError
from hearthside.core.engine.grammar_sampling import GrammarTooSlowError
from hearthside.core.engine.logprobs import LogprobsCallback, TokenLogprob
from hearthside.core.engine.remote import RemoteEngine, RemoteServerError
from hearthside.core.engine.service import (
    EngineService,
    EngineStoppedError,
    Job,
    LoadedEngine,
    LocalEngine,
)
from hearthside.core.engine.worker_engine import EngineUnresponsiveError
from hearthside.core.errors import (
    ContextOverflowError,
    EngineCrashedError,
    EngineError,
    HearthsideError,
    JobCancelledError,
    QueueFullError,
    TemplateError,
)
from hearthside.core.server import choices, structured, validation
from hearthside.core.server.content_parts import check_text_only
from hearthside.core.server.generation_limit import StructuredTimeLimit, run_within
from hearthside.core.server.logprob_format import (
    StreamedLogprobs,
    chat_logprobs,
    completion_logprobs,
)
from hearthside.core.server.metrics import MeterFactory, install_metrics
from hearthside.core.server.model_load import ModelLoadHeaders, model_for_request
from hearthside.core.server.model_pool import DEFAULT_MAX_LOADED, ModelNotFoundError, ModelPool
from hearthside.core.server.request_errors import InvalidRequestError
from hearthside.core.server.schema_converter import UnenforceableSchemaError
from hearthside.core.server.schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    EmbeddingRequest,
)
from hearthside.core.server.security import SecurityMiddleware, SecurityPolicy, openai_error

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context_full": "length"}
DISCONNECT_POLL_S = 0.1
ENGINE_RESTART_RETRY_AFTER_S = 5  # a frozen engine is killed and started again meanwhile
T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    extra_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1 << 20
    max_tokens_cap: int = 4096
    model_id: str = "default"
    created_at: int = field(default_factory=lambda: int(time.time()))
    # installed models loaded on demand beside `model_id`'s, least recently used unloaded first
    max_on_demand_models: int = DEFAULT_MAX_LOADED
    # unload a model no request has used for this long (None: never); `model_id`'s own model
    # too only with `unload_served_when_idle` (`hearthside serve`; the window's stays)
    idle_unload_s: float | None = None
    unload_served_when_idle: bool = False
    # how long a generation under a grammar (JSON schema, tools) may run (issue 36)
    structured_time_limit: StructuredTimeLimit = field(default_factory=StructuredTimeLimit)

    def security_policy(self) -> SecurityPolicy:
        return SecurityPolicy(
            port=self.port,
            api_key=self.api_key,
            extra_hosts=self.extra_hosts,
            cors_origins=self.cors_origins,
            max_body_bytes=self.max_body_bytes,
        )


class ClientGone(Exception):
    """The client closed the connection before its reply was ready."""


class RequestCounter:
    """How many HTTP requests the API has finished answering; read from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    def add_one(self) -> None:
        with self._lock:
            self._count += 1


class _CountingMiddleware:
    """Counts requests that passed the security checks, once their answer is over (a stream
    counts when it ends or its client leaves)."""

    def __init__(self, app: ASGIApp, counter: RequestCounter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self.counter.add_one()


def create_app(
    settings: ServerSettings,
    service: EngineService,
    counter: RequestCounter | None = None,
    pool: ModelPool | None = None,
    meters: MeterFactory | None = None,
) -> FastAPI:
    """Without `pool`, requests may name only `service`'s model (or "default"); with
    `meters`, /metrics has a speed-of-light gauge per loaded model."""
    app = FastAPI(title="Hearthside local API", version="1", docs_url=None, redoc_url=None)
    pool = pool or ModelPool(service, settings.model_id, created_s=settings.created_at)
    app.state.model_pool = pool  # routes in other modules pick their engine with it too
    _add_error_handlers(app)
    _add_routes(app, settings, service, pool)
    # Imported here, not at the top: the Anthropic routes build on this module.
    from hearthside.core.server.anthropic import add_anthropic_routes

    add_anthropic_routes(app, settings, service, pool)
    app.add_middleware(ModelLoadHeaders)
    if counter is not None:  # added first, so it sits inside the security checks
        app.add_middleware(_CountingMiddleware, counter=counter)
    app.add_middleware(SecurityMiddleware, policy=settings.security_policy())
    install_metrics(app, service, pool, meters)  # last: its request counts see the refusals too
    return app


# ---- errors ----------------------------------------------------------------------------------


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        message = f"{where}: {first.get('msg', 'invalid value')}" if where else "Invalid request."
        return openai_error(400, message, type_="invalid_request_error", param=where or None)

    @app.exception_handler(HearthsideError)
    async def hearthside_error(_request: Request, exc: HearthsideError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _routing_error(app, request, exc)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        return openai_error(500, "Internal error in Hearthside.", type_="server_error")


def _routing_error(app: FastAPI, request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Starlette's own refusals (no such route, a method the route does not take) in OpenAI's
    shape rather than FastAPI's {"detail": ...}; the URL sent is not repeated back."""
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        routes = sorted(
            f"{method} {route.path_format}"
            for route in app.routes
            if isinstance(route, APIRoute)
            for method in (route.methods or set()) - {"HEAD"}
        )
        message = f"Hearthside has no route at this URL. It serves: {', '.join(routes)}."
        return openai_error(404, message, type_="invalid_request_error", code="not_found")
    if exc.status_code == 405:
        allowed = headers.get("Allow", "")
        message = f"This URL does not take {request.method} requests; it takes {allowed}."
        return openai_error(
            405, message, type_="invalid_request_error", code="method_not_allowed", headers=headers
        )
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return openai_error(exc.status_code, str(exc.detail), type_=kind, headers=headers)


def error_response(exc: HearthsideError) -> JSONResponse:
    if isinstance(exc, QueueFullError):
        return openai_error(
            503,
            exc.message,
            type_="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, InvalidRequestError):
        return openai_error(
            400, exc.message, type_="invalid_request_error", code=exc.code, param=exc.param
        )
    if isinstance(exc, ModelNotFoundError):  # the openai SDK raises NotFoundError for it
        return openai_error(
            404, exc.message, type_="invalid_request_error", code="model_not_found", param="model"
        )
    if isinstance(exc, ContextOverflowError):
        return openai_error(
            400,
            context_length_message(exc),
            type_="invalid_request_error",
            code="context_length_exceeded",
        )
    if isinstance(exc, UnenforceableSchemaError):
        return openai_error(400, exc.message, type_="invalid_request_error", code=exc.code)
    if isinstance(exc, GrammarTooSlowError):  # the schema, not the server: no retry helps
        return openai_error(
            400,
            exc.user_text().replace("\n", " "),  # what to do, too
            type_="invalid_request_error",
            code="structured_output_too_slow",
        )
    if isinstance(exc, EngineConfigError | structured.StructuredOutputError | GrammarError):
        return openai_error(400, exc.message, type_="invalid_request_error")
    if isinstance(exc, validation.InvalidReplyError):  # 422: SDKs retry a 5xx unasked
        return openai_error(
            422, exc.message, type_="invalid_request_error", code="structured_output_failed"
        )
    if isinstance(exc, TemplateError):  # this conversation, through this model's template
        return openai_error(
            400,
            exc.user_text().replace("\n", " "),
            type_="invalid_request_error",
            code="chat_template_error",
        )
    if isinstance(exc, JobCancelledError):
        return openai_error(499, exc.message, type_="invalid_request_error", code="cancelled")
    if isinstance(exc, EngineUnresponsiveError | EngineStoppedError):  # it is being restarted
        return openai_error(
            503,
            exc.message,
            type_="server_error",
            code="engine_unavailable",
            headers={"Retry-After": str(ENGINE_RESTART_RETRY_AFTER_S)},
        )
    if isinstance(exc, EngineCrashedError):  # the service restarts it; the next request is served
        return openai_error(500, exc.message, type_="server_error", code="engine_crashed")
    if isinstance(exc, RemoteServerError):
        status = exc.client_status
        kind = "invalid_request_error" if status < 500 else "server_error"
        return openai_error(status, exc.message, type_=kind, code="upstream_error")
    return openai_error(500, exc.message, type_="server_error")


def context_length_message(exc: ContextOverflowError) -> str:
    """OpenAI's wording, which clients match (LiteLLM: "maximum context length") to tell a
    prompt that is too long from other 400s."""
    if exc.context_tokens is None or exc.prompt_tokens is None:
        return f"This model's maximum context length was exceeded: {exc.message}"
    if exc.completion_tokens:
        asked = exc.prompt_tokens + exc.completion_tokens
        why = (
            f"However, you requested {asked} tokens ({exc.prompt_tokens} in the messages, "
            f"{exc.completion_tokens} in the completion). Please reduce the length of the "
            "messages or completion"
        )
    else:
        why = (
            f"However, your messages resulted in {exc.prompt_tokens} tokens. Please reduce the "
            "length of the messages"
        )
    return (
        f"This model's maximum context length is {exc.context_tokens} tokens. {why}, "
        "or load the model with a larger context."
    )


# ---- routes ----------------------------------------------------------------------------------


def _add_routes(
    app: FastAPI, settings: ServerSettings, service: EngineService, pool: ModelPool
) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": settings.model_id}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": await run_in_threadpool(pool.cards)}

    @app.get("/v1/models/{model_id:path}")  # ids may hold "/" (llama-server's do)
    async def get_model(model_id: str) -> dict[str, Any]:
        return await run_in_threadpool(pool.card, model_id)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        if service.is_remote:
            _sampling(body, settings)  # the same limits as for a local model
            relay = _Relay("chat/completions", _as_sent(body), body.stream, settings.model_id)
            return await relay.respond(request, service)
        # Off the event loop: loading a model on demand, or a large (bounded) schema.
        model = await model_for_request(pool, body.model, request)
        with model:  # held, never unloaded, until its jobs are queued (answered, if whole)
            named = replace(settings, model_id=model.id)
            plan = await run_in_threadpool(_chat_plan, body, named)
            plans = _choice_plans(plan, body.n)
            stream, usage = body.stream, body.include_usage()
            return await _respond(plans, stream, usage, request, model.service, named)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if service.is_remote:
            _sampling(body, settings)
            relay = _Relay("completions", _as_sent(body), body.stream, settings.model_id)
            return await relay.respond(request, service)
        model = await model_for_request(pool, body.model, request)
        with model:  # held, never unloaded, until its jobs are queued (answered, if whole)
            named = replace(settings, model_id=model.id)
            plans = _completion_plans(body, named)
            stream, usage = body.stream, body.include_usage()
            return await _respond(plans, stream, usage, request, model.service, named)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
        if service.is_remote:
            relay = _Relay("embeddings", _as_sent(body), False, settings.model_id)
            return await relay.respond(request, service)
        return openai_error(
            400,
            "The loaded model is a text generator and does not provide embeddings.",
            type_="invalid_request_error",
            code="embeddings_unsupported",
        )

    # Imported here, not at the top: the Responses route builds on this module.
    from hearthside.core.server.responses import add_responses_routes

    add_responses_routes(app, settings, service, pool)


# ---- turning a request into engine work ------------------------------------------------------


@dataclass(frozen=True)
class GenerationPlan:
    """One request, ready to run on the engine thread."""

    kind: str  # "chat.completion" | "text_completion"
    messages: tuple[ChatMessage, ...] | None
    prompt: str | None
    sampling: SamplingParams
    tools: tuple[structured.ToolSpec, ...] = ()
    prompt_tokens: tuple[int, ...] | None = None  # a completions prompt sent as token ids
    prompt_index: int = 0  # which of the request's prompts this choice answers
    check: validation.ReplyCheck | None = None  # the schema a JSON reply or tool call follows
    on_logprobs: LogprobsCallback | None = None  # streaming: logprob entries, ahead of text
    time_limit_s: float | None = None  # wall-clock seconds on the engine (StructuredTimeLimit)

    def run(
        self, engine: LocalEngine, cancel: Any, on_text: Callable[[str], None] | None
    ) -> GenerationResult:
        if self.time_limit_s is None:
            return self._run(engine, cancel, on_text)
        return run_within(
            self.time_limit_s, cancel, lambda within: self._run(engine, within, on_text)
        )

    def _run(
        self, engine: LocalEngine, cancel: Any, on_text: Callable[[str], None] | None
    ) -> GenerationResult:
        if self.messages is not None and self.check is not None:
            messages = self.messages
            # Streamed logprobs only where the text streams live too (not held back to check).
            on_logprobs = self.on_logprobs if self.check.grammar_enforces_all else None

            def generate(sampling: SamplingParams, sink: Any) -> GenerationResult:
                return engine.chat(
                    messages, sampling, on_text=sink, cancel=cancel, on_logprobs=on_logprobs
                )

            return validation.generate_checked(generate, self.sampling, self.check, on_text)
        if self.messages is not None:
            return engine.chat(
                self.messages,
                self.sampling,
                on_text=on_text,
                cancel=cancel,
                on_logprobs=self.on_logprobs,
            )
        if self.prompt_tokens is None:
            tokens = engine.tokenize(self.prompt or "", add_bos=True)
        else:
            choices.check_token_ids(self.prompt_tokens, engine.n_vocab)
            tokens = list(self.prompt_tokens)
        return engine.generate(
            tokens, self.sampling, on_text=on_text, cancel=cancel, on_logprobs=self.on_logprobs
        )


# What a request that sets no sampling field gets: llama.cpp's defaults, as llama-server
# applies them. The openai SDK and LangChain send no temperature at all; sampling from the raw
# distribution (temperature 1, no top-k/top-p/min-p) made small models ramble.
LLAMA_CPP_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


def _or_default(value: float | None, default: float) -> float:
    return default if value is None else value


def _sampling(
    body: ChatCompletionRequest | CompletionRequest, settings: ServerSettings
) -> SamplingParams:
    max_tokens = body.requested_max_tokens()
    if max_tokens is not None and max_tokens > settings.max_tokens_cap:
        raise EngineConfigError(f"max_tokens may be at most {settings.max_tokens_cap}.")
    return SamplingParams(
        temperature=_or_default(body.temperature, LLAMA_CPP_SAMPLING["temperature"]),
        top_p=_or_default(body.top_p, LLAMA_CPP_SAMPLING["top_p"]),
        top_k=int(_or_default(body.top_k, LLAMA_CPP_SAMPLING["top_k"])),
        min_p=_or_default(body.min_p, LLAMA_CPP_SAMPLING["min_p"]),
        presence_penalty=body.presence_penalty,
        frequency_penalty=body.frequency_penalty,
        max_tokens=max_tokens,
        default_max_tokens=settings.max_tokens_cap,  # a client that asks for no limit
        stop=body.stop_sequences(),
        seed=body.seed,
        logprobs=body.logprob_count(),
    )


def _chat_plan(body: ChatCompletionRequest, settings: ServerSettings) -> GenerationPlan:
    check_text_only(body.messages, settings.model_id)
    sampling = _sampling(body, settings)
    messages = [_engine_message(message) for message in body.messages]
    tools = structured.parse_tools(body.tools)
    parallel = structured.allows_parallel_calls(body.tool_choice, body.parallel_tool_calls)
    grammar = (
        structured.grammar_for_tools(tools, body.tool_choice, parallel=parallel) if tools else None
    )
    if grammar is not None:
        messages.insert(0, ChatMessage("system", structured.tool_prompt(tools, parallel=parallel)))
        check: validation.ReplyCheck | None = validation.check_for_tools(tools)
    else:
        tools = ()
        grammar = structured.grammar_for_response_format(body.response_format)
        check = validation.check_for_response_format(body.response_format)
    sampling = replace(sampling, grammar=grammar)
    return GenerationPlan(
        kind="chat.completion",
        messages=tuple(messages),
        prompt=None,
        sampling=sampling,
        tools=tools,
        check=check,
        time_limit_s=settings.structured_time_limit.seconds_for(sampling),
    )


def _engine_message(message: ChatMessageIn) -> ChatMessage:
    if message.role == "tool":
        return ChatMessage("user", f"Result of tool call {message.tool_call_id}: {message.text()}")
    if message.role == "assistant" and message.tool_calls:
        return ChatMessage("assistant", structured.render_tool_calls(message.tool_calls))
    role = "system" if message.role == "developer" else message.role
    return ChatMessage(role, message.text())


def _completion_plans(body: CompletionRequest, settings: ServerSettings) -> list[GenerationPlan]:
    """One plan per choice: `n` for each prompt, numbered as OpenAI does."""
    prompts = choices.completion_prompts(body.prompt)
    choices.check_choice_count(len(prompts), body.n)
    sampling = _sampling(body, settings)
    plans = []
    for prompt_index, prompt in enumerate(prompts):
        plan = GenerationPlan(
            kind="text_completion",
            messages=None,
            prompt=prompt if isinstance(prompt, str) else None,
            prompt_tokens=None if isinstance(prompt, str) else prompt,
            sampling=sampling,
            prompt_index=prompt_index,
        )
        plans += _choice_plans(plan, body.n)
    return plans


def _choice_plans(plan: GenerationPlan, n: int) -> list[GenerationPlan]:
    """`n` generations of `plan`, seeded `seed`, `seed + 1`, … when it has a seed."""
    if n == 1:
        return [plan]
    seeds = choices.choice_seeds(plan.sampling.seed, n)
    return [replace(plan, sampling=replace(plan.sampling, seed=seed)) for seed in seeds]


# ---- running it: whole replies and streams ---------------------------------------------------


ChoiceEvent = tuple[int, str | None]  # (choice index, a piece of text, or None: it ended)


async def _respond(
    plans: Sequence[GenerationPlan],
    stream: bool,
    include_usage: bool,
    request: Request,
    service: EngineService,
    settings: ServerSettings,
) -> Response:
    """Run one job per choice (`plans`, in choice order) and answer with all of them."""
    replies = _reply_formats(plans, settings.model_id)
    if stream:
        plans = _streaming_logprobs(plans, replies)
        events: asyncio.Queue[ChoiceEvent] = asyncio.Queue()
        jobs = _submit_streaming(plans, service, _thread_safe_put(events))
        try:
            early = await _events_before_text(events, jobs, request)
        except ClientGone:
            return Response(status_code=499)
        return sse_response(_event_stream(jobs, early, events, replies, include_usage))
    jobs = _submit_all(plans, service, lambda _index: None)
    try:
        results = await _all_unless_client_leaves(jobs, request)
    except ClientGone:
        return Response(status_code=499)
    bodies = [reply.whole(result) for reply, result in zip(replies, results, strict=True)]
    return JSONResponse(choices.merged_reply(bodies, _total_usage(plans, results)))


def _streaming_logprobs(
    plans: Sequence[GenerationPlan], replies: Sequence[_ReplyFormat]
) -> list[GenerationPlan]:
    """Plans that hand their logprob entries to their reply's chunks as they stream."""
    return [
        replace(plan, on_logprobs=reply.logprobs.hold)
        if plan.sampling.logprobs is not None
        else plan
        for plan, reply in zip(plans, replies, strict=True)
    ]


def _reply_formats(plans: Sequence[GenerationPlan], model_id: str) -> list[_ReplyFormat]:
    replies = [_ReplyFormat(plan, model_id) for plan in plans]
    for reply in replies[1:]:  # the choices of one response share its id
        reply.id, reply.created = replies[0].id, replies[0].created
    return replies


def _total_usage(
    plans: Sequence[GenerationPlan], results: Sequence[GenerationResult]
) -> dict[str, int]:
    return choices.total_usage(
        [plan.prompt_index for plan in plans], [_usage(result) for result in results]
    )


def _submit_all(
    plans: Sequence[GenerationPlan],
    service: EngineService,
    on_text_for: Callable[[int], Callable[[str], None] | None],
) -> list[Job[GenerationResult]]:
    """A shared job per choice (several slots decode them together); all or none queued."""
    jobs: list[Job[GenerationResult]] = []
    try:
        for index, plan in enumerate(plans):
            jobs.append(_submit(plan, service, on_text_for(index)))
    except BaseException:
        _cancel_all(jobs)
        raise
    return jobs


def _submit_streaming(
    plans: Sequence[GenerationPlan], service: EngineService, put: Callable[[ChoiceEvent], None]
) -> list[Job[GenerationResult]]:
    def on_text_for(index: int) -> Callable[[str], None]:
        return lambda piece: put((index, piece))

    def on_end_for(index: int) -> Callable[[Any], None]:
        return lambda _future: put((index, None))

    jobs = _submit_all(plans, service, on_text_for)
    for index, job in enumerate(jobs):
        job.future.add_done_callback(on_end_for(index))
    return jobs


def _cancel_all(jobs: Sequence[Job[Any]]) -> None:
    for job in jobs:
        if not job.done():
            job.cancel()


def _submit(
    plan: GenerationPlan, service: EngineService, on_text: Callable[[str], None] | None
) -> Job[GenerationResult]:
    def run(engine: LoadedEngine | None, cancel: Any) -> GenerationResult:
        if engine is None:
            raise HearthsideError("No model is loaded.")
        if isinstance(engine, RemoteEngine):
            raise _model_changed()
        return plan.run(engine, cancel, on_text)

    return service.submit(Job(run, description=plan.kind, shared=True))


def _thread_safe_put(queue: asyncio.Queue[T]) -> Callable[[T], None]:
    """A callback the engine thread may call to hand items to this event loop's queue."""
    loop = asyncio.get_running_loop()

    def put(item: T) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, item)

    return put


async def _wait_unless_client_leaves(job: Job[T], request: Request) -> T:
    return (await _all_unless_client_leaves([job], request))[0]


async def _all_unless_client_leaves(jobs: Sequence[Job[T]], request: Request) -> list[T]:
    """Every job's result, in order; the first error raised as it is."""
    pending = [asyncio.wrap_future(job.future) for job in jobs]
    while True:
        _, waiting = await asyncio.wait(pending, timeout=DISCONNECT_POLL_S)
        failed = [future for future in pending if future.done() and future.exception()]
        if failed:
            _cancel_all(jobs)  # one choice failed: the others are not wanted
            failed[0].result()  # raises
        if not waiting:
            return [future.result() for future in pending]
        if await request.is_disconnected():
            _cancel_all(jobs)
            raise ClientGone()


async def _events_before_text(
    events: asyncio.Queue[ChoiceEvent], jobs: Sequence[Job[GenerationResult]], request: Request
) -> list[ChoiceEvent]:
    """The events up to the first piece of text. A choice that fails before any text (a
    prompt that does not fit, a full queue) ends the request with its own status, before
    a 200 and a stream have started."""
    early: list[ChoiceEvent] = []
    ended = 0
    while ended < len(jobs):
        index, piece = await _next_event(events, jobs, request)
        early.append((index, piece))
        if piece is not None:
            return early
        if jobs[index].future.exception() is not None:
            _cancel_all(jobs)
            jobs[index].result()  # raises
        ended += 1
    return early


async def _event_stream(
    jobs: Sequence[Job[GenerationResult]],
    early: list[ChoiceEvent],
    events: asyncio.Queue[ChoiceEvent],
    replies: Sequence[_ReplyFormat],
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """Every choice's chunks as they come, each with its own index, then usage and [DONE];
    an error after the stream started goes in it as an event, and [DONE] still ends it."""
    try:
        for index, reply in enumerate(replies):
            for chunk in reply.opening():
                yield _sse(choices.with_choice_index(chunk, index))
        results: dict[int, GenerationResult] = {}
        while len(results) < len(jobs):
            index, piece = early.pop(0) if early else await events.get()
            if piece is not None:
                chunks = replies[index].pieces(piece)
            else:
                try:
                    results[index] = jobs[index].result()
                except Exception as exc:
                    yield _sse({"error": _error_body(exc)})
                    break
                chunks = replies[index].closing(results[index], False)
            for chunk in chunks:
                yield _sse(choices.with_choice_index(chunk, index))
        else:
            if include_usage:
                in_order = [results[index] for index in range(len(jobs))]
                yield _sse(_usage_chunk(replies[0], _total_usage(_plans(replies), in_order)))
        yield b"data: [DONE]\n\n"
    finally:
        _cancel_all(jobs)  # those still running: the client went away, or a choice failed


def _plans(replies: Sequence[_ReplyFormat]) -> list[GenerationPlan]:
    return [reply.plan for reply in replies]


def _usage_chunk(reply: _ReplyFormat, usage: dict[str, int]) -> dict[str, Any]:
    kind = "text_completion" if reply.plan.kind == "text_completion" else "chat.completion.chunk"
    chunk = reply._envelope(kind, [])
    chunk["usage"] = usage
    return chunk


def _error_body(exc: Exception) -> dict[str, Any]:
    if isinstance(exc, HearthsideError):
        return dict(json.loads(bytes(error_response(exc).body))["error"])
    log.error("unexpected %s in a stream", type(exc).__name__, exc_info=exc)
    return {
        "message": "Internal error in Hearthside.",
        "type": "server_error",
        "param": None,
        "code": None,
    }


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


# Proxies (nginx) buffer a response unless told not to, and a stream then arrives all at once.
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(events: AsyncIterator[bytes]) -> StreamingResponse:
    """A server-sent-event stream of `events` (each already framed, e.g. by `_sse`)."""
    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


class _ReplyFormat:
    """Builds OpenAI response bodies and stream chunks for one request."""

    def __init__(self, plan: GenerationPlan, model_id: str) -> None:
        self.plan = plan
        self.model_id = model_id
        prefix = "chatcmpl" if plan.kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.tool_stream = structured.ToolCallStream(plan.tools) if plan.tools else None
        self.logprobs = StreamedLogprobs()

    def _logprobs_of(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """A choice's `logprobs`: null unless asked for, and for tool calls."""
        if self.plan.sampling.logprobs is None or self.plan.tools:
            return None
        if self.plan.kind == "text_completion":
            return completion_logprobs(entries, len(self.plan.prompt or ""))
        return chat_logprobs(entries)

    def _envelope(self, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model_id,
            "choices": choices,
        }

    # whole replies

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        finish = FINISH_REASONS.get(result.metrics.stop_reason, "stop")
        if self.plan.kind == "text_completion":
            logprobs = self._logprobs_of(result.logprobs or ())
            choice = {
                "index": 0,
                "text": result.text,
                "finish_reason": finish,
                "logprobs": logprobs,
            }
            body = self._envelope("text_completion", [choice])
        else:
            message, finish = self._message(result.text, finish)
            logprobs = self._logprobs_of(result.logprobs or ())
            body = self._envelope(
                "chat.completion",
                [{"index": 0, "message": message, "finish_reason": finish, "logprobs": logprobs}],
            )
        body["usage"] = _usage(result)
        return body

    def _message(self, text: str, finish: str) -> tuple[dict[str, Any], str]:
        cut_off = finish == "length"
        calls = self._tool_calls(text, cut_off)
        if calls is None:
            return {"role": "assistant", "content": text, "refusal": None}, finish
        message: dict[str, Any] = {"role": "assistant", "content": None, "refusal": None}
        if calls:  # a call cut off before its name was written leaves none
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in calls
            ]
        return message, "length" if cut_off else "tool_calls"

    def _tool_calls(self, text: str, cut_off: bool) -> tuple[structured.ToolCall, ...] | None:
        """The reply's calls; one the token limit cut short is reported as its stream is
        (#34: never call syntax as `content`)."""
        tools = self.plan.tools
        if not tools:
            return None
        if cut_off:
            return structured.cut_off_tool_calls(text, tools)
        return structured.parse_tool_calls(text, tools)

    # streams

    def opening(self) -> list[dict[str, Any]]:
        if self.plan.kind == "text_completion":
            return []
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def pieces(self, piece: str) -> list[dict[str, Any]]:
        logprobs = self._logprobs_of(self.logprobs.take(piece))
        if self.plan.kind == "text_completion":
            choice = {"index": 0, "text": piece, "finish_reason": None, "logprobs": logprobs}
            return [self._envelope("text_completion", [choice])]
        if self.tool_stream is None:
            return [self._chunk({"content": piece}, None, logprobs)]
        return [self._chunk(delta, None) for delta in self.tool_stream.feed(piece)]

    def closing(self, result: GenerationResult, include_usage: bool) -> list[dict[str, Any]]:
        finish = FINISH_REASONS.get(result.metrics.stop_reason, "stop")
        chunks = self._unsent_logprobs(result)
        if self.plan.kind == "text_completion":
            choice = {"index": 0, "text": "", "finish_reason": finish, "logprobs": None}
            chunks.append(self._envelope("text_completion", [choice]))
        else:
            if self.tool_stream is not None:
                cut_off = finish == "length"
                deltas, tool_finish = self.tool_stream.finish(cut_off=cut_off)
                chunks += [self._chunk(delta, None) for delta in deltas]
                if not cut_off:  # a call cut off by the limit is reported as such
                    finish = tool_finish
            chunks.append(self._chunk({}, finish))
        if include_usage:
            kind = (
                "chat.completion.chunk"
                if self.plan.kind != "text_completion"
                else "text_completion"
            )
            usage_chunk = self._envelope(kind, [])
            usage_chunk["usage"] = _usage(result)
            chunks.append(usage_chunk)
        return chunks

    def _unsent_logprobs(self, result: GenerationResult) -> list[dict[str, Any]]:
        """A chunk with the entries no piece carried (text a stop sequence cut through, a
        reply checked against its schema before it was sent)."""
        rest = self.logprobs.rest(result)
        logprobs = self._logprobs_of(rest)
        if not rest or logprobs is None:
            return []
        if self.plan.kind == "text_completion":
            choice = {"index": 0, "text": "", "finish_reason": None, "logprobs": logprobs}
            return [self._envelope("text_completion", [choice])]
        return [self._chunk({"content": ""}, None, logprobs)]

    def _chunk(
        self, delta: dict[str, Any], finish: str | None, logprobs: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": logprobs}
        return self._envelope("chat.completion.chunk", [choice])


def _usage(result: GenerationResult) -> dict[str, int]:
    prompt, completion = result.metrics.prompt_tokens, result.metrics.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


# ---- proxy mode: passing requests on to a remote server --------------------------------------


def _as_sent(body: BaseModel) -> dict[str, Any]:
    """The request as the client wrote it (known fields only); the engine sets the model."""
    return body.model_dump(exclude_unset=True, exclude={"model"})


def _model_changed() -> EngineError:
    return EngineError(
        "The model changed while this request waited.", hint="Send the request again."
    )


@dataclass(frozen=True)
class _Relay:
    """One request passed on to the remote server behind the service."""

    route: str
    payload: dict[str, Any]
    stream: bool
    model_id: str

    async def respond(self, request: Request, service: EngineService) -> Response:
        if self.stream:
            return await self._respond_streaming(request, service)
        job = service.submit(Job(self._run_whole, description=f"relay {self.route}", shared=True))
        try:
            reply = await _wait_unless_client_leaves(job, request)
        except ClientGone:
            return Response(status_code=499)
        return JSONResponse(self._renamed(reply or {}))

    async def _respond_streaming(self, request: Request, service: EngineService) -> Response:
        events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        put = _thread_safe_put(events)

        def run(engine: LoadedEngine | None, cancel: Any) -> None:
            self._run_stream(engine, cancel, put)

        job = service.submit(Job(run, description=f"relay {self.route}", shared=True))
        job.future.add_done_callback(lambda _f: put(None))
        try:
            first = await _first_event(events, job, request)
        except ClientGone:
            return Response(status_code=499)
        if first is None:
            job.result()  # an error before the first event gets a proper status
        return sse_response(self._stream(first, events, job))

    def _run_whole(self, engine: LoadedEngine | None, cancel: Any) -> dict[str, Any] | None:
        return _remote(engine).relay(self.route, self.payload, cancel=cancel)

    def _run_stream(
        self, engine: LoadedEngine | None, cancel: Any, put: Callable[[Any], None]
    ) -> None:
        _remote(engine).relay(self.route, self.payload, on_event=put, cancel=cancel)

    async def _stream(
        self,
        first: dict[str, Any] | None,
        events: asyncio.Queue[dict[str, Any] | None],
        job: Job[None],
    ) -> AsyncIterator[bytes]:
        try:
            event = first
            while event is not None:
                yield _sse(self._renamed(event))
                event = await events.get()
            try:
                job.result()
            except Exception as exc:  # the stream has started: the error goes in it
                yield _sse({"error": _error_body(exc)})
            yield b"data: [DONE]\n\n"
        finally:
            if not job.done():  # the client went away mid-stream
                job.cancel()

    def _renamed(self, reply: dict[str, Any]) -> dict[str, Any]:
        return {**reply, "model": self.model_id} if "model" in reply else reply


def _remote(engine: LoadedEngine | None) -> RemoteEngine:
    if not isinstance(engine, RemoteEngine):
        raise _model_changed()
    return engine


async def _first_event(
    events: asyncio.Queue[T | None], job: Job[Any], request: Request
) -> T | None:
    """The stream's first event (None when the job ended without one); polls for the client
    leaving while the engine (or the remote) evaluates the prompt."""
    return await _next_event(events, [job], request)


async def _next_event(events: asyncio.Queue[T], jobs: Sequence[Job[Any]], request: Request) -> T:
    """The next event of `jobs`' stream, cancelling them all if the client leaves first."""
    while True:
        try:
            return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                _cancel_all(jobs)
                raise ClientGone() from None
