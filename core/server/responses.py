"""`POST /v1/responses` (and `GET /v1/responses/{id}`): OpenAI's Responses API over the chat
route's machinery.

A request is turned into the chat request it means (input items → messages, function tools →
chat tools, `text.format` → `response_format`), so sampling defaults, grammars, the job queue
and cancellation are the chat route's own; the reply is rebuilt as a `response` object, or
streamed as the typed events (`event: <type>` + `data:`, no `[DONE]`) the SDK reads.

Responses are kept in memory, the last `STORED_RESPONSES` of them, so `previous_response_id`
continues a conversation for as long as the server runs.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.service import EngineService, Job
from hearthside.core.server import structured
from hearthside.core.server.app import (
    ClientGone,
    GenerationPlan,
    ServerSettings,
    _chat_plan,
    _error_body,
    _first_event,
    _submit,
    _thread_safe_put,
    _wait_unless_client_leaves,
    sse_response,
)
from hearthside.core.server.model_load import model_for_request
from hearthside.core.server.model_pool import ModelPool
from hearthside.core.server.schemas import ChatCompletionRequest, _Request, _TextChecked
from hearthside.core.server.security import openai_error

STORED_RESPONSES = 256
# Each stored response holds its whole conversation, so a long chain of turns adds up: the
# store also keeps to this many characters of JSON in all (the oldest go first).
STORED_CHARS = 64 << 20
MAX_METADATA_PAIRS, MAX_METADATA_KEY_CHARS, MAX_METADATA_VALUE_CHARS = 16, 64, 512
INCOMPLETE_STOPS = {"length", "context_full"}


# ---- the request ---------------------------------------------------------------------------


class ContentPart(_Request):
    type: str
    text: str | None = None


class MessageItem(_Request):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]


class FunctionCallItem(_Request):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str


class FunctionCallOutputItem(_Request):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]


def _item_type(item: Any) -> str:
    # An input message may leave out its `type` (EasyInputMessage in the spec).
    if isinstance(item, dict):
        return str(item.get("type", "message"))
    return str(getattr(item, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_type),
]
INPUT_ITEM: TypeAdapter[MessageItem | FunctionCallItem | FunctionCallOutputItem] = TypeAdapter(
    InputItem
)


class ResponsesRequest(_TextChecked):
    model: str | None = None
    input: str | list[dict[str, Any]]  # items checked one by one, for errors that name them
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool = True
    metadata: dict[str, str] | None = Field(default=None, max_length=MAX_METADATA_PAIRS)

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for key, text in (value or {}).items():
            if len(key) > MAX_METADATA_KEY_CHARS or len(text) > MAX_METADATA_VALUE_CHARS:
                raise ValueError(
                    f"keys may have at most {MAX_METADATA_KEY_CHARS} characters and values "
                    f"{MAX_METADATA_VALUE_CHARS} (OpenAI's limits)"
                )
        return value


class RequestRefused(Exception):
    """A request this route cannot serve, answered with an OpenAI-shaped 400."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code

    def response(self) -> JSONResponse:
        return openai_error(
            400, self.message, type_="invalid_request_error", param=self.param, code=self.code
        )


# ---- the store -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]
    conversation: tuple[dict[str, Any], ...]  # chat messages, input and output, no instructions


class ResponseStore:
    """The last `capacity` responses, `max_chars` of JSON at most; touched only on the
    server's event loop."""

    def __init__(self, capacity: int = STORED_RESPONSES, max_chars: int = STORED_CHARS) -> None:
        self.capacity = capacity
        self.max_chars = max_chars
        self._responses: OrderedDict[str, tuple[StoredResponse, int]] = OrderedDict()
        self._chars = 0

    def get(self, response_id: str) -> StoredResponse | None:
        kept = self._responses.get(response_id)
        return kept[0] if kept is not None else None

    def keep(self, response: StoredResponse) -> None:
        size = len(json.dumps([response.body, response.conversation]))
        self._responses[response.body["id"]] = (response, size)
        self._chars += size
        while len(self._responses) > self.capacity or self._chars > self.max_chars:
            _, (_, dropped) = self._responses.popitem(last=False)
            self._chars -= dropped


