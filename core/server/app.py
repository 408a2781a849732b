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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from hearthside.core.engine.config import EngineConfigError, SamplingParams
from hearthside.core.engine.engine import ChatMessage, GenerationResult
from hearthside.core.engine.grammar_limits import GrammarError
from hearthside.core.engine.remote import RemoteEngine, RemoteServerError
from hearthside.core.engine.service import EngineService, Job, LoadedEngine, LocalEngine
from hearthside.core.errors import (
    ContextOverflowError,
    EngineCrashedError,
    EngineError,
    HearthsideError,
    JobCancelledError,
    QueueFullError,
)
from hearthside.core.server import structured
from hearthside.core.server.schemas import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    EmbeddingRequest,
)
from hearthside.core.server.security import SecurityMiddleware, SecurityPolicy, openai_error

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context_full": "length"}
DISCONNECT_POLL_S = 0.1
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
    settings: ServerSettings, service: EngineService, counter: RequestCounter | None = None
) -> FastAPI:
    app = FastAPI(title="Hearthside local API", version="1", docs_url=None, redoc_url=None)
    _add_error_handlers(app)
    _add_routes(app, settings, service)
    if counter is not None:  # added first, so it sits inside the security checks
        app.add_middleware(_CountingMiddleware, counter=counter)
    app.add_middleware(SecurityMiddleware, policy=settings.security_policy())
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

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        return openai_error(500, "Internal error in Hearthside.", type_="server_error")


def error_response(exc: HearthsideError) -> JSONResponse:
    if isinstance(exc, QueueFullError):
        return openai_error(
            503,
            exc.message,
            type_="server_error",
            code="queue_full",
            headers={"Retry-After": "1"},
        )
    if isinstance(exc, ContextOverflowError):
        return openai_error(
            400, exc.message, type_="invalid_request_error", code="context_length_exceeded"
        )
    if isinstance(exc, EngineConfigError | structured.StructuredOutputError | GrammarError):
        return openai_error(400, exc.message, type_="invalid_request_error")
    if isinstance(exc, JobCancelledError):
        return openai_error(499, exc.message, type_="invalid_request_error", code="cancelled")
    if isinstance(exc, EngineCrashedError):  # the service restarts it; the next request is served
        return openai_error(500, exc.message, type_="server_error", code="engine_crashed")
    if isinstance(exc, RemoteServerError):
        status = exc.client_status
        kind = "invalid_request_error" if status < 500 else "server_error"
        return openai_error(status, exc.message, type_=kind, code="upstream_error")
    return openai_error(500, exc.message, type_="server_error")


# ---- routes ----------------------------------------------------------------------------------


def _add_routes(app: FastAPI, settings: ServerSettings, service: EngineService) -> None:
    model_card = {
        "id": settings.model_id,
        "object": "model",
        "created": settings.created_at,
        "owned_by": "hearthside",
    }

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok", "model": settings.model_id}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str) -> Response:
        if model_id != settings.model_id:
            return openai_error(
                404, "No such model.", type_="invalid_request_error", code="model_not_found"
            )
        return JSONResponse(model_card)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        if service.is_remote:
            _sampling(body, settings)  # the same limits as for a local model
            relay = _Relay("chat/completions", _as_sent(body), body.stream, settings.model_id)
            return await relay.respond(request, service)
        # Off the event loop: a large (bounded) schema must not stall other requests.
        plan = await run_in_threadpool(_chat_plan, body, settings)
        return await _respond(plan, body.stream, body.include_usage(), request, service, settings)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        if service.is_remote:
            _sampling(body, settings)
            relay = _Relay("completions", _as_sent(body), body.stream, settings.model_id)
            return await relay.respond(request, service)
        plan = _completion_plan(body, settings)
        return await _respond(plan, body.stream, body.include_usage(), request, service, settings)

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


# ---- turning a request into engine work ------------------------------------------------------


@dataclass(frozen=True)
class GenerationPlan:
    """One request, ready to run on the engine thread."""

    kind: str  # "chat.completion" | "text_completion"
    messages: tuple[ChatMessage, ...] | None
    prompt: str | None
    sampling: SamplingParams
    tools: tuple[structured.ToolSpec, ...] = ()

    def run(
        self, engine: LocalEngine, cancel: Any, on_text: Callable[[str], None] | None
    ) -> GenerationResult:
        if self.messages is not None:
            return engine.chat(self.messages, self.sampling, on_text=on_text, cancel=cancel)
        tokens = engine.tokenize(self.prompt or "", add_bos=True)
        return engine.generate(tokens, self.sampling, on_text=on_text, cancel=cancel)


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
    )


def _chat_plan(body: ChatCompletionRequest, settings: ServerSettings) -> GenerationPlan:
    sampling = _sampling(body, settings)
    messages = [_engine_message(message) for message in body.messages]
    tools = structured.parse_tools(body.tools)
    grammar = structured.grammar_for_tools(tools, body.tool_choice) if tools else None
    if grammar is not None:
        messages.insert(0, ChatMessage("system", structured.tool_prompt(tools)))
    else:
        tools = ()
        grammar = structured.grammar_for_response_format(body.response_format)
    return GenerationPlan(
        kind="chat.completion",
        messages=tuple(messages),
        prompt=None,
        sampling=replace(sampling, grammar=grammar),
        tools=tools,
    )


