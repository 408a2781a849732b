"""Issue 34's edges of structured replies, through the real `openai` client against a real
server on loopback serving the real default model (SmolLM2 135M): a tool call cut off by
`max_tokens` reads the same whole and streamed, a schema keyword the grammar cannot enforce is
refused before any token, and a client that leaves a structured request is not answered again
and again. Generations are counted on the real worker engine, which the service loads."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import WorkerEngine
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from hearthside.core.server.structured import (
    ToolCallStream,
    cut_off_tool_calls,
    parse_tools,
)
from tests.core.server.test_api import KEY, Running, free_port
from tests.core.server.test_parallel_tools import TOOLS, TWO_CALLS

MODEL = "smollm2"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
IDLE_DEADLINE_S = 20.0


class CountingWorkerEngine(WorkerEngine):
    """The real worker engine, counting the chat generations it is asked for."""

    chats = 0
    _lock = threading.Lock()

    def chat(self, *args: Any, **kwargs: Any) -> Any:
        with CountingWorkerEngine._lock:
            CountingWorkerEngine.chats += 1
        return super().chat(*args, **kwargs)


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Running]:
    service = EngineService(max_queue=8, engine_factory=CountingWorkerEngine).start()
    service.load(EngineConfig(model_path=str(chat_model_file), n_ctx=2048)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id=MODEL)
    controller = ServerController(settings, service)
    controller.start()
    try:
        yield Running(controller, service)
    finally:
        controller.stop()
        service.stop()


def wait_until_idle(service: EngineService) -> None:
    deadline = time.monotonic() + IDLE_DEADLINE_S
    while (service.busy or service.waiting_jobs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not service.busy, "the request the client left was still generating"


def streamed_calls(chunks: Any) -> tuple[list[dict[str, str]], str | None, str]:
    """The calls, finish_reason and content a client assembles from a chat stream."""
    calls: list[dict[str, str]] = []
    finish, content = None, ""
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for part in choice.delta.tool_calls or ():
            if part.index == len(calls):
                calls.append({"name": part.function.name, "arguments": ""})
            calls[part.index]["arguments"] += part.function.arguments or ""
    return calls, finish, content


# ---- a call cut off by max_tokens ----------------------------------------------------------


@pytest.mark.parametrize("max_tokens", [3, 15, 19], ids=["in the head", "in arguments", "later"])
def test_a_cut_off_call_reads_the_same_whole_and_streamed(server: Running, max_tokens: int) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK_WEATHER,
        "tools": [WEATHER],
        "tool_choice": NAMED,
        "temperature": 0,
        "max_tokens": max_tokens,
    }
    whole = server.client.chat.completions.create(**request)
    calls, finish, content = streamed_calls(
        server.client.chat.completions.create(**request, stream=True)
    )
    choice = whole.choices[0]
    assert choice.finish_reason == "length" and finish == "length"
    assert choice.message.content is None, choice.message.content  # never call syntax
    assert content == ""
    whole_calls = [
        {"name": call.function.name, "arguments": call.function.arguments}  # type: ignore[union-attr]
        for call in choice.message.tool_calls or ()
    ]
    assert whole_calls == calls
    if max_tokens > 3:  # past the name: the call is there, its arguments unfinished
        assert [call["name"] for call in calls] == ["get_weather"]
        assert calls[0]["arguments"].startswith("{")
        with pytest.raises(ValueError):
            json.loads(calls[0]["arguments"])


def test_every_cut_of_two_calls_reads_the_same_whole_and_streamed() -> None:
    for end in range(len(TWO_CALLS)):
        text = TWO_CALLS[:end]
        whole = cut_off_tool_calls(text, TOOLS)
        stream = ToolCallStream(TOOLS)
        deltas = [delta for piece in text for delta in stream.feed(piece)]  # char by char
        rest, _finish = stream.finish(cut_off=True)
        deltas += rest
        assert all("content" not in delta for delta in deltas), (text, deltas)
        if not text.strip():
            assert whole is None
            continue
        assert whole is not None
        streamed: list[tuple[str, str]] = []
        for delta in deltas:
            for part in delta["tool_calls"]:
                if part["index"] == len(streamed):
                    streamed.append((part["function"]["name"], ""))
                name, arguments = streamed[part["index"]]
                streamed[part["index"]] = (name, arguments + part["function"]["arguments"])
        assert [(call.name, call.arguments) for call in whole] == streamed, text


def test_plain_text_cut_off_stays_content() -> None:
    assert cut_off_tool_calls("The weather in Par", parse_tools([WEATHER])) is None


# ---- keywords the grammar cannot enforce ---------------------------------------------------


@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_multiple_of_is_refused_at_once_without_generating(server: Running, where: str) -> None:
    schema = {
        "type": "object",
        "properties": {"count": {"type": "integer", "multipleOf": 5}},
        "required": ["count"],
    }
    extra: dict[str, Any]
    if where == "tools":
        tool = {"type": "function", "function": {"name": "order", "parameters": schema}}
        extra = {"tools": [tool], "tool_choice": "required"}
    else:
        json_schema = {"name": "n", "schema": schema}
        extra = {"response_format": {"type": "json_schema", "json_schema": json_schema}}
    before = CountingWorkerEngine.chats
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError) as refused:
        server.client.chat.completions.create(
            model=MODEL, messages=ASK_WEATHER, max_tokens=64, **extra
        )
    assert time.monotonic() - started < 1.0
    assert CountingWorkerEngine.chats == before  # no token generated
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "unenforceable_schema"
    assert "`multipleOf` (at $.properties.count)" in error["message"]
    assert "Remove `multipleOf`" in error["message"]


# ---- a client that leaves ------------------------------------------------------------------

HELD_SCHEMA = {  # not enforced by the grammar alone (uniqueItems): the reply is held back
    "type": "object",
    "properties": {"lines": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    "required": ["lines"],
}
LIVE_SCHEMA = {  # enforced by the grammar alone: the reply streams as it is generated
    "type": "object",
    "properties": {"lines": {"type": "array", "items": {"type": "string"}}},
    "required": ["lines"],
}


def long_story(schema: dict[str, Any], stream: bool) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        "temperature": 0,
        "max_tokens": 1500,
        "stream": stream,
    }


def leave_after_a_second(http: httpx.Client, body: dict[str, Any]) -> None:
    with pytest.raises(httpx.ReadTimeout):  # a held-back reply sends nothing until it passed
        http.post("/chat/completions", json=body, timeout=1.5)


def leave_after_two_chunks(http: httpx.Client, body: dict[str, Any]) -> None:
    with http.stream("POST", "/chat/completions", json=body) as reply:
        lines = reply.iter_lines()
        for _ in range(4):  # the opening chunk, a blank line, the first text chunk, ...
            next(lines)


@pytest.mark.parametrize(
    ("schema", "stream", "leave"),
    [
        (HELD_SCHEMA, False, leave_after_a_second),
        (HELD_SCHEMA, True, leave_after_a_second),
        (LIVE_SCHEMA, True, leave_after_two_chunks),
    ],
    ids=["held back, whole", "held back, streamed", "live stream"],
)
def test_a_client_that_leaves_a_structured_request_is_not_answered_again(
    server: Running,
    caplog: pytest.LogCaptureFixture,
    schema: dict[str, Any],
    stream: bool,
    leave: Any,
) -> None:
    caplog.set_level(logging.WARNING)
    before = CountingWorkerEngine.chats
    with server.http() as http:
        leave(http, long_story(schema, stream))
    left_at = time.monotonic()
    wait_until_idle(server.service)
    assert time.monotonic() - left_at < 6.0  # cancelled, not generated to the end
    time.sleep(0.3)  # a retry would have started by now
    wait_until_idle(server.service)
    assert CountingWorkerEngine.chats == before + 1  # one generation, cancelled, no retry
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert not noisy, [r.getMessage() for r in noisy]
