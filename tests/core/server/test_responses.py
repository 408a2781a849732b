"""The Responses API (`client.responses.create`) with the real `openai` client against a real
server on loopback, serving the real default model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.errors import EngineCrashedError
from hearthside.core.server import structured
from hearthside.core.server.app import GenerationPlan
from hearthside.core.server.responses import (
    ResponseBuilder,
    ResponseEvents,
    ResponsesRequest,
    ResponseStore,
    StoredResponse,
)
from tests.core.server.test_api import WEATHER_TOOL, Running, serving

pytestmark = pytest.mark.beside

MODEL = "gemma-3-270m-q4_k_m"
WEATHER: dict[str, Any] = {"type": "function", **cast(dict[str, Any], WEATHER_TOOL["function"])}
GREEDY: dict[str, Any] = {"model": MODEL, "temperature": 0}
TWO_CALLS = (  # a reply as the parallel tool grammar writes it
    '[{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
    ' {"name": "get_weather", "arguments": {"city": "Rome"}}]'
)


@pytest.fixture(scope="module")
def server(default_model_file: Path) -> Iterator[Running]:
    with serving(default_model_file, max_queue=8) as running:
        yield running


def test_a_text_reply_is_a_completed_response_with_usage(server: Running) -> None:
    reply = server.client.responses.create(
        input="What is the capital of France?", max_output_tokens=16, **GREEDY
    )
    assert reply.id.startswith("resp_") and reply.object == "response"
    assert reply.status == "completed" and reply.incomplete_details is None
    assert "Paris" in reply.output_text
    (message,) = reply.output
    assert isinstance(message, ResponseOutputMessage) and message.id.startswith("msg_")
    assert reply.usage is not None and reply.usage.input_tokens > 0
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert server.client.responses.retrieve(reply.id).output_text == reply.output_text


def test_max_output_tokens_leaves_the_response_incomplete(server: Running) -> None:
    reply = server.client.responses.create(
        input="Tell me a long story about a dragon.", max_output_tokens=4, **GREEDY
    )
    assert reply.status == "incomplete"
    assert reply.incomplete_details is not None
    assert reply.incomplete_details.reason == "max_output_tokens"
    assert reply.usage is not None and reply.usage.output_tokens == 4
    assert reply.output[0].status == "incomplete"


def test_a_stream_sends_the_typed_events_in_order(server: Running) -> None:
    request = {"input": "Write one sentence about the sea.", "max_output_tokens": 8, **GREEDY}
    whole = server.client.responses.create(**request)
    events = list(server.client.responses.create(**request, stream=True))
    kinds = [event.type for event in events]
    deltas = [event for event in events if event.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if whole.status == "incomplete" else "response.completed",
    ]
    numbers = [event.sequence_number for event in events]
    assert numbers == list(range(len(events)))
    final = events[-1].response
    text = "".join(event.delta for event in deltas)
    assert text == final.output_text == whole.output_text and text
    assert {event.item_id for event in deltas} == {final.output[0].id}


def test_previous_response_id_continues_without_the_old_instructions(server: Running) -> None:
    instructions = "You are a geography teacher. Answer in one word."
    first = server.client.responses.create(
        input="What is the capital of Italy?",
        instructions=instructions,
        max_output_tokens=8,
        **GREEDY,
    )
    follow_up = server.client.responses.create(
        input="And of Spain?", previous_response_id=first.id, max_output_tokens=1, **GREEDY
    )
    resent = server.client.responses.create(
        input=[
            {"role": "user", "content": "What is the capital of Italy?"},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": [{"type": "input_text", "text": "And of Spain?"}]},
        ],
        max_output_tokens=1,
        **GREEDY,
    )
    uninstructed = server.client.responses.create(
        input="What is the capital of Italy?", max_output_tokens=1, **GREEDY
    )
    assert first.usage and follow_up.usage and resent.usage and uninstructed.usage
    assert first.usage.input_tokens > uninstructed.usage.input_tokens  # instructions went in
    # The same prompt as the history sent in full, instructions left out (as OpenAI does).
    assert follow_up.usage.input_tokens == resent.usage.input_tokens
    assert follow_up.usage.input_tokens > uninstructed.usage.input_tokens
    assert follow_up.previous_response_id == first.id and follow_up.instructions is None


def test_an_unknown_or_unstored_previous_response_is_refused(server: Running) -> None:
    unstored = server.client.responses.create(
        input="Name a colour.", store=False, max_output_tokens=1, **GREEDY
    )
    for missing in ("resp_does_not_exist", unstored.id):
        with pytest.raises(openai.BadRequestError) as refused:
            server.client.responses.create(input="Go on.", previous_response_id=missing, **GREEDY)
        assert refused.value.code == "previous_response_not_found"
        assert refused.value.param == "previous_response_id"
        assert missing in refused.value.message


def test_a_streamed_function_call_and_its_output_continue_the_conversation(
    server: Running,
) -> None:
    events = list(
        server.client.responses.create(  # type: ignore[call-overload]
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=32,
            stream=True,
            **GREEDY,
        )
    )
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * (len(events) - 6),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    final = events[-1].response
    (call,) = final.output
    assert isinstance(call, ResponseFunctionToolCall) and call.status == "completed"
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    streamed = "".join(event.delta for event in events[3:-3])
    assert streamed == call.arguments == events[-3].arguments
    assert isinstance(json.loads(call.arguments)["city"], str)

    result = {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21 C"}
    answer = server.client.responses.create(
        input=[result],  # type: ignore[list-item]
        previous_response_id=final.id,
        max_output_tokens=16,
        **GREEDY,
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text
    assert answer.usage and final.usage
    # The question, the call and its result reached the model (the tools' prompt did not:
    # this request has no tools).
    assert answer.usage.input_tokens > 2 * final.usage.output_tokens


def test_a_whole_reply_with_several_calls_has_one_item_each() -> None:
    plan = GenerationPlan(
        "chat.completion", (), None, SamplingParams(), tools=structured.parse_tools([WEATHER_TOOL])
    )
    request = ResponsesRequest(input="Weather in Paris and Rome?", tools=[WEATHER])
    body = ResponseBuilder(request, plan, MODEL).whole(_finished(TWO_CALLS))
    assert [item["type"] for item in body["output"]] == ["function_call", "function_call"]
    assert [json.loads(item["arguments"])["city"] for item in body["output"]] == ["Paris", "Rome"]
    assert len({item["call_id"] for item in body["output"]}) == 2
    assert body["tools"][0]["strict"] is True  # echoed as OpenAI does: every field present


def test_several_calls_in_one_stream_become_one_item_each() -> None:
    tools = structured.parse_tools([WEATHER_TOOL])
    plan = GenerationPlan("chat.completion", (), None, SamplingParams(), tools=tools)
    request = ResponsesRequest(input="Weather in Paris and Rome?")
    events = ResponseEvents(ResponseBuilder(request, plan, MODEL))
    sent = events.opening()
    for start in range(0, len(TWO_CALLS), 5):  # pieces as a model streams them
        sent += events.pieces(TWO_CALLS[start : start + 5])
    sent += events.closing(_finished(TWO_CALLS))
    final = sent[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["function_call", "function_call"]
    assert [json.loads(item["arguments"])["city"] for item in final["output"]] == ["Paris", "Rome"]
    added = [event for event in sent if event["type"] == "response.output_item.added"]
    assert [event["output_index"] for event in added] == [0, 1]
    for index, item in enumerate(final["output"]):
        deltas = [e for e in sent if e["type"] == "response.function_call_arguments.delta"]
        assert (
            "".join(e["delta"] for e in deltas if e["output_index"] == index) == item["arguments"]
        )
    assert [event["sequence_number"] for event in sent] == list(range(len(sent)))


def test_a_failure_after_the_first_token_ends_the_stream_as_failed() -> None:
    plan = GenerationPlan("chat.completion", (), None, SamplingParams())
    events = ResponseEvents(ResponseBuilder(ResponsesRequest(input="Hi"), plan, MODEL))
    sent = [*events.opening(), *events.pieces("Once upon")]
    (failed,) = events.failed(EngineCrashedError("The engine stopped."))
    assert failed["type"] == "response.failed"
    assert failed["sequence_number"] == sent[-1]["sequence_number"] + 1
    response = failed["response"]
    assert response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "The engine stopped."}


def test_a_prompt_too_long_is_refused_before_a_stream_starts(server: Running) -> None:
    body = {"model": MODEL, "input": "word " * 1000, "max_output_tokens": 1500, "stream": True}
    with server.http() as http:
        reply = http.post("/responses", json=body)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_the_store_keeps_the_latest_responses_only() -> None:
    store = ResponseStore(capacity=2)
    for number in range(3):
        store.keep(StoredResponse({"id": f"resp_{number}"}, ()))
    assert store.get("resp_0") is None
    assert store.get("resp_1") is not None and store.get("resp_2") is not None


def test_the_store_drops_the_oldest_when_conversations_grow_too_large() -> None:
    turn = ({"role": "user", "content": "x" * 1000},)
    store = ResponseStore(capacity=100, max_chars=2500)
    for number in range(3):
        store.keep(StoredResponse({"id": f"resp_{number}"}, turn))
    assert store.get("resp_0") is None  # three of ~1030 characters do not fit in 2500
    assert store.get("resp_1") is not None and store.get("resp_2") is not None


def _finished(text: str) -> GenerationResult:
    metrics = GenerationMetrics(
        prompt_tokens=20,
        prompt_tokens_evaluated=20,
        completion_tokens=30,
        ttft_s=None,
        prompt_tok_s=None,
        decode_tok_s=None,
        total_s=0.0,
        stop_reason="eos",
    )
    return GenerationResult(text=text, metrics=metrics)


def test_a_json_schema_text_format_gives_json(server: Running) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
        "additionalProperties": False,
    }
    reply = server.client.responses.create(
        input="Name a colour and a number.",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=32,
        **GREEDY,
    )
    answer = json.loads(reply.output_text)
    assert isinstance(answer["colour"], str) and isinstance(answer["count"], int)
    assert reply.text is not None and reply.text.format.type == "json_schema"


@pytest.mark.parametrize(
    ("request_fields", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                    }
                ]
            },
            "input[0].content[0].type",
        ),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0].call_id"),
        ({"input": []}, "input"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
    ],
)
def test_what_cannot_be_served_is_a_named_400(
    server: Running, request_fields: dict[str, Any], param: str
) -> None:
    with server.http() as http:
        reply = http.post("/responses", json={"model": MODEL, "input": "Hi", **request_fields})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
