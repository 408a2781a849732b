"""Every body and every SSE chunk the local API sends, checked against OpenAI's published
OpenAPI schemas (tests/fixtures/openai_openapi), from a real server on loopback serving the real
default model. Requests go through httpx so the raw JSON is checked, not the SDK's reading."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.core.server.openapi_check import (
    COMPLETION_CHUNK,
    assert_matches,
    mismatches,
    schema_names,
)
from tests.core.server.test_api import WEATHER_TOOL, Running, serving

pytestmark = pytest.mark.beside

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def server(default_model_file: Path) -> Iterator[Running]:
    with serving(default_model_file, max_queue=8) as running:
        yield running


@pytest.fixture(scope="module")
def model_id(server: Running) -> str:
    with server.http() as http:
        return str(http.get("/models").json()["data"][0]["id"])


@pytest.fixture(scope="module")
def chat_reply(server: Running, model_id: str) -> dict[str, Any]:
    reply = post(server, "/chat/completions", {"model": model_id, "messages": QUESTION, **GREEDY})
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def post(server: Running, route: str, body: dict[str, Any]) -> httpx.Response:
    with server.http() as http:
        return http.post(route, json=body)


def stream_events(server: Running, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `data:` payloads of a 200 event stream, its framing checked on the way: every
    payload is one JSON object, an `event:` line names its payload's `type`, and a chat or
    completions stream ends with `data: [DONE]`."""
    with server.http() as http, http.stream("POST", route, json=body) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        payloads = [line.removeprefix("data: ") for line in _data_lines(reply.iter_lines())]
    if route != "/responses":
        assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
        payloads = payloads[:-1]
    events = [json.loads(payload) for payload in payloads]
    assert all(isinstance(event, dict) for event in events)
    return events


def _data_lines(lines: Iterator[str]) -> Iterator[str]:
    named: str | None = None
    for line in lines:
        if line.startswith("event: "):
            named = line.removeprefix("event: ")
        elif line.startswith("data: "):
            if named is not None:
                assert json.loads(line.removeprefix("data: "))["type"] == named
            named = None
            yield line
        else:
            assert line == "" or line.startswith(":"), f"not SSE framing: {line!r}"


# ---- the checker itself ----------------------------------------------------------------------


def test_the_fixture_holds_every_schema_the_tests_name() -> None:
    wanted = {
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
        "CreateCompletionResponse",
        "ListModelsResponse",
        "Model",
        "ErrorResponse",
        "Response",
        "ResponseStreamEvent",
        "ResponseTextDeltaEvent",  # a member event, kept with its union
    }
    assert wanted <= schema_names()


def test_the_checker_names_the_path_of_each_wrong_field(chat_reply: dict[str, Any]) -> None:
    assert_matches(chat_reply, "CreateChatCompletionResponse")  # the real reply passes ...
    broken = copy.deepcopy(chat_reply)
    broken["created"] = str(broken["created"])
    broken["choices"][0]["finish_reason"] = "done"
    del broken["choices"][0]["message"]["role"]
    problems = mismatches(broken, "CreateChatCompletionResponse")
    paths = {problem.split(":")[0] for problem in problems}  # ... and each break is named
    assert paths == {"at /created", "at /choices/0/finish_reason", "at /choices/0/message"}
    with pytest.raises(AssertionError, match='at /created: .* is not of type "integer"'):
        assert_matches(broken, "CreateChatCompletionResponse")


def test_the_checker_reads_openapi_nullable_and_tagged_unions() -> None:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
        "usage": None,
    }
    assert_matches(chunk, "CreateChatCompletionStreamResponse")  # `nullable: true` fields
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0}
    problems = mismatches({**delta, "content_index": "0"}, "ResponseStreamEvent")
    # The union picks the member by its `type`, so the message is that member's own.
    assert any(p.startswith("at /content_index: ") for p in problems), problems
    assert any('"delta" is a required property' in p for p in problems), problems


# ---- chat completions ------------------------------------------------------------------------


def test_a_chat_reply_matches_the_spec(chat_reply: dict[str, Any]) -> None:
    assert_matches(chat_reply, "CreateChatCompletionResponse")
    assert "Paris" in chat_reply["choices"][0]["message"]["content"]
    assert chat_reply["usage"]["completion_tokens"] > 0


def test_every_chat_stream_chunk_matches_the_spec(server: Running, model_id: str) -> None:
    body = {
        "model": model_id,
        "messages": QUESTION,
        "stream": True,
        "stream_options": {"include_usage": True},
        **GREEDY,
    }
    chunks = stream_events(server, "/chat/completions", body)
    for chunk in chunks:
        assert_matches(chunk, "CreateChatCompletionStreamResponse")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])


