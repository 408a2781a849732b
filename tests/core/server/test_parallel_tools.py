"""Several tool calls in one reply (`parallel_tool_calls`): parsing and streaming on fixed text
cut anywhere, then the real model through the real `openai` client against a real server on
loopback (SmolLM2 135M, greedy, whose reply to the two-city history below is two calls)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthside.core.server.structured import (
    ToolCallStream,
    grammar_for_tools,
    parse_tool_call,
    parse_tool_calls,
    parse_tools,
    render_tool_calls,
)
from tests.core.server.test_api import Running, serving

pytestmark = pytest.mark.beside

MODEL = "gemma-3-270m-q4_k_m"  # the id start_server gives whatever model it serves
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": CITY,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a city.",
        "parameters": CITY,
    },
}
TOOLS = parse_tools([WEATHER, TIME])
TWO_CALLS = (
    '[{"name": "get_weather", "arguments": {"city": "Paris {x}"}},\n'
    ' { "name": "get_time", "arguments": { "city": "Tōkyō \\"東京\\"" } } ]'
)


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


def feed_all(pieces: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    stream = ToolCallStream(TOOLS)
    deltas = [delta for piece in pieces for delta in stream.feed(piece)]
    rest, finish_reason = stream.finish()
    return deltas + rest, finish_reason


def calls_from_deltas(deltas: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    """The calls a client assembles from stream deltas, by `index` as OpenAI's SDK does."""
    calls: list[dict[str, str]] = []
    for delta in deltas:
        assert "content" not in delta, delta
        for part in delta["tool_calls"]:
            if part["index"] == len(calls):  # a new call: its first delta carries id and name
                assert part["type"] == "function" and part["id"].startswith("call_")
                calls.append({"id": part["id"], "name": part["function"]["name"], "arguments": ""})
            calls[part["index"]]["arguments"] += part["function"]["arguments"]
    return calls


# ---- on fixed text -----------------------------------------------------------------------


def test_two_calls_parse_with_their_own_ids_and_argument_text() -> None:
    calls = parse_tool_calls(TWO_CALLS, TOOLS)
    assert calls is not None
    assert [call.name for call in calls] == ["get_weather", "get_time"]
    assert calls[0].arguments == '{"city": "Paris {x}"}'
    assert json.loads(calls[1].arguments) == {"city": 'Tōkyō "東京"'}
    assert calls[0].id != calls[1].id
    assert parse_tool_call(TWO_CALLS, TOOLS) is None  # "the one call" of two is no answer


@pytest.mark.parametrize(
    "text",
    [
        TWO_CALLS + "\nsunny",
        TWO_CALLS.replace("get_time", "get_news"),
        TWO_CALLS[:-5],
        TWO_CALLS[1:-1],
    ],
    ids=["trailing text", "unknown tool", "cut short", "objects without the array"],
)
def test_a_reply_with_any_bad_part_is_no_call(text: str) -> None:
    assert parse_tool_calls(text, TOOLS) is None


def test_a_call_cut_short_by_the_token_limit_leaves_the_ones_before_it() -> None:
    calls = parse_tool_calls(TWO_CALLS[:-5], TOOLS, cut_off=True)
    assert calls is not None and [call.name for call in calls] == ["get_weather"]


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(0, len(TWO_CALLS)), max_size=30))
def test_any_split_of_two_calls_streams_each_with_its_index(cuts: list[int]) -> None:
    deltas, finish_reason = feed_all(split_at(TWO_CALLS, cuts))
    assert finish_reason == "tool_calls"
    expected = parse_tool_calls(TWO_CALLS, TOOLS)
    assert expected is not None
    streamed = calls_from_deltas(deltas)
    assert [(call["name"], call["arguments"]) for call in streamed] == [
        (call.name, call.arguments) for call in expected
    ]
    assert streamed[0]["id"] != streamed[1]["id"]


def test_only_the_parallel_grammar_repeats_the_call() -> None:
    parallel = grammar_for_tools(TOOLS, "required")
    single = grammar_for_tools(TOOLS, "required", parallel=False)
    assert parallel is not None and single is not None
    assert '"[" space tool-call ("," space tool-call){0,7} "]"' in parallel.splitlines()[0]
    assert single.splitlines()[0] == 'root ::= " "? tool-call'


def test_history_calls_render_as_the_model_writes_them() -> None:
    sent = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"city": "Tokyo"}'},
        },
    ]
    rendered = render_tool_calls(sent)
    calls = parse_tool_calls(rendered, TOOLS)
    assert calls is not None and rendered.startswith("[")
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {"city": "Tokyo"}),
    ]


# ---- through the real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


def earlier_call(call_id: str, city: str) -> dict[str, Any]:
    arguments = json.dumps({"city": city})
    function = {"name": "get_weather", "arguments": arguments}
    return {"id": call_id, "type": "function", "function": function}


# An earlier turn with two calls (rendered back to the model as the array it would write):
# with it, SmolLM2 answers the next two-city question with two calls; without, with one.
HISTORY = [
    {"role": "user", "content": "What is the weather in Rome and in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [earlier_call("call_1", "Rome"), earlier_call("call_2", "Oslo")],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
    {"role": "assistant", "content": "Rome is sunny and Oslo is rainy."},
    {"role": "user", "content": "What is the weather in Paris and in Tokyo?"},
]


def ask_two_cities(server: Running, **extra: Any) -> Any:
    return server.client.chat.completions.create(
        model=MODEL,
        messages=HISTORY,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=64,
        **extra,
    )


def test_two_cities_get_two_calls_whole_and_streamed(server: Running) -> None:
    reply = ask_two_cities(server)
    assert reply.choices[0].finish_reason == "tool_calls", reply.choices[0].message
    calls = reply.choices[0].message.tool_calls or []
    made = [(call.function.name, json.loads(call.function.arguments)) for call in calls]
    assert made == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Tokyo"})]
    assert len({call.id for call in calls}) == 2
    chunks = list(ask_two_cities(server, stream=True))
    deltas = [chunk.choices[0].delta.model_dump(exclude_none=True) for chunk in chunks[1:-1]]
    streamed = calls_from_deltas(deltas)
    assert [(call["name"], call["arguments"]) for call in streamed] == [
        (call.function.name, call.function.arguments) for call in calls
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_parallel_tool_calls_false_makes_exactly_one_call(server: Running) -> None:
    reply = ask_two_cities(server, parallel_tool_calls=False)
    calls = reply.choices[0].message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert reply.choices[0].finish_reason == "tool_calls"