Keeper = Callable[[StoredResponse], None]


def _not_found(response_id: str) -> RequestRefused:
    # Word for word what OpenAI answers (400, not 404), as clients match the code.
    return RequestRefused(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


# ---- request → chat request ----------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """What one request adds to a conversation, as chat messages."""

    history: tuple[dict[str, Any], ...]  # from previous_response_id
    new_messages: tuple[dict[str, Any], ...]  # from input

    def conversation_with(self, output: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
        return (*self.history, *self.new_messages, *_output_messages(output))


def turn_of(body: ResponsesRequest, store: ResponseStore) -> Turn:
    history: tuple[dict[str, Any], ...] = ()
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            raise _not_found(body.previous_response_id)
        history = previous.conversation
    return Turn(history, tuple(_input_messages(body.input)))


def _input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    messages: list[dict[str, Any]] = []
    for index, raw in enumerate(items):
        where = f"input[{index}]"
        item = _parsed_item(raw, where)
        if isinstance(item, FunctionCallItem):
            _add_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem):
            output = _text_of(item.output, f"{where}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
        else:
            content = _text_of(item.content, f"{where}.content")
            messages.append({"role": item.role, "content": content})
    return messages


def _parsed_item(raw: dict[str, Any], where: str) -> Any:
    try:
        return INPUT_ITEM.validate_python(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "union_tag_invalid":
            raise RequestRefused(
                f"{where} has type {_item_type(raw)!r}; Hearthside takes message, function_call "
                "and function_call_output items.",
                param=f"{where}.type",
            ) from None
        # The location starts with the item's type (the union's tag); the field comes after.
        path = "".join(_path_part(part) for part in first["loc"][1:])
        raise RequestRefused(f"{where}{path}: {first['msg']}", param=f"{where}{path}") from None


def _path_part(part: str | int) -> str:
    return f"[{part}]" if isinstance(part, int) else f".{part}"


def _add_call(messages: list[dict[str, Any]], item: FunctionCallItem) -> None:
    """Calls that follow each other are one assistant turn, as in chat."""
    function = {"name": item.name, "arguments": item.arguments}
    call = {"id": item.call_id, "type": "function", "function": function}
    if messages and messages[-1]["role"] == "assistant" and messages[-1].get("tool_calls"):
        messages[-1]["tool_calls"].append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def _text_of(content: str | list[ContentPart], where: str) -> str:
    if isinstance(content, str):
        return content
    for index, part in enumerate(content):
        if part.type not in ("input_text", "output_text"):
            raise RequestRefused(
                f"{where}[{index}] has type {part.type!r}; the loaded model reads text only "
                "(input_text and output_text parts).",
                param=f"{where}[{index}].type",
                code="unsupported_content",
            )
    return "".join(part.text or "" for part in content)


def chat_request(
    body: ResponsesRequest, turn: Turn, settings: ServerSettings
) -> ChatCompletionRequest:
    """The ChatCompletionRequest this request means (instructions first, then the history)."""
    limit = body.max_output_tokens
    if limit is not None and limit > settings.max_tokens_cap:
        raise RequestRefused(
            f"max_output_tokens may be at most {settings.max_tokens_cap}.",
            param="max_output_tokens",
        )
    if not turn.history and not turn.new_messages:
        raise RequestRefused("input must hold at least one item.", param="input")
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    fields = {
        "messages": [*instructions, *turn.history, *turn.new_messages],
        "max_completion_tokens": limit,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "tools": _chat_tools(body.tools),
        "tool_choice": _chat_tool_choice(body.tool_choice),
        "parallel_tool_calls": body.parallel_tool_calls,
        "response_format": _response_format(body.text),
    }
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestRefused(f"{where}: {first['msg']}") from None


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    if tools is None:
        return None
    chat_tools = []
    for index, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise RequestRefused(
                f"tools[{index}] is a {tool.get('type')!r} tool; Hearthside runs function "
                "tools only (the hosted tools live on OpenAI's servers).",
                param=f"tools[{index}].type",
            )
        function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
        chat_tools.append({"type": "function", "function": function})
    return chat_tools


def _chat_tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.get("type") != "function":
        raise RequestRefused(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}.',
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": choice.get("name")}}


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    text_format = (text or {}).get("format")
    if text_format is None:
        return None
    if not isinstance(text_format, dict):
        raise RequestRefused("text.format must be an object with a `type`.", param="text.format")
    if text_format.get("type") != "json_schema":
        return text_format
    keys = ("name", "description", "schema", "strict")
    return {
        "type": "json_schema",
        "json_schema": {k: text_format[k] for k in keys if k in text_format},
    }


# ---- output items and the response object --------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status != "in_progress" else [],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items as the chat messages a later turn reads."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "function_call":
            _add_call(messages, FunctionCallItem.model_validate(item))
        else:
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": "assistant", "content": text})
    return messages


def _usage(result: GenerationResult) -> dict[str, Any]:
    metrics = result.metrics
    return {
        "input_tokens": metrics.prompt_tokens,
        "input_tokens_details": {
            # Reused from the KV cache / evaluated now, and kept there for the next request.
            "cached_tokens": max(0, metrics.prompt_tokens - metrics.prompt_tokens_evaluated),
            "cache_write_tokens": metrics.prompt_tokens_evaluated,
        },
        "output_tokens": metrics.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": metrics.prompt_tokens + metrics.completion_tokens,
    }


def _status_of(result: GenerationResult) -> str:
    return "incomplete" if result.metrics.stop_reason in INCOMPLETE_STOPS else "completed"


@dataclass
class ResponseBuilder:
    """The `response` objects of one request: the echo of what was asked, plus the output."""

    body: ResponsesRequest
    plan: GenerationPlan
    model_id: str
    id: str = field(default_factory=lambda: _new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        result: GenerationResult | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        sampling = self.plan.sampling
        body = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.body.instructions,
            "max_output_tokens": self.body.max_output_tokens,
            "model": self.model_id,
            "output": output,
            "parallel_tool_calls": self.body.parallel_tool_calls,
            "previous_response_id": self.body.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.body.store,
            "temperature": sampling.temperature,
            "text": {"format": (self.body.text or {}).get("format") or {"type": "text"}},
            "tool_choice": self.body.tool_choice or "auto",
            "tools": [_echoed_tool(tool) for tool in self.body.tools or ()],
            "top_p": sampling.top_p,
            "truncation": "disabled",
            "metadata": self.body.metadata or {},
        }
        if result is not None:  # the spec has no null usage: it is left out until known
            body["usage"] = _usage(result)
        return body

    def whole(self, result: GenerationResult) -> dict[str, Any]:
        status = _status_of(result)
        calls = self._tool_calls(result.text, cut_off=status == "incomplete")
        if calls is None:
            output = [message_item(_new_id("msg"), result.text, status)]
        elif not calls:  # cut off before a call's name: an empty message, as a stream ends
            output = [message_item(_new_id("msg"), "", status)]
        else:
            output = [
                function_call_item(_new_id("fc"), call.id, call.name, call.arguments, status)
                for call in calls
            ]
        return self.response(status, output, result)

    def _tool_calls(self, text: str, cut_off: bool) -> tuple[structured.ToolCall, ...] | None:
        """The reply's calls; one the token limit cut short as its stream sends it (#34)."""
        tools = self.plan.tools
        if not tools:
            return None
        if cut_off:
            return structured.cut_off_tool_calls(text, tools)
        return structured.parse_tool_calls(text, tools)


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as OpenAI echoes it: every field present. `strict` defaults to true
    because the grammar always holds the arguments to their schema."""
    return {
        "type": "function",
        "name": tool.get("name"),
        "description": tool.get("description"),
        "parameters": tool.get("parameters", structured.NO_PARAMETERS),
        "strict": tool.get("strict", True),
    }


# ---- streams ------------------------------------------------------------------------------


@dataclass
class _OpenItem:
    """The output item a stream is adding to: a message's text or a call's arguments."""

    kind: str  # "message" | "function_call"
    id: str
    output_index: int
    call_id: str = ""
    name: str = ""
    text: str = ""

    def item(self, status: str) -> dict[str, Any]:
        if self.kind == "message":
            return message_item(self.id, self.text, status)
        return function_call_item(self.id, self.call_id, self.name, self.text, status)


class ResponseEvents:
    """Turns the engine's text pieces into Responses stream events, and keeps the output
    items they build, so the final `response.completed` holds exactly what was streamed."""

    def __init__(self, builder: ResponseBuilder) -> None:
        self.builder = builder
        tools = builder.plan.tools
        self._tool_stream = structured.ToolCallStream(tools) if tools else None
        self._sequence = itertools.count()
        self._open: _OpenItem | None = None
        self.output: list[dict[str, Any]] = []  # finished items

    def opening(self) -> list[dict[str, Any]]:
        in_progress = self.builder.response("in_progress", [])
        return [
            self._event("response.created", response=in_progress),
            self._event("response.in_progress", response=in_progress),
        ]

    def pieces(self, piece: str) -> list[dict[str, Any]]:
        if self._tool_stream is None:
            return self._from_deltas([{"content": piece}])
        return self._from_deltas(self._tool_stream.feed(piece))

    def closing(self, result: GenerationResult) -> list[dict[str, Any]]:
        events = []
        if self._tool_stream is not None:
            cut_off = _status_of(result) == "incomplete"
            deltas, _finish = self._tool_stream.finish(cut_off=cut_off)
            events += self._from_deltas(deltas)
        if self._open is None and not self.output:  # an empty reply is still a message
            events += self._open_message()
        status = _status_of(result)
        events += self._close(status)
        final = self.builder.response(status, self.output, result)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        return [*events, self._event(kind, response=final)]

    def failed(self, exc: Exception) -> list[dict[str, Any]]:
        error = _error_body(exc)
        code = "invalid_prompt" if error["type"] == "invalid_request_error" else "server_error"
        failed = self.builder.response(
            "failed", self.output, error={"code": code, "message": error["message"]}
        )
        return [self._event("response.failed", response=failed)]

    def _from_deltas(self, deltas: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        for delta in deltas:
            if delta.get("content"):
                events += self._text(delta["content"])
            for call in delta.get("tool_calls", ()):
                events += self._call(call)
        return events

    def _text(self, piece: str) -> list[dict[str, Any]]:
        events = (
            [] if self._open_is("message") else [*self._close("completed"), *self._open_message()]
        )
        assert self._open is not None
        self._open.text += piece
        return [
            *events,
            self._event("response.output_text.delta", **self._at_text(), delta=piece, logprobs=[]),
        ]

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        function = call.get("function", {})
        if "id" in call:  # a new call is announced with its id and whole name
            events += self._close("completed")
            self._open = _OpenItem(
                "function_call",
                _new_id("fc"),
                len(self.output),
                call_id=call["id"],
                name=function.get("name", ""),
            )
            events.append(self._item_event("response.output_item.added", "in_progress"))
        arguments = function.get("arguments", "")
        if arguments and self._open_is("function_call"):
            assert self._open is not None
            self._open.text += arguments
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=self._open.id,
                    output_index=self._open.output_index,
                    delta=arguments,
                )
            )
        return events

    def _open_message(self) -> list[dict[str, Any]]:
        self._open = _OpenItem("message", _new_id("msg"), len(self.output))
        return [
            self._item_event("response.output_item.added", "in_progress"),
            self._event("response.content_part.added", **self._at_text(), part=_text_part("")),
        ]

    def _close(self, status: str) -> list[dict[str, Any]]:
        if self._open is None:
            return []
        opened = self._open
        if opened.kind == "message":
            events = [
                self._event(
                    "response.output_text.done", **self._at_text(), text=opened.text, logprobs=[]
                ),
                self._event(
                    "response.content_part.done", **self._at_text(), part=_text_part(opened.text)
                ),
            ]
        else:
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=opened.id,
                    output_index=opened.output_index,
                    name=opened.name,
                    arguments=opened.text,
                )
            ]
        events.append(self._item_event("response.output_item.done", status))
        self.output.append(opened.item(status))
        self._open = None
        return events

    def _open_is(self, kind: str) -> bool:
        return self._open is not None and self._open.kind == kind

    def _at_text(self) -> dict[str, Any]:
        assert self._open is not None
        return {
            "item_id": self._open.id,
            "output_index": self._open.output_index,
            "content_index": 0,
        }

    def _item_event(self, kind: str, status: str) -> dict[str, Any]:
        assert self._open is not None
        return self._event(kind, output_index=self._open.output_index, item=self._open.item(status))

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(self._sequence), **fields}


def _sse_event(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


# ---- the routes ---------------------------------------------------------------------------


def add_responses_routes(
    app: FastAPI, settings: ServerSettings, service: EngineService, pool: ModelPool
) -> None:
    store = ResponseStore()

    @app.post("/v1/responses")
    async def create_response(body: ResponsesRequest, request: Request) -> Response:
        if service.is_remote:
            return openai_error(
                400,
                "The Responses API is not available while Hearthside relays to a remote "
                "server; use /v1/chat/completions.",
                type_="invalid_request_error",
                code="unsupported_with_remote_engine",
            )
        try:
            turn = turn_of(body, store)
            chat = chat_request(body, turn, settings)
        except RequestRefused as refusal:
            return refusal.response()
        # Off the event loop: loading a model on demand, or a large (bounded) schema.
        model = await model_for_request(pool, body.model, request)
        with model:  # held, never unloaded, until its job is queued (answered, if whole)
            named = replace(settings, model_id=model.id)
            plan = await run_in_threadpool(_chat_plan, chat, named)
            builder = ResponseBuilder(body, plan, model.id)
            keep = store.keep if body.store else None
            if body.stream:
                return await _respond_streaming(builder, turn, keep, request, model.service)
            job = _submit(plan, model.service, None)
            try:
                result = await _wait_unless_client_leaves(job, request)
            except ClientGone:
                return Response(status_code=499)
            response = builder.whole(result)
            if keep is not None:
                keep(StoredResponse(response, turn.conversation_with(response["output"])))
            return JSONResponse(response)

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            return openai_error(
                404,
                f"Response with id '{response_id}' not found.",
                type_="invalid_request_error",
                param="response_id",
            )
        return JSONResponse(stored.body)


async def _respond_streaming(
    builder: ResponseBuilder,
    turn: Turn,
    keep: Keeper | None,
    request: Request,
    service: EngineService,
) -> Response:
    pieces: asyncio.Queue[str | None] = asyncio.Queue()
    put = _thread_safe_put(pieces)
    job = _submit(builder.plan, service, put)
    job.future.add_done_callback(lambda _f: put(None))
    try:
        first = await _first_event(pieces, job, request)
    except ClientGone:
        return Response(status_code=499)
    if first is None:
        job.result()  # a request refused before its first token gets a proper status
    return sse_response(_stream(job, first, pieces, ResponseEvents(builder), turn, keep))


async def _stream(
    job: Job[GenerationResult],
    first: str | None,
    pieces: asyncio.Queue[str | None],
    events: ResponseEvents,
    turn: Turn,
    keep: Keeper | None,
) -> AsyncIterator[bytes]:
    try:
        for event in events.opening():
            yield _sse_event(event)
        piece = first
        while piece is not None:
            for event in events.pieces(piece):
                yield _sse_event(event)
            piece = await pieces.get()
        try:
            result = job.result()
        except Exception as exc:  # the stream has started: the failure is its last event
            for event in events.failed(exc):
                yield _sse_event(event)
            return
        closing = events.closing(result)
        if keep is not None:
            final = closing[-1]["response"]
            keep(StoredResponse(final, turn.conversation_with(final["output"])))
        for event in closing:
            yield _sse_event(event)
    finally:
        if not job.done():  # the client went away mid-stream
            job.cancel()