def test_a_tool_call_reply_and_its_stream_match_the_spec(server: Running, model_id: str) -> None:
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "temperature": 0,
        "max_tokens": 32,
    }
    whole = post(server, "/chat/completions", body).json()
    assert_matches(whole, "CreateChatCompletionResponse")
    assert whole["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    chunks = stream_events(server, "/chat/completions", {**body, "stream": True})
    for chunk in chunks:
        assert_matches(chunk, "CreateChatCompletionStreamResponse")
    assert any(c["choices"] and c["choices"][0]["delta"].get("tool_calls") for c in chunks)


def test_a_json_schema_reply_matches_the_spec(server: Running, model_id: str) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    body = {
        "model": model_id,
        "messages": QUESTION,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        "temperature": 0,
        "max_tokens": 32,
    }
    reply = post(server, "/chat/completions", body).json()
    assert_matches(reply, "CreateChatCompletionResponse")
    assert isinstance(json.loads(reply["choices"][0]["message"]["content"])["city"], str)


# ---- completions -----------------------------------------------------------------------------

COMPLETION = {"prompt": "The capital of France is", "temperature": 0, "max_tokens": 8}


def test_a_completion_matches_the_spec(server: Running, model_id: str) -> None:
    reply = post(server, "/completions", {"model": model_id, **COMPLETION})
    assert reply.status_code == 200
    assert_matches(reply.json(), "CreateCompletionResponse")


def test_every_completion_stream_chunk_matches_the_spec(server: Running, model_id: str) -> None:
    body = {
        "model": model_id,
        "stream": True,
        "stream_options": {"include_usage": True},
        **COMPLETION,
    }
    chunks = stream_events(server, "/completions", body)
    for chunk in chunks:
        assert_matches(chunk, COMPLETION_CHUNK)
    assert chunks[-1]["usage"]["completion_tokens"] > 0


# ---- models ----------------------------------------------------------------------------------


def test_the_model_list_and_a_model_match_the_spec(server: Running, model_id: str) -> None:
    with server.http() as http:
        listing = http.get("/models")
        one = http.get(f"/models/{model_id}")
    assert_matches(listing.json(), "ListModelsResponse")
    assert one.status_code == 200
    assert_matches(one.json(), "Model")


# ---- errors ----------------------------------------------------------------------------------


def test_a_validation_error_matches_the_spec(server: Running, model_id: str) -> None:
    reply = post(server, "/chat/completions", {"model": model_id, "messages": [], "top_p": 7})
    assert reply.status_code == 400
    assert_matches(reply.json(), "ErrorResponse")


def test_a_missing_key_is_an_error_in_the_spec_shape(server: Running) -> None:
    reply = httpx.get(f"{server.base}/models", timeout=10)
    assert reply.status_code == 401
    assert_matches(reply.json(), "ErrorResponse")


def test_an_unknown_model_is_an_error_in_the_spec_shape(server: Running) -> None:
    with server.http() as http:
        reply = http.get("/models/no-such-model")
    assert reply.status_code == 404
    assert_matches(reply.json(), "ErrorResponse")
    assert reply.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_context_overflow_is_an_error_in_the_spec_shape(
    server: Running, model_id: str, stream: bool
) -> None:
    body = {
        "model": model_id,
        "messages": [{"role": "user", "content": "word " * 2100}],
        "max_tokens": 8,
        "stream": stream,
    }
    reply = post(server, "/chat/completions", body)
    assert reply.status_code == 400  # refused before a stream starts, too
    assert_matches(reply.json(), "ErrorResponse")
    assert reply.json()["error"]["code"] == "context_length_exceeded"


# ---- the Responses API -----------------------------------------------------------------------

RESPONSE_REQUEST = {
    "input": "What is the capital of France?",
    "temperature": 0,
    "max_output_tokens": 16,
}


@pytest.fixture(scope="module")
def response(server: Running, model_id: str) -> dict[str, Any]:
    reply = post(server, "/responses", {"model": model_id, **RESPONSE_REQUEST})
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def test_a_response_matches_the_spec(response: dict[str, Any]) -> None:
    assert_matches(response, "Response")
    assert response["status"] in ("completed", "incomplete")


def test_every_response_stream_event_matches_the_spec(
    server: Running, model_id: str, response: dict[str, Any]
) -> None:
    """`response` only so that this skips, too, while the route is missing."""
    body = {"model": model_id, **RESPONSE_REQUEST, "stream": True}
    events = stream_events(server, "/responses", body)
    for event in events:
        assert_matches(event, "ResponseStreamEvent")
    numbers = [event["sequence_number"] for event in events]
    assert numbers == sorted(set(numbers))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    assert_matches(events[-1]["response"], "Response")
