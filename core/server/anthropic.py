"""`POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over the
chat route's machinery (what llama-server, Ollama and LM Studio also answer).

A request is turned into the chat request it means (`system` → a system message, `tool_use`
blocks → an assistant's tool calls, `tool_result` blocks → tool messages, `tools` →
function tools, `tool_choice` any → required), so sampling defaults, grammar-enforced tool
calls, schema limits, the job queue and cancellation are the chat route's own. The reply is
rebuilt as a `message` with `text` and `tool_use` blocks, or streamed as Anthropic's typed
events (`message_start` ... `message_stop`). Errors, the security checks' refusals included,
come in Anthropic's shape, `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.remote import RemoteEngine
from hearthside.core.engine.service import EngineService, Job, LoadedEngine, LocalEngine
from hearthside.core.errors import EngineError, HearthsideError
from hearthside.core.server import structured
from hearthside.core.server.app import (
    ClientGone,
    GenerationPlan,
    ServerSettings,
    _chat_plan,
    _model_changed,
    _next_event,
    _thread_safe_put,
    _wait_unless_client_leaves,
    error_response,
    sse_response,
)
from hearthside.core.server.content_parts import MEDIA_PARTS
from hearthside.core.server.model_load import model_for_request
from hearthside.core.server.model_pool import ModelPool
from hearthside.core.server.request_errors import InvalidRequestError
from hearthside.core.server.schemas import (
    MAX_STOP_SEQUENCES,
    ChatCompletionRequest,
    _Request,
    _TextChecked,
    check_message_count,
)
from hearthside.core.server.security import anthropic_error

log = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)
CUT_OFF_STOPS = {"length", "context_full"}
# The stop sequence that ended a reply is found in its last tokens' text; a longer one (rare)
# is reported as end_turn rather than costing a token lookup per byte.
MAX_STOP_TAIL_TOKENS = 256
# Anthropic's media blocks, refused as the chat route refuses image parts: a text-only model
# answering about an image it never saw is worse than a 400.
MEDIA_BLOCKS = {"image": MEDIA_PARTS["input_image"], "document": MEDIA_PARTS["input_file"]}
SKIPPED_BLOCKS = {"thinking", "redacted_thinking"}  # a Claude's reasoning sent back: not text


# ---- the request ---------------------------------------------------------------------------


class TextBlock(_Request):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Request):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Request):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False


class MessageParam(_Request):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]  # blocks checked one by one, for errors that name them


class ToolParam(_Request):
    type: str | None = None  # "custom" (or left out): a client tool; others are Anthropic's own
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None  # required of client tools, checked below


class ToolChoice(_Request):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class MessagesInput(_TextChecked):
    """What both routes read: the conversation and its tools."""

    model: str = Field(min_length=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None

    @field_validator("messages", mode="before")
    @classmethod
    def _check_message_count(cls, value: Any) -> Any:
        return check_message_count(value)


class MessagesRequest(MessagesInput):
    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)  # Anthropic's range
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: list[str] | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # accepted and not used, as llama-server does

    @field_validator("stop_sequences")
    @classmethod
    def _check_stops(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and (len(value) > MAX_STOP_SEQUENCES or not all(value)):
            raise ValueError(f"give at most {MAX_STOP_SEQUENCES} non-empty stop sequences")
        return value


class CountTokensRequest(MessagesInput):
    pass


# ---- request → chat request ----------------------------------------------------------------


def chat_request(body: MessagesInput, settings: ServerSettings) -> ChatCompletionRequest:
    """The ChatCompletionRequest `body` means (its max_tokens checked against the cap)."""
    system = _system_messages(body.system)
    messages = [
        chat_message
        for index, message in enumerate(body.messages)
        for chat_message in _chat_messages(message, f"messages[{index}]")
    ]
    choice, parallel = _chat_tool_choice(body.tool_choice)
    fields: dict[str, Any] = {
        "messages": [*system, *messages],
        "tools": _chat_tools(body.tools),
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    if isinstance(body, MessagesRequest):
        fields.update(_sampling_fields(body, settings))
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise _refused(f"{where}: {first['msg']}") from None


def _sampling_fields(body: MessagesRequest, settings: ServerSettings) -> dict[str, Any]:
    if body.max_tokens > settings.max_tokens_cap:
        raise _refused(
            f"max_tokens may be at most {settings.max_tokens_cap} on this server; "
            f"this request asks for {body.max_tokens}. Ask for fewer tokens."
        )
    return {
        "max_tokens": body.max_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "top_k": body.top_k,
        "stop": body.stop_sequences,
    }


def _refused(message: str) -> InvalidRequestError:
    return InvalidRequestError(message, param=None, code="invalid_request")


def _system_messages(system: str | list[TextBlock] | None) -> list[dict[str, Any]]:
    text = system if isinstance(system, str) else "\n\n".join(b.text for b in system or ())
    return [{"role": "system", "content": text}] if text else []


def _chat_messages(message: MessageParam, where: str) -> list[dict[str, Any]]:
    content = message.content
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    if message.role == "assistant":
        return _assistant_messages(blocks, where)
    return _user_messages(blocks, where)


def _user_messages(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results become tool messages and text a user message, in the order sent."""
    messages: list[dict[str, Any]] = []
    texts: list[str] = []
    for index, raw in enumerate(blocks):
        at = f"{where}.content[{index}]"
        kind = _block_type(raw, at, allowed=("text", "tool_result"))
        if kind == "text":
            texts.append(_parsed(TextBlock, raw, at).text)
            continue
        if texts:
            messages.append({"role": "user", "content": "\n\n".join(texts)})
            texts = []
        result = _parsed(ToolResultBlock, _checked_result(raw, at), at)
        messages.append(
            {"role": "tool", "tool_call_id": result.tool_use_id, "content": _result_text(result)}
        )
    if texts or not messages:
        messages.append({"role": "user", "content": "\n\n".join(texts)})
    return messages


