"""Structured output: grammars, tool prompts and reply parsing, checked on the real default model.

The default model is a small base model, so these tests check structure (which the grammar
guarantees), never the quality of what it writes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult
from hearthside.core.server.structured import (
    StructuredOutputError,
    ToolCallStream,
    ToolSpec,
    grammar_for_response_format,
    grammar_for_tools,
    parse_tool_call,
    parse_tools,
    tool_prompt,
)

pytestmark = pytest.mark.beside

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}},
            "required": ["city"],
        },
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "description": "The time."}}
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer"},
        "size": {"enum": ["small", "large"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    },
    "required": ["city", "population", "size"],
    "additionalProperties": False,
}
CALL_TEXT = (
    '{"name": "get_weather", "arguments": {"city": "Zürich \\"Nord\\" {x}", '
    '"days": [1, {"a": "}"}], "emoji": "🌦️"}}'
)


@pytest.fixture(scope="module")
def engine(default_model_file: Path) -> Iterator[Engine]:
    loaded = Engine(EngineConfig(model_path=str(default_model_file), n_ctx=2048))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def tools() -> tuple[ToolSpec, ...]:
    return parse_tools([WEATHER_TOOL, TIME_TOOL])


def generate(
    engine: Engine,
    question: str,
    grammar: str | None,
    *,
    system: str | None = None,
    pieces: list[str] | None = None,
    max_tokens: int = 80,
) -> GenerationResult:
    messages = [ChatMessage("user", question)]
    if system is not None:
        messages.insert(0, ChatMessage("system", system))
    sampling = SamplingParams(temperature=0, max_tokens=max_tokens, grammar=grammar)
    on_text = pieces.append if pieces is not None else None
    return engine.chat(messages, sampling, on_text=on_text)


def conforms(value: Any, schema: Mapping[str, Any]) -> bool:
    """A validator for the schema subset these tests use."""
    if "enum" in schema:
        return value in schema["enum"]
    kind = schema.get("type")
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "array":
        items = schema.get("items", {})
        small_enough = len(value) <= schema.get("maxItems", len(value))
        return small_enough and all(conforms(item, items) for item in value)
    if kind == "object":
        properties = schema.get("properties", {})
        if not set(schema.get("required", ())) <= set(value):
            return False
        if schema.get("additionalProperties") is False and not set(value) <= set(properties):
            return False
        return all(conforms(value[key], properties[key]) for key in value if key in properties)
    return True


def feed_all(stream: ToolCallStream, pieces: Sequence[str]) -> tuple[list[dict[str, Any]], str]:
    deltas = [delta for piece in pieces for delta in stream.feed(piece)]
    rest, finish_reason = stream.finish()
    return deltas + rest, finish_reason


def streamed_arguments(deltas: Sequence[dict[str, Any]]) -> str:
    return "".join(
        call["function"]["arguments"] for delta in deltas for call in delta.get("tool_calls", ())
    )


def announced_names(deltas: Sequence[dict[str, Any]]) -> list[str]:
    return [
        call["function"]["name"]
        for delta in deltas
        for call in delta.get("tool_calls", ())
        if "name" in call["function"]
    ]


def streamed_content(deltas: Sequence[dict[str, Any]]) -> str:
    return "".join(delta.get("content", "") for delta in deltas)


# ---- response_format ---------------------------------------------------------------------


@pytest.mark.parametrize("response_format", [None, {"type": "text"}])
def test_free_text_formats_need_no_grammar(response_format: dict[str, Any] | None) -> None:
    assert grammar_for_response_format(response_format) is None


@pytest.mark.parametrize(
    ("response_format", "complaint"),
    [
        ("json", "must be an object"),
        ({"type": "xml"}, "not supported"),
        ({"type": "json_schema"}, "json_schema"),
        ({"type": "json_schema", "json_schema": {"schema": []}}, "schema must be an object"),
        ({"type": "json_schema", "json_schema": {"name": 3, "schema": {}}}, "name"),
        ({"type": "json_schema", "json_schema": {"strict": "yes"}}, "strict"),
    ],
)
def test_malformed_response_formats_are_refused(response_format: Any, complaint: str) -> None:
    with pytest.raises(StructuredOutputError, match=complaint):
        grammar_for_response_format(response_format)


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ({"type": "integer", "minimum": 3, "maximum": 0}, r"`minimum` \(3\) is not below"),
        ({"type": "array", "items": {"$recursiveRef": "#"}}, r"`\$recursiveRef`"),
        ({"$ref": "https://example.com/schema.json"}, "only local"),
        ({"type": "string", "pattern": "[a-z]+"}, "grammar"),
        ({"type": "colour"}, "grammar"),
        ({"$ref": "#/$defs/missing"}, "grammar"),
    ],
)
def test_unsupported_schemas_are_refused(schema: dict[str, Any], complaint: str) -> None:
    request = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(StructuredOutputError, match=complaint):
        grammar_for_response_format(request)


def test_the_callers_schema_is_left_untouched() -> None:
    schema = {"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}}
    before = json.dumps(schema)
    grammar_for_response_format({"type": "json_schema", "json_schema": {"schema": schema}})
    assert json.dumps(schema) == before


def test_json_object_replies_are_json_objects(engine: Engine) -> None:
    grammar = grammar_for_response_format({"type": "json_object"})
    result = generate(engine, "Describe Paris as JSON.", grammar, max_tokens=60)
    if result.metrics.stop_reason != "length":
        assert isinstance(json.loads(result.text), dict)
    assert result.text.startswith("{")


def test_json_schema_replies_follow_the_schema(engine: Engine) -> None:
    request = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    result = generate(engine, "Describe Paris.", grammar_for_response_format(request))
    assert result.metrics.stop_reason == "eos", result.text
    reply = json.loads(result.text)
    assert conforms(reply, CITY_SCHEMA), reply


# ---- tools -------------------------------------------------------------------------------


def test_tools_parse_into_specs(tools: tuple[ToolSpec, ...]) -> None:
    weather, clock = tools
    assert weather.name == "get_weather" and weather.description
    assert weather.parameters == WEATHER_TOOL["function"]["parameters"]  # type: ignore[index]
    assert clock.parameters == {"type": "object", "properties": {}}
    assert parse_tools(None) == () and parse_tools([]) == ()


@pytest.mark.parametrize(
    ("tools", "complaint"),
    [
        ({"type": "function"}, "list"),
        ([{"type": "retrieval"}], "function"),
        ([{"type": "function"}], "function must be an object"),
        ([{"type": "function", "function": {"name": "get weather"}}], "name"),
        ([{"type": "function", "function": {"name": "x" * 65}}], "name"),
        ([{"type": "function", "function": {"name": "f", "description": 1}}], "description"),
        ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "parameters"),
        ([TIME_TOOL, TIME_TOOL], "unique"),
    ],
)
def test_malformed_tools_are_refused(tools: Any, complaint: str) -> None:
    with pytest.raises(StructuredOutputError, match=complaint):
        parse_tools(tools)


def test_tool_prompt_lists_every_tool_and_the_call_format(tools: tuple[ToolSpec, ...]) -> None:
    prompt = tool_prompt(tools)
    for tool in tools:
        assert tool.name in prompt
        assert json.dumps(tool.parameters) in prompt
    assert "The current weather in a city." in prompt
    assert '{"name": <tool name>, "arguments":' in prompt


def test_no_tools_or_choice_none_needs_no_grammar(tools: tuple[ToolSpec, ...]) -> None:
    assert grammar_for_tools(tools, "none") is None
    assert grammar_for_tools((), None) is None
    assert grammar_for_tools((), "auto") is None


@pytest.mark.parametrize(
    ("tool_choice", "complaint"),
    [
        ("sometimes", "tool_choice must be"),
        ({"type": "function", "function": {"name": "get_news"}}, "not among"),
        ({"type": "function"}, "tool_choice must be"),
    ],
)
def test_bad_tool_choices_are_refused(
    tools: tuple[ToolSpec, ...], tool_choice: Any, complaint: str
) -> None:
    with pytest.raises(StructuredOutputError, match=complaint):
        grammar_for_tools(tools, tool_choice)


def test_required_without_tools_is_refused() -> None:
    with pytest.raises(StructuredOutputError, match="at least one tool"):
        grammar_for_tools((), "required")


def test_unsupported_tool_parameters_are_refused() -> None:
    parameters = {"type": "object", "properties": {"n": {"$dynamicRef": "#n"}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(StructuredOutputError, match="`\\$dynamicRef`"):
        grammar_for_tools(parse_tools([tool]), "required")


def test_keywords_the_grammar_cannot_write_are_refused_before_generating() -> None:
    parameters = {"type": "object", "minProperties": 1, "properties": {"n": {"multipleOf": 2}}}
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    with pytest.raises(StructuredOutputError, match=r"`minProperties` \(at \$\)"):
        grammar_for_tools(parse_tools([tool]), "required")
    del parameters["minProperties"]
    with pytest.raises(StructuredOutputError, match=r"`multipleOf` \(at \$\.properties\.n\)"):
        grammar_for_tools(parse_tools([tool]), "required")


def test_keywords_the_grammar_writes_in_part_are_served() -> None:
    parameters = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "level": {"type": "number", "minimum": 0, "maximum": 1},
            "either": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        },
    }
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    assert grammar_for_tools(parse_tools([tool]), "required")  # the validator checks the rest


def every_grammar(tools: tuple[ToolSpec, ...]) -> list[str | None]:
    formats: list[dict[str, Any]] = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}},
        {"type": "json_schema", "json_schema": {"name": "any", "strict": True}},
    ]
    choices: list[Any] = [
        "auto",
        "required",
        {"type": "function", "function": {"name": "get_time"}},
    ]
    return [grammar_for_response_format(f) for f in formats] + [
        grammar_for_tools(tools, choice) for choice in choices
    ]


def test_llama_cpp_accepts_every_grammar(engine: Engine, tools: tuple[ToolSpec, ...]) -> None:
    for grammar in every_grammar(tools):
        assert grammar is not None
        generate(engine, "Hello.", grammar, max_tokens=4)  # raises EngineError if refused


def test_required_tool_call_has_string_city(engine: Engine, tools: tuple[ToolSpec, ...]) -> None:
    weather = tools[:1]
    result = generate(
        engine,
        "What is the weather in Paris?",
        grammar_for_tools(weather, "required"),
        system=tool_prompt(weather),
    )
    call = parse_tool_call(result.text, weather)
    assert call is not None, result.text
    assert call.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.arguments)
    assert list(arguments) == ["city"] and isinstance(arguments["city"], str)


def test_named_tool_choice_forces_that_tool(engine: Engine, tools: tuple[ToolSpec, ...]) -> None:
    choice = {"type": "function", "function": {"name": "get_time"}}
    result = generate(
        engine,
        "What is the weather in Paris?",
        grammar_for_tools(tools, choice),
        system=tool_prompt(tools),
    )
    call = parse_tool_call(result.text, tools)
    assert call is not None and call.name == "get_time", result.text
    assert json.loads(call.arguments) == {}


@pytest.mark.parametrize("question", ["What is the weather in Paris?", "Name a colour."])
def test_auto_gives_a_call_or_plain_text(
    engine: Engine, tools: tuple[ToolSpec, ...], question: str
) -> None:
    grammar = grammar_for_tools(tools, None)
    result = generate(engine, question, grammar, system=tool_prompt(tools), max_tokens=40)
    call = parse_tool_call(result.text, tools)
    if call is None:
        assert result.text and not result.text.startswith("{"), result.text
    else:
        assert call.name in {"get_weather", "get_time"}
        assert isinstance(json.loads(call.arguments), dict)


def test_streamed_tool_call_matches_the_whole_reply(
    engine: Engine, tools: tuple[ToolSpec, ...]
) -> None:
    pieces: list[str] = []
    result = generate(
        engine,
        "What is the weather in Paris?",
        grammar_for_tools(tools, "required"),
        system=tool_prompt(tools),
        pieces=pieces,
    )
    call = parse_tool_call(result.text, tools)
    assert call is not None, result.text
    deltas, finish_reason = feed_all(ToolCallStream(tools), pieces)
    assert finish_reason == "tool_calls"
    assert announced_names(deltas) == [call.name]
    assert streamed_arguments(deltas) == call.arguments
    assert streamed_content(deltas) == ""


def test_streamed_plain_text_passes_through(engine: Engine, tools: tuple[ToolSpec, ...]) -> None:
    pieces: list[str] = []
    result = generate(engine, "Name a colour.", None, pieces=pieces, max_tokens=24)
    deltas, finish_reason = feed_all(ToolCallStream(tools), pieces)
    assert finish_reason == "stop"
    assert all(set(delta) == {"content"} for delta in deltas)
    assert streamed_content(deltas) == result.text


# ---- parsing and streaming on fixed text -------------------------------------------------


def test_parse_tool_call_keeps_the_models_argument_text(tools: tuple[ToolSpec, ...]) -> None:
    call = parse_tool_call(CALL_TEXT + " ", tools)
    assert call is not None and call.name == "get_weather"
    assert call.arguments.startswith('{"city": "Zürich') and call.arguments.endswith(
        '}], "emoji": "🌦️"}'
    )
    assert json.loads(call.arguments)["days"] == [1, {"a": "}"}]


@pytest.mark.parametrize(
    "text",
    [
        "Sunny in Paris.",
        '{"name": "get_news", "arguments": {}}',
        '{"name": "get_weather", "arguments": "city=Paris"}',
        '{"name": "get_weather", "arguments": {"city": "Pa',
        '{"arguments": {}}',
        "",
    ],
)
def test_non_calls_parse_to_none(tools: tuple[ToolSpec, ...], text: str) -> None:
    assert parse_tool_call(text, tools) is None


def split_at(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(cuts), len(text)]
    return [text[start:end] for start, end in zip(bounds, bounds[1:], strict=False)]


cut_points = st.lists(st.integers(min_value=0, max_value=200), max_size=30)


@settings(max_examples=200, deadline=None)
@given(cuts=cut_points, padding=st.sampled_from(["", " ", "\n  "]))
def test_any_split_of_a_call_streams_the_same_arguments(cuts: list[int], padding: str) -> None:
    tools = parse_tools([WEATHER_TOOL])
    text = padding + CALL_TEXT + padding
    expected = parse_tool_call(text, tools)
    assert expected is not None
    deltas, finish_reason = feed_all(ToolCallStream(tools), split_at(text, cuts))
    assert finish_reason == "tool_calls"
    assert announced_names(deltas) == ["get_weather"]
    assert "id" in deltas[0]["tool_calls"][0] and "content" not in deltas[0]
    assert streamed_arguments(deltas) == expected.arguments


@settings(max_examples=100, deadline=None)
@given(cuts=cut_points)
def test_any_split_of_a_reordered_call_is_sent_whole(cuts: list[int]) -> None:
    tools = parse_tools([WEATHER_TOOL])
    text = '{"arguments": {"city": "Oslo"}, "name": "get_weather"}'
    deltas, finish_reason = feed_all(ToolCallStream(tools), split_at(text, cuts))
    assert finish_reason == "tool_calls"
    assert announced_names(deltas) == ["get_weather"]
    assert streamed_arguments(deltas) == '{"city": "Oslo"}'


@settings(max_examples=100, deadline=None)
@given(
    cuts=cut_points,
    text=st.sampled_from(["Sunny, 21°C 🌞 {really}", '{"name": "get_news", "arguments": {}}']),
)
def test_any_split_of_plain_text_comes_back_as_content(cuts: list[int], text: str) -> None:
    deltas, finish_reason = feed_all(
        ToolCallStream(parse_tools([WEATHER_TOOL])), split_at(text, cuts)
    )
    assert finish_reason == "stop"
    assert streamed_content(deltas) == text
    assert all(set(delta) == {"content"} for delta in deltas)
