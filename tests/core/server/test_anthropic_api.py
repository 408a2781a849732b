"""Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) with the real
`anthropic` SDK and httpx against a real server on loopback, serving the real default model
(SmolLM2 135M) through the shared EngineService."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from tests.core.server.test_api import KEY, free_port

pytestmark = pytest.mark.beside

MODEL = "smollm2-135m"
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}
WEATHER: Any = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": WEATHER_SCHEMA,
}
FORCE_WEATHER: Any = {"type": "tool", "name": "get_weather"}
HUGE_STRING = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10**6}}}
# The SDK no longer takes sampling fields (Anthropic's newest models ignore them); the server
# still reads them, as llama-server does, so tests that compare replies send temperature 0.
GREEDY: dict[str, Any] = {"model": MODEL, "extra_body": {"temperature": 0}}
GREEDY_JSON: dict[str, Any] = {"model": MODEL, "temperature": 0}
ANTHROPIC_STREAM_EVENTS = {
    "message_start",
    "content_block_start",
    "ping",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
}


class Server:
    def __init__(self, controller: ServerController, service: EngineService) -> None:
        self.controller = controller
        self.service = service
        self.port = controller.settings.port
        self.root = f"http://127.0.0.1:{self.port}"
        self.client = anthropic.Anthropic(base_url=self.root, api_key=KEY, max_retries=0)

    def http(self, **headers: str) -> httpx.Client:
        return httpx.Client(base_url=self.root, headers=headers, timeout=60)

    def keyed(self) -> httpx.Client:
        return self.http(**{"x-api-key": KEY})


@contextmanager
def serving(model: Path) -> Iterator[Server]:
    service = EngineService(max_queue=8).start()
    service.load(EngineConfig(model_path=str(model), n_ctx=2048)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id=MODEL, max_tokens_cap=512)
    controller = ServerController(settings, service)
    controller.start()
    try:
        yield Server(controller, service)
    finally:
        controller.stop()
        service.stop()


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Server]:
    with serving(chat_model_file) as running:
        yield running


def as_json(request: dict[str, Any]) -> dict[str, Any]:
    """The body the SDK sends for `request` (its `extra_body` merged in)."""
    fields = {key: value for key, value in request.items() if key != "extra_body"}
    return {**fields, **request.get("extra_body", {})}


def raw_events(server: Server, request: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events as sent for `request`, its framing checked: each `event:` line
    names the `type` of the `data:` payload that follows it."""
    body = {**as_json(request), "stream": True}
    events = []
    with server.keyed() as http, http.stream("POST", "/v1/messages", json=body) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in reply.iter_lines():
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                assert event["type"] == name
                events.append(event)
    return events


def text_of(reply: Any) -> str:
    """The text of a reply that is one text block."""
    (block,) = reply.content
    assert block.type == "text"
    return str(block.text)


def assert_anthropic_error(reply: httpx.Response, status: int, kind: str) -> str:
    assert reply.status_code == status, reply.text
    body = reply.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    return str(body["error"]["message"])


# ---- replies ---------------------------------------------------------------------------------


def test_a_plain_message_has_anthropics_shape_and_usage(server: Server) -> None:
    reply = server.client.messages.create(
        max_tokens=16, system="Answer briefly.", messages=QUESTION, **GREEDY
    )
    assert reply.id.startswith("msg_") and reply.type == "message" and reply.role == "assistant"
    assert reply.model == MODEL
    (block,) = reply.content
    assert block.type == "text" and block.text
    assert reply.stop_reason in ("end_turn", "max_tokens") and reply.stop_sequence is None
    assert reply.usage.input_tokens > 0 and 0 < reply.usage.output_tokens <= 16


def test_max_tokens_ends_the_reply_with_stop_reason_max_tokens(server: Server) -> None:
    story: Any = [{"role": "user", "content": "Tell me a long story about a dragon."}]
    reply = server.client.messages.create(max_tokens=5, messages=story, **GREEDY)
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == 5


def test_a_stop_sequence_is_named_in_the_reply(server: Server) -> None:
    count: Any = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
    free = server.client.messages.create(max_tokens=40, messages=count, **GREEDY)
    text = text_of(free)
    assert "3" in text, text  # the stop below comes up in the greedy reply
    stopped = server.client.messages.create(
        max_tokens=40, messages=count, stop_sequences=["3", "never-written"], **GREEDY
    )
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "3"
    assert text_of(stopped) == text[: text.index("3")]