def _engine_message(message: ChatMessageIn) -> ChatMessage:
    if message.role == "tool":
        return ChatMessage("user", f"Result of tool call {message.tool_call_id}: {message.text()}")
    if message.role == "assistant" and message.tool_calls:
        calls = [call.get("function", {}) for call in message.tool_calls]
        return ChatMessage("assistant", json.dumps(calls[0] if len(calls) == 1 else calls))
    role = "system" if message.role == "developer" else message.role
    return ChatMessage(role, message.text())


def _completion_plan(body: CompletionRequest, settings: ServerSettings) -> GenerationPlan:
    try:
        prompt = body.prompt_text()
    except ValueError as exc:
        raise EngineConfigError(str(exc)) from None
    return GenerationPlan(
        kind="text_completion", messages=None, prompt=prompt, sampling=_sampling(body, settings)
    )


# ---- running it: whole replies and streams ---------------------------------------------------


async def _respond(
    plan: GenerationPlan,
    stream: bool,
    include_usage: bool,
    request: Request,
    service: EngineService,
    settings: ServerSettings,
) -> Response:
    reply = _ReplyFormat(plan, settings.model_id)
    if stream:
        pieces: asyncio.Queue[str | None] = asyncio.Queue()
        put = _thread_safe_put(pieces)
        job = _submit(plan, service, put)
        job.future.add_done_callback(lambda _f: put(None))
        try:
            first = await _first_event(pieces, job, request)
        except ClientGone:
            return Response(status_code=499)
        if first is None:
            job.result()  # a request refused before its first token gets a proper status
        return StreamingResponse(
            _event_stream(job, first, pieces, reply, include_usage),
            media_type="text/event-stream",
        )
    job = _submit(plan, service, None)
    try:
        result = await _wait_unless_client_leaves(job, request)
    except ClientGone:
        return Response(status_code=499)
    return JSONResponse(reply.whole(result))


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
    pending = asyncio.wrap_future(job.future)
    while True:
        done, _ = await asyncio.wait({pending}, timeout=DISCONNECT_POLL_S)
        if done:
            return pending.result()
        if await request.is_disconnected():
            job.cancel()
            raise ClientGone()


async def _event_stream(
    job: Job[GenerationResult],
    first: str | None,
    pieces: asyncio.Queue[str | None],
    reply: _ReplyFormat,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    try:
        for chunk in reply.opening():
            yield _sse(chunk)
        piece = first
        while piece is not None:
            for chunk in reply.pieces(piece):
                yield _sse(chunk)
            piece = await pieces.get()
        try:
            result = job.result()
        except Exception as exc:  # the stream has started: the error goes in it, then [DONE]
            yield _sse({"error": _error_body(exc)})
            yield b"data: [DONE]\n\n"
            return
        for chunk in reply.closing(result, include_usage):
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"
    finally:
        if not job.done():  # the client went away mid-stream
            job.cancel()


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


class _ReplyFormat:
    """Builds OpenAI response bodies and stream chunks for one request."""

    def __init__(self, plan: GenerationPlan, model_id: str) -> None:
        self.plan = plan
        self.model_id = model_id
        prefix = "chatcmpl" if plan.kind == "chat.completion" else "cmpl"
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.tool_stream = structured.ToolCallStream(plan.tools) if plan.tools else None

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
            choice = {"index": 0, "text": result.text, "finish_reason": finish, "logprobs": None}
            body = self._envelope("text_completion", [choice])
        else:
            message, finish = self._message(result.text, finish)
            body = self._envelope(
                "chat.completion", [{"index": 0, "message": message, "finish_reason": finish}]
            )
        body["usage"] = _usage(result)
        return body

    def _message(self, text: str, finish: str) -> tuple[dict[str, Any], str]:
        call = structured.parse_tool_call(text, self.plan.tools) if self.plan.tools else None
        if call is None:
            return {"role": "assistant", "content": text}, finish
        tool_call = {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        return {"role": "assistant", "content": None, "tool_calls": [tool_call]}, "tool_calls"

    # streams

    def opening(self) -> list[dict[str, Any]]:
        if self.plan.kind == "text_completion":
            return []
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def pieces(self, piece: str) -> list[dict[str, Any]]:
        if self.plan.kind == "text_completion":
            choice = {"index": 0, "text": piece, "finish_reason": None, "logprobs": None}
            return [self._envelope("text_completion", [choice])]
        if self.tool_stream is None:
            return [self._chunk({"content": piece}, None)]
        return [self._chunk(delta, None) for delta in self.tool_stream.feed(piece)]

    def closing(self, result: GenerationResult, include_usage: bool) -> list[dict[str, Any]]:
        finish = FINISH_REASONS.get(result.metrics.stop_reason, "stop")
        chunks = []
        if self.plan.kind == "text_completion":
            choice = {"index": 0, "text": "", "finish_reason": finish, "logprobs": None}
            chunks.append(self._envelope("text_completion", [choice]))
        else:
            if self.tool_stream is not None:
                deltas, tool_finish = self.tool_stream.finish()
                chunks += [self._chunk(delta, None) for delta in deltas]
                if finish != "length":  # a call cut off by the limit is reported as such
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

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
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
        return StreamingResponse(self._stream(first, events, job), media_type="text/event-stream")

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
            except HearthsideError as exc:
                yield _sse({"error": json.loads(bytes(error_response(exc).body))["error"]})
                return
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
    while True:
        try:
            return await asyncio.wait_for(events.get(), DISCONNECT_POLL_S)
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise ClientGone() from None
