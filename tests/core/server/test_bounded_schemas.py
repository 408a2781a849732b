"""Bounded JSON schemas (`minimum`, `maximum`, `multipleOf`, `uniqueItems`, ...): integer
ranges written into the grammar exactly, everything else checked by a real validator with a
bounded resample. The grammar pieces are checked on their own; the rest on the real engine
and, through the real `openai` client, a real server on loopback (SmolLM2 135M)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, StringConstraints

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.server.number_grammar import integer_range, number_range
from hearthside.core.server.schema_converter import enforced_by_grammar
from hearthside.core.server.structured import (
    StructuredOutputError,
    grammar_for_response_format,
    grammar_for_tools,
    parse_tools,
)
from hearthside.core.server.validation import (
    MAX_ATTEMPTS,
    check_for_response_format,
    check_for_tools,
)
from tests.core.server.test_api import Running, serving

pytestmark = pytest.mark.beside

MODEL = "gemma-3-270m-q4_k_m"  # the id start_server gives whatever model it serves
FAILED_ATTEMPT = "structured reply failed validation"


def as_regex(alternatives: list[str]) -> re.Pattern[str]:
    """GBNF alternatives made of quoted literals, classes and `{m,n}` as a Python regex."""
    parts = [
        alternative.replace('"."', r"\.").replace('"', "").replace(" ", "")
        for alternative in alternatives
    ]
    return re.compile("|".join(f"(?:{part})" for part in parts))


def decimal_text(value: float) -> str:
    """`value` in plain decimal form, cut (toward zero) to 6 fraction digits."""
    whole, _, fraction = format(Decimal(value + 0.0), "f").partition(".")
    return whole + (f".{fraction[:6]}" if fraction.strip("0") else "")


def rf(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}


# ---- the grammar pieces ------------------------------------------------------------------

bound = st.one_of(st.none(), st.integers(-(10**6), 10**6))


@settings(max_examples=200, deadline=None)
@given(low=bound, high=bound, probes=st.lists(st.integers(-(10**7), 10**7), max_size=20))
def test_an_integer_range_matches_exactly_the_integers_in_it(
    low: int | None, high: int | None, probes: list[int]
) -> None:
    pattern = as_regex(integer_range(low, high))
    edges = [edge + step for edge in (low, high, 0) if edge is not None for step in (-1, 0, 1)]
    for number in probes + edges:
        inside = (low is None or number >= low) and (high is None or number <= high)
        assert bool(pattern.fullmatch(str(number))) == inside, (low, high, number)
    assert not pattern.fullmatch("007") and not pattern.fullmatch("-0")  # JSON's own form


def test_an_empty_integer_range_has_no_alternatives() -> None:
    assert integer_range(5, 4) == [] and integer_range(1, 0) == []


@settings(max_examples=200, deadline=None)
@given(
    low=st.one_of(st.none(), st.floats(-1e6, 1e6)),
    span=st.floats(0, 1e6),
    where=st.floats(0, 1),
)
def test_a_number_range_admits_every_value_in_it(
    low: float | None, span: float, where: float
) -> None:
    high = None if low is None else low + span
    value = (low or 0) + where * span
    pattern = as_regex(number_range(low, high))
    assert pattern.fullmatch(decimal_text(value)), (low, high, value)


@pytest.mark.parametrize(
    ("schema", "enforced"),
    [
        ({"type": "integer", "minimum": 0, "maximum": 150}, True),
        ({"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 0}}}, True),
        ({"type": "number", "minimum": 0, "maximum": 1}, False),
        ({"type": "integer", "multipleOf": 5}, False),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, False),
        ({"type": "string", "format": "email"}, False),
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, False),
        ({"type": "string", "minLength": 1, "title": "Name", "description": "a name"}, True),
    ],
)
def test_the_grammar_knows_what_it_cannot_enforce(schema: dict[str, Any], enforced: bool) -> None:
    assert enforced_by_grammar(schema) is enforced
    assert check_for_response_format(rf(schema)) is not None  # every one is served


@pytest.mark.parametrize(
    ("schema", "complaint"),
    [
        ({"type": "integer", "minimum": 5, "maximum": 1}, "`minimum` (5) is not below"),
        ({"type": "number", "exclusiveMinimum": 1, "maximum": 1}, "no reply could satisfy"),
        ({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 6}, "No integer"),
        ({"type": "integer", "minimum": 10**30}, "more than 20 digits"),
        ({"$dynamicRef": "#node"}, "does not support"),
    ],
)
def test_bounds_no_reply_can_meet_are_refused(schema: dict[str, Any], complaint: str) -> None:
    with pytest.raises(StructuredOutputError, match=re.escape(complaint)):
        grammar_for_response_format(rf(schema))


def test_a_malformed_bound_is_named_by_the_validator() -> None:
    schema = {"type": "integer", "minimum": "zero"}
    grammar_for_response_format(rf(schema))  # the grammar leaves a non-number bound alone
    with pytest.raises(StructuredOutputError, match="not a valid JSON schema"):
        check_for_response_format(rf(schema))


# ---- on the real engine ------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(chat_model_file: Path) -> Iterator[Engine]:
    loaded = Engine(EngineConfig(model_path=str(chat_model_file), n_ctx=512))
    yield loaded
    loaded.close()


def test_hot_sampling_never_leaves_an_integer_range(engine: Engine) -> None:
    grammar = grammar_for_response_format(rf({"type": "integer", "minimum": -3, "maximum": 12}))
    messages = [ChatMessage("user", "Write a large number, like 90210.")]
    seen = set()
    for seed in range(6):
        sampling = SamplingParams(
            temperature=2.0, top_k=0, max_tokens=6, seed=seed, grammar=grammar
        )
        result = engine.chat(messages, sampling)
        value = json.loads(result.text)
        assert isinstance(value, int) and -3 <= value <= 12, result.text
        seen.add(value)
    assert len(seen) > 1  # it did sample: the bound, not greed, kept it in range


# ---- through the real server ---------------------------------------------------------------


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


class Person(BaseModel):
    age: int = Field(ge=0, le=150)
    score: float = Field(ge=0, le=1)
    # set: `uniqueItems` in the schema; each tag bounded too (at temperature 0 this model can
    # spell one tag forever: "abdabdabd…" filled 200 tokens on an AVX-512 machine)
    tags: set[Annotated[str, StringConstraints(max_length=24)]] = Field(max_length=3)


def failed_attempts(caplog: pytest.LogCaptureFixture) -> int:
    return sum(FAILED_ATTEMPT in record.getMessage() for record in caplog.records)


def test_a_pydantic_model_with_bounds_parses_within_them(
    server: Running, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hearthside.core.server.validation")
    reply = server.client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe Ada, a 36 year old engineer, as JSON."}],
        response_format=Person,
        temperature=0,
        max_tokens=96,
    )
    person = reply.choices[0].message.parsed
    assert person is not None, reply.choices[0].message.content
    assert 0 <= person.age <= 150 and 0 <= person.score <= 1 and len(person.tags) <= 3
    assert all(len(tag) <= 24 for tag in person.tags)
    assert failed_attempts(caplog) < MAX_ATTEMPTS


# Served (the grammar writes the items), yet the grammar allows only ["a", "a"]: never unique.
UNMEETABLE = {
    "type": "array",
    "items": {"enum": ["a"]},
    "minItems": 2,
    "maxItems": 2,
    "uniqueItems": True,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_reply_the_grammar_cannot_make_valid_is_resampled_then_refused(
    server: Running, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.WARNING, logger="hearthside.core.server.validation")
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        server.client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Pick a number."}],
            response_format=rf(UNMEETABLE),  # type: ignore[arg-type]
            temperature=0,
            max_tokens=32,
            stream=stream,
        )
    error = raised.value.body
    assert isinstance(error, dict) and error["code"] == "structured_output_failed"
    assert f"in {MAX_ATTEMPTS} attempts" in error["message"] and "unique" in error["message"]
    assert failed_attempts(caplog) == MAX_ATTEMPTS  # each attempt sampled and checked


def test_a_held_back_stream_sends_only_a_valid_reply(server: Running) -> None:
    schema = {
        "type": "object",
        "properties": {"level": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["level"],
        "additionalProperties": False,
    }
    chunks = server.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Set the level to one half, as JSON."}],
        response_format=rf(schema),  # type: ignore[arg-type]
        temperature=0,
        max_tokens=32,
        stream=True,
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert 0 <= json.loads(text)["level"] <= 1, text


VOLUME_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "set_volume",
        "description": "Set the speaker volume.",
        "parameters": {
            "type": "object",
            "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 10}},
            "required": ["level"],
            "additionalProperties": False,
        },
    },
}


@pytest.mark.parametrize(
    ("reply", "broken"),
    [
        ('{"name": "set_volume", "arguments": {"level": 7}}', False),
        ('{"name": "set_volume", "arguments": {"level": 70}}', True),
        (
            '[{"name": "set_volume", "arguments": {"level": 3}}, '
            '{"name": "set_volume", "arguments": {"level": 30}}]',
            True,
        ),
        ("Sure, the volume is set.", False),  # plain text in `auto` mode: no schema applies
    ],
)
def test_every_call_of_a_reply_is_checked_one_or_several(reply: str, broken: bool) -> None:
    check = check_for_tools(parse_tools([VOLUME_TOOL]))
    problems = check.problems(reply)
    assert bool(problems) is broken, problems
    if broken:
        assert "set_volume arguments['level']" in problems[0]


def test_a_bounded_tool_parameter_holds(server: Running) -> None:
    tool = VOLUME_TOOL
    assert grammar_for_tools(parse_tools([tool]), "required")
    reply = server.client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Turn the volume up to 75."}],
        tools=[tool],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=32,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert [call.function.name for call in calls] == ["set_volume"]  # type: ignore[union-attr]
    level = json.loads(calls[0].function.arguments)["level"]  # type: ignore[union-attr]
    assert isinstance(level, int) and 0 <= level <= 10