def test_count_tokens_agrees_with_the_usage_of_the_same_request(server: Server) -> None:
    request: dict[str, Any] = {"system": "Answer briefly.", "messages": QUESTION}
    counted = server.client.messages.count_tokens(model=MODEL, **request)
    reply = server.client.messages.create(max_tokens=4, **request, **GREEDY)
    assert counted.input_tokens == reply.usage.input_tokens
    with_tools = server.client.messages.count_tokens(model=MODEL, tools=[WEATHER], **request)
    assert with_tools.input_tokens > counted.input_tokens  # the tool prompt counts too


# ---- streams ---------------------------------------------------------------------------------


def test_a_stream_sends_anthropics_events_in_order(server: Server) -> None:
    request: dict[str, Any] = {"max_tokens": 12, "messages": QUESTION, **GREEDY}
    whole = server.client.messages.create(**request)
    events = raw_events(server, request)
    kinds = [event["type"] for event in events]
    deltas = [event for event in events if event["type"] == "content_block_delta"]
    assert kinds == [
        "message_start",
        "content_block_start",
        "ping",
        *["content_block_delta"] * len(deltas),
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert start["id"].startswith("msg_") and start["content"] == [] and start["model"] == MODEL
    assert (
        start["stop_reason"] is None and start["usage"]["input_tokens"] == whole.usage.input_tokens
    )
    assert events[1] == {"type": "content_block_start", "index": 0,
                         "content_block": {"type": "text", "text": ""}}  # fmt: skip
    assert {(d["index"], d["delta"]["type"]) for d in deltas} == {(0, "text_delta")}
    assert "".join(d["delta"]["text"] for d in deltas) == text_of(whole)
    assert events[-3] == {"type": "content_block_stop", "index": 0}
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": whole.stop_reason, "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == whole.usage.output_tokens


def test_the_sdks_stream_helper_assembles_the_same_message(server: Server) -> None:
    request: dict[str, Any] = {"max_tokens": 12, "messages": QUESTION, **GREEDY}
    whole = server.client.messages.create(**request)
    with server.client.messages.stream(**request) as stream:
        kinds = {event.type for event in stream}
        final = stream.get_final_message()
    assert kinds <= ANTHROPIC_STREAM_EVENTS | {"text"}  # "text": the helper's own event
    assert text_of(final) == text_of(whole)
    assert final.stop_reason == whole.stop_reason
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.usage.output_tokens == whole.usage.output_tokens


# ---- tools -----------------------------------------------------------------------------------


def test_a_forced_tool_call_is_a_tool_use_block_that_follows_the_schema(server: Server) -> None:
    reply = server.client.messages.create(
        max_tokens=60,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        **GREEDY,
    )
    assert reply.stop_reason == "tool_use"
    (call,) = reply.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER_SCHEMA)


def test_a_streamed_tool_call_sends_input_json_deltas(server: Server) -> None:
    request: dict[str, Any] = {
        "max_tokens": 60,
        "messages": [{"role": "user", "content": "What is the weather in Rome?"}],
        "tools": [WEATHER],
        "tool_choice": FORCE_WEATHER,
        **GREEDY,
    }
    whole = server.client.messages.create(**request)
    events = raw_events(server, request)
    (start,) = [event for event in events if event["type"] == "content_block_start"]
    block = start["content_block"]
    assert block["type"] == "tool_use" and block["name"] == "get_weather" and block["input"] == {}
    deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
    assert {delta["type"] for delta in deltas} == {"input_json_delta"}
    streamed_input = json.loads("".join(delta["partial_json"] for delta in deltas))
    (call,) = whole.content
    assert call.type == "tool_use" and streamed_input == call.input
    assert events[-2]["delta"]["stop_reason"] == "tool_use"