def _assistant_messages(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for index, raw in enumerate(blocks):
        at = f"{where}.content[{index}]"
        kind = _block_type(raw, at, allowed=("text", "tool_use", *SKIPPED_BLOCKS))
        if kind == "text":
            texts.append(_parsed(TextBlock, raw, at).text)
        elif kind == "tool_use":
            use = _parsed(ToolUseBlock, raw, at)
            arguments = json.dumps(use.input, ensure_ascii=False)
            function = {"name": use.name, "arguments": arguments}
            calls.append({"id": use.id, "type": "function", "function": function})
    return [{"role": "assistant", "content": "\n\n".join(texts), "tool_calls": calls or None}]


def _block_type(raw: dict[str, Any], where: str, *, allowed: Sequence[str]) -> str:
    kind = raw.get("type")
    if kind in MEDIA_BLOCKS:
        cannot, instead = MEDIA_BLOCKS[kind]
        reads = "the loaded model reads text only and cannot"
        raise _refused(f"{where} holds a block of type {kind!r}; {reads} {cannot}. {instead}")
    if kind not in allowed:
        raise _refused(
            f"{where} has type {kind!r}; this message may hold {', '.join(allowed)} blocks."
        )
    return str(kind)


def _checked_result(raw: dict[str, Any], where: str) -> dict[str, Any]:
    content = raw.get("content")
    for index, part in enumerate(content if isinstance(content, list) else ()):
        if isinstance(part, dict):
            _block_type(part, f"{where}.content[{index}]", allowed=("text",))
    return raw


def _result_text(result: ToolResultBlock) -> str:
    content = result.content
    text = content if isinstance(content, str) else "\n\n".join(b.text for b in content)
    return f"Error: {text}" if result.is_error else text


def _parsed(model: type[M], raw: Any, where: str) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise _refused(f"{where}{path}: {first['msg']}") from None


def _chat_tools(tools: list[ToolParam] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if tool.type not in (None, "custom"):
            raise _refused(
                f"tools[{index}] is Anthropic's server tool {tool.type!r}, which runs on "
                "Anthropic's servers; Hearthside runs client tools (name, description, "
                "input_schema) only."
            )
        if tool.input_schema is None:
            what = "the JSON schema of the tool's input"
            raise _refused(f"tools[{index}].input_schema is required: {what}.")
        if not structured.TOOL_NAME_RE.fullmatch(tool.name):
            raise _refused(f"tools[{index}].name must be 1 to 64 letters, digits, '_' or '-'.")
        function = {"name": tool.name, "parameters": tool.input_schema}
        if tool.description is not None:
            function["description"] = tool.description
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _chat_tool_choice(choice: ToolChoice | None) -> tuple[str | dict[str, Any] | None, bool | None]:
    """The chat `tool_choice` and `parallel_tool_calls` an Anthropic tool_choice means."""
    if choice is None:
        return None, None
    parallel = False if choice.disable_parallel_tool_use else None
    if choice.type == "tool":
        if not choice.name:
            raise _refused('tool_choice of type "tool" needs the `name` of the tool to call.')
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel


# ---- running it on the engine --------------------------------------------------------------


@dataclass(frozen=True)
class MessagesResult(GenerationResult):
    """A generation, and which of the request's stop sequences ended it (None: another cause)."""

    stop_sequence: str | None = None


PromptCounted = int  # a stream's first event: the prompt's length in tokens
StreamItem = str | PromptCounted  # then the pieces of text


def _local(engine: LoadedEngine | None) -> LocalEngine:
    if engine is None:
        raise EngineError("No model is loaded.", hint="Load a model first.")
    if isinstance(engine, RemoteEngine):
        raise _model_changed()
    return engine


def prompt_token_count(engine: LocalEngine, plan: GenerationPlan) -> int:
    """The tokens `plan`'s messages take as a generation counts them: the chat template
    rendered (the tool prompt included), then tokenized."""
    return len(engine.tokenize_prompt(engine.render_chat(plan.messages or ())))


def matched_stop(engine: LocalEngine, result: GenerationResult, stops: Sequence[str]) -> str | None:
    """Which of `stops` ended `result`: the one completed first in its last tokens' text
    (none of them occurs before, or the reply would have stopped there)."""
    if result.metrics.stop_reason != "stop" or not stops or not result.tokens:
        return None
    window = min(max(len(stop.encode()) for stop in stops) + 1, MAX_STOP_TAIL_TOKENS)
    tail_bytes = b"".join(engine.token_text(token) for token in result.tokens[-window:])
    tail = tail_bytes.decode("utf-8", errors="replace")
    ends = {stop: tail.find(stop) + len(stop) for stop in stops if stop in tail}
    return min(ends, key=lambda stop: ends[stop]) if ends else None


def _submit(
    plan: GenerationPlan,
    service: EngineService,
    on_text: Callable[[str], None] | None = None,
    on_counted: Callable[[PromptCounted], None] | None = None,
) -> Job[MessagesResult]:
    def run(engine: LoadedEngine | None, cancel: Any) -> MessagesResult:
        local = _local(engine)
        if on_counted is not None:  # a stream's message_start carries input_tokens
            on_counted(prompt_token_count(local, plan))
        result = plan.run(local, cancel, on_text)
        stop = matched_stop(local, result, plan.sampling.stop)
        return MessagesResult(result.text, result.metrics, result.tokens, result.logprobs, stop)

    return service.submit(Job(run, description="messages", shared=True))


def _submit_count(plan: GenerationPlan, service: EngineService) -> Job[int]:
    def run(engine: LoadedEngine | None, _cancel: Any) -> int:
        return prompt_token_count(_local(engine), plan)

    return service.submit(Job(run, description="count tokens", shared=True))


# ---- the message ---------------------------------------------------------------------------


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _tool_use_block(call_id: str, name: str, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": _tool_use_id(call_id), "name": name, "input": tool_input}


def _input_of(arguments: str) -> Any:
    """A call's arguments as an object; {} for ones the token limit cut short."""
    with contextlib.suppress(ValueError):
        return json.loads(arguments)
    return {}


def stop_of(result: MessagesResult, *, made_calls: bool) -> tuple[str, str | None]:
    """Anthropic's stop_reason and stop_sequence for `result`."""
    reason = result.metrics.stop_reason
    if reason == "length":
        return "max_tokens", None
    if reason == "context_full":
        return "model_context_window_exceeded", None
    if made_calls:
        return "tool_use", None
    if result.stop_sequence is not None:
        return "stop_sequence", result.stop_sequence
    return "end_turn", None


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


@dataclass
class MessageBuilder:
    """The `message` objects of one request."""

    plan: GenerationPlan
    model_id: str
    id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")

    def message(
        self,
        content: list[dict[str, Any]],
        stop: tuple[str | None, str | None],
        usage: dict[str, int],
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model_id,
            "content": content,
            "stop_reason": stop[0],
            "stop_sequence": stop[1],
            "usage": usage,
        }

    def whole(self, result: MessagesResult) -> dict[str, Any]:
        calls = self._tool_calls(result)
        if calls is None:
            content = [_text_block(result.text)] if result.text else []
        else:
            content = [
                _tool_use_block(call.id, call.name, _input_of(call.arguments)) for call in calls
            ]
        stop = stop_of(result, made_calls=bool(calls))
        usage = _usage(result.metrics.prompt_tokens, result.metrics.completion_tokens)
        return self.message(content, stop, usage)

    def _tool_calls(self, result: MessagesResult) -> tuple[structured.ToolCall, ...] | None:
        tools = self.plan.tools
        if not tools:
            return None
        if result.metrics.stop_reason in CUT_OFF_STOPS:  # as a stream of it would send them
            return structured.cut_off_tool_calls(result.text, tools)
        return structured.parse_tool_calls(result.text, tools)


class MessageEvents:
    """Turns the engine's text pieces into Anthropic's stream events: the reply's text and
    tool calls become content blocks, opened, filled by deltas and closed in turn."""

    def __init__(self, builder: MessageBuilder, input_tokens: int) -> None:
        self.builder = builder
        self.input_tokens = input_tokens
        tools = builder.plan.tools
        self._tool_stream = structured.ToolCallStream(tools) if tools else None
        self._open: str | None = None  # the open block's type
        self._index = -1  # the last block's index
        self._pinged = False

    def opening(self) -> list[dict[str, Any]]:
        message = self.builder.message([], (None, None), _usage(self.input_tokens, 0))
        return [{"type": "message_start", "message": message}]

    def pieces(self, piece: str) -> list[dict[str, Any]]:
        if self._tool_stream is None:
            return self._from_deltas([{"content": piece}])
        return self._from_deltas(self._tool_stream.feed(piece))

    def closing(self, result: MessagesResult) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        made_calls = False
        if self._tool_stream is not None:
            cut_off = result.metrics.stop_reason in CUT_OFF_STOPS
            deltas, finish = self._tool_stream.finish(cut_off=cut_off)
            events += self._from_deltas(deltas)
            made_calls = finish == "tool_calls" and bool(self._tool_stream.tool_call_ids)
        events += self._close()
        if not self._pinged:
            events.append({"type": "ping"})
        reason, sequence = stop_of(result, made_calls=made_calls)
        usage = _usage(result.metrics.prompt_tokens, result.metrics.completion_tokens)
        delta = {"stop_reason": reason, "stop_sequence": sequence}
        return [
            *events,
            {"type": "message_delta", "delta": delta, "usage": usage},
            {"type": "message_stop"},
        ]

    def _from_deltas(self, deltas: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls", ()):
                events += self._call(call)
        return events

    def _text(self, piece: str) -> list[dict[str, Any]]:
        events = [] if self._open == "text" else self._start(_text_block(""))
        delta = {"type": "text_delta", "text": piece}
        return [*events, {"type": "content_block_delta", "index": self._index, "delta": delta}]

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function", {})
        events = []
        if "id" in call:  # a new call is announced with its id and whole name
            events += self._start(_tool_use_block(call["id"], function.get("name", ""), {}))
        arguments = function.get("arguments", "")
        if arguments and self._open == "tool_use":
            delta = {"type": "input_json_delta", "partial_json": arguments}
            events.append({"type": "content_block_delta", "index": self._index, "delta": delta})
        return events

    def _start(self, block: dict[str, Any]) -> list[dict[str, Any]]:
        events = self._close()
        self._index += 1
        self._open = block["type"]
        events.append({"type": "content_block_start", "index": self._index, "content_block": block})
        if not self._pinged:  # where Anthropic's own streams send it
            self._pinged = True
            events.append({"type": "ping"})
        return events

    def _close(self) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]


def _sse_event(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# ---- errors in Anthropic's shape -------------------------------------------------------------


def _error_of(exc: Exception) -> tuple[int, str, dict[str, str]]:
    """The status, message and headers an error is answered with (the chat route's choice)."""
    if not isinstance(exc, HearthsideError):
        log.error("unexpected %s in a Messages request", type(exc).__name__, exc_info=exc)
        return 500, "Internal error in Hearthside.", {}
    answer = error_response(exc)
    message = json.loads(bytes(answer.body))["error"]["message"]
    retry = answer.headers.get("retry-after")
    return answer.status_code, message, {"Retry-After": retry} if retry else {}


def _error_answer(exc: Exception) -> JSONResponse:
    status, message, headers = _error_of(exc)
    return anthropic_error(status, message, headers=headers)


def _error_event(exc: Exception) -> dict[str, Any]:
    body = json.loads(bytes(_error_answer(exc).body))
    return dict(body)


def _validation_message(exc: RequestValidationError) -> str:
    first = exc.errors()[0] if exc.errors() else {}
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    return f"{where}: {first.get('msg', 'invalid value')}" if where else "Invalid request."


def _http_error_message(exc: StarletteHTTPException) -> str:
    if exc.status_code == 400:
        return "The request body could not be read: send one JSON object, encoded as UTF-8."
    return str(exc.detail)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class AnthropicRoute(APIRoute):
    """A route whose errors, its body's validation included, are in Anthropic's shape."""

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as exc:
                return anthropic_error(400, _validation_message(exc))
            except StarletteHTTPException as exc:  # a body that is not UTF-8 JSON, say
                return anthropic_error(
                    exc.status_code, _http_error_message(exc), headers=exc.headers
                )
            except Exception as exc:
                return _error_answer(exc)

        return answer


# ---- the routes ---------------------------------------------------------------------------


def add_anthropic_routes(
    app: FastAPI, settings: ServerSettings, service: EngineService, pool: ModelPool
) -> None:
    async def create_message(body: MessagesRequest, request: Request) -> Response:
        if service.is_remote:
            return _unavailable_with_remote()
        chat = chat_request(body, settings)
        # Off the event loop: loading a model on demand, or a large (bounded) schema.
        model = await model_for_request(pool, body.model, request)
        with model:  # held, never unloaded, until its job is queued (answered, if whole)
            named = replace(settings, model_id=model.id)
            plan = await run_in_threadpool(_chat_plan, chat, named)
            builder = MessageBuilder(plan, model.id)
            if body.stream:
                return await _respond_streaming(builder, request, model.service)
            job = _submit(plan, model.service)
            try:
                result = await _wait_unless_client_leaves(job, request)
            except ClientGone:
                return Response(status_code=499)
            return JSONResponse(builder.whole(result))

    async def count_tokens(body: CountTokensRequest, request: Request) -> Response:
        if service.is_remote:
            return _unavailable_with_remote()
        chat = chat_request(body, settings)
        model = await model_for_request(pool, body.model, request)
        with model:
            plan = await run_in_threadpool(_chat_plan, chat, replace(settings, model_id=model.id))
            job = _submit_count(plan, model.service)
            try:
                tokens = await _wait_unless_client_leaves(job, request)
            except ClientGone:
                return Response(status_code=499)
        return JSONResponse({"input_tokens": tokens})

    # Added to the app itself (not through an APIRouter), so its 404 lists them with the rest.
    for path, endpoint in (
        ("/v1/messages", create_message),
        ("/v1/messages/count_tokens", count_tokens),
    ):
        app.router.add_api_route(
            path, endpoint, methods=["POST"], route_class_override=AnthropicRoute
        )


def _unavailable_with_remote() -> JSONResponse:
    return anthropic_error(
        400,
        "The Anthropic Messages API is not available while Hearthside relays to a remote "
        "server; use /v1/chat/completions, or load a local model.",
    )


async def _respond_streaming(
    builder: MessageBuilder, request: Request, service: EngineService
) -> Response:
    """Starts the stream once the first text is ready: a request refused before it (a prompt
    that does not fit, a full queue) gets its own status instead of a 200."""
    items: asyncio.Queue[StreamItem | None] = asyncio.Queue()
    put = _thread_safe_put(items)
    job = _submit(builder.plan, service, on_text=put, on_counted=put)
    job.future.add_done_callback(lambda _f: put(None))
    input_tokens = 0
    try:
        first = await _next_event(items, [job], request)
        while isinstance(first, int):
            input_tokens = first
            first = await _next_event(items, [job], request)
    except ClientGone:
        return Response(status_code=499)
    if first is None:
        job.result()  # raises the error that ended it before any text
    events = MessageEvents(builder, input_tokens)
    return sse_response(_stream(job, first, items, events))


async def _stream(
    job: Job[MessagesResult],
    first: str | None,
    items: asyncio.Queue[StreamItem | None],
    events: MessageEvents,
) -> AsyncIterator[bytes]:
    try:
        for event in events.opening():
            yield _sse_event(event)
        item: StreamItem | None = first
        while item is not None:
            if isinstance(item, str):
                for event in events.pieces(item):
                    yield _sse_event(event)
            item = await items.get()
        try:
            result = job.result()
        except Exception as exc:  # the stream has started: the error is its last event
            yield _sse_event(_error_event(exc))
            return
        for event in events.closing(result):
            yield _sse_event(event)
    finally:
        if not job.done():  # the client went away mid-stream
            job.cancel()