def test_a_tool_result_round_trip(server: Server) -> None:
    question: Any = {"role": "user", "content": "What is the weather in Paris?"}
    first = server.client.messages.create(
        max_tokens=60,
        messages=[question],
        tools=[WEATHER],
        tool_choice=FORCE_WEATHER,
        **GREEDY,
    )
    (call,) = first.content
    assert call.type == "tool_use"

    def turn(result: str) -> Any:
        use = {"type": "tool_use", "id": call.id, "name": call.name, "input": call.input}
        answer = {"type": "tool_result", "tool_use_id": call.id, "content": result}
        return [question, {"role": "assistant", "content": [use]},
                {"role": "user", "content": [answer]}]  # fmt: skip

    messages = turn("18 degrees and sunny")
    reply = server.client.messages.create(
        max_tokens=24,
        messages=messages,
        tools=[WEATHER],
        **GREEDY,
    )
    assert reply.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert reply.usage.input_tokens > first.usage.input_tokens  # the call and result went in
    counted = server.client.messages.count_tokens(
        model=MODEL,
        messages=messages,
        tools=[WEATHER],
    )
    assert counted.input_tokens == reply.usage.input_tokens
    longer = server.client.messages.count_tokens(
        model=MODEL,
        messages=turn("18 degrees and sunny, with a light breeze from the west"),
        tools=[WEATHER],
    )
    assert longer.input_tokens > counted.input_tokens  # the result's text is in the prompt


# ---- refusals, in Anthropic's shape ----------------------------------------------------------


def test_a_missing_key_is_a_401_authentication_error(server: Server) -> None:
    with server.http() as http:
        reply = http.post(
            "/v1/messages", json={"max_tokens": 4, "messages": QUESTION, **GREEDY_JSON}
        )
    message = assert_anthropic_error(reply, 401, "authentication_error")
    assert "x-api-key" in message
    wrong = anthropic.Anthropic(base_url=server.root, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as error:
        wrong.messages.create(max_tokens=4, messages=QUESTION, **GREEDY)
    assert isinstance(error.value.body, dict) and error.value.body["type"] == "error"


def test_the_key_is_taken_from_x_api_key(server: Server) -> None:
    body = {"max_tokens": 2, "messages": QUESTION, **GREEDY_JSON}
    with server.keyed() as http:
        assert http.post("/v1/messages", json=body).status_code == 200
    both = {"x-api-key": "wrong-key", "Authorization": f"Bearer {KEY}"}
    with server.http(**both) as http:  # a wrong key beside the right one is still wrong
        assert_anthropic_error(http.post("/v1/messages", json=body), 401, "authentication_error")


def test_a_foreign_host_is_a_403_permission_error(server: Server) -> None:
    with server.http(**{"x-api-key": KEY, "Host": f"evil.example:{server.port}"}) as http:
        reply = http.post(
            "/v1/messages", json={"max_tokens": 4, "messages": QUESTION, **GREEDY_JSON}
        )
    assert_anthropic_error(reply, 403, "permission_error")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_tokens": None}, "max_tokens"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "stop_sequences"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, "nope"),
        ({"tools": [{**WEATHER, "input_schema": HUGE_STRING}]}, "maxLength"),
    ],
)
def test_a_bad_request_is_a_400_that_names_the_field(
    server: Server, change: dict[str, Any], named: str
) -> None:
    body = {"max_tokens": 4, "messages": QUESTION, **GREEDY_JSON, **change}
    body = {key: value for key, value in body.items() if value is not None}
    with server.keyed() as http:
        reply = http.post("/v1/messages", json=body)
    assert named in assert_anthropic_error(reply, 400, "invalid_request_error")


def test_a_prompt_longer_than_the_context_is_refused_before_a_stream_starts(
    server: Server,
) -> None:
    long_text = "word " * 4000  # past the 2048-token context
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": long_text}], **GREEDY_JSON}
    with server.keyed() as http:
        reply = http.post("/v1/messages", json={**body, "stream": True})
    assert "context" in assert_anthropic_error(reply, 400, "invalid_request_error")


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_a_body_that_is_not_utf8_json_is_a_400(server: Server, route: str) -> None:
    # Bytes schemathesis sent: FastAPI gives up on them before validation (an HTTPException).
    body = b')"c~\xff\x1f\x1c\x0f\x07x@\xfe}\xfa'
    headers = {"Content-Type": "application/json"}
    with server.keyed() as http:
        reply = http.post(route, content=body, headers=headers)
    assert "JSON" in assert_anthropic_error(reply, 400, "invalid_request_error")
