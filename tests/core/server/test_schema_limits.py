"""The schema limits and the bounded converter, checked without a model: what the flat
repetitions accept (translated to Python regular expressions), the grammar measurements, and
refusals that name the limit and the value."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthside.core.engine.grammar_limits import (
    MAX_GRAMMAR_NESTING,
    GrammarError,
    check_grammar_bounds,
    measure_grammar,
)
from hearthside.core.server.schema_converter import CHUNK, BoundedSchemaConverter
from hearthside.core.server.schema_limits import MAX_STRING_LENGTH, StructuredOutputError
from hearthside.core.server.structured import (
    grammar_for_response_format,
    grammar_for_tools,
    parse_tools,
)

REPEAT = re.compile(r"\{(\d+)(?:,(\d*))?\}")


def as_regex(text: str, rules: dict[str, str]) -> str:
    """A Python regex for GBNF made of rule names, `|`, `*` and `{m,n}` (the item `x` is the
    letter x); rules are inlined, which is enough for the non-recursive rules tested here."""
    alternatives = []
    for alternative in text.split("|"):
        parts = []
        for token in alternative.split():
            name, suffix = re.fullmatch(r"([a-z0-9-]+)(.*)", token).groups()  # type: ignore[union-attr]
            inner = "x" if name == "x" else f"(?:{as_regex(rules[name], rules)})"
            parts.append(inner + suffix)
        alternatives.append("".join(parts))
    return "|".join(f"(?:{alternative})" for alternative in alternatives)


def accepted_lengths(low: int, high: int | None, probe: list[int]) -> dict[int, bool]:
    converter = BoundedSchemaConverter()
    text = converter.repetition("x", low, high)
    for count in (int(m) for group in REPEAT.findall(text) for m in group if m):
        assert count <= CHUNK  # llama.cpp drops an upper bound above 2000
    pattern = re.compile(as_regex(text, converter._rules) if text else "")
    return {length: pattern.fullmatch("x" * length) is not None for length in probe}


@settings(max_examples=60, deadline=None)
@given(
    low=st.integers(0, 3 * CHUNK + 7),
    extra=st.one_of(st.none(), st.integers(0, 3 * CHUNK + 7)),
)
def test_flat_repetitions_accept_exactly_low_to_high(low: int, extra: int | None) -> None:
    high = None if extra is None else low + extra
    edges = [low - 1, low, low + 1, low + CHUNK - 1, low + CHUNK, 5 * CHUNK]
    if high is not None:
        edges += [high - 1, high, high + 1, high - CHUNK, high - CHUNK + 1]
    probe = sorted({length for length in edges if length >= 0})
    accepted = accepted_lengths(low, high, probe)
    for length, ok in accepted.items():
        assert ok == (low <= length and (high is None or length <= high)), (low, high, length)


def test_no_string_or_array_bound_nests_the_grammar() -> None:
    schema = {
        "type": "object",
        "properties": {
            "text": {"type": "string", "minLength": 3, "maxLength": MAX_STRING_LENGTH},
            "list": {"type": "array", "items": {"type": "string"}, "maxItems": 20_000},
        },
    }
    grammar = grammar_for_response_format(
        {"type": "json_schema", "json_schema": {"schema": schema}}
    )
    assert grammar is not None
    shape = measure_grammar(grammar)
    assert shape.nesting <= 16  # only the converter's own number rule nests (15 levels)
    assert shape.bytes < 4096


def rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "string", "maxLength": -1}, "`maxLength` must be a whole number"),
        ({"type": "string", "maxLength": 2.5}, "`maxLength` must be a whole number"),
        ({"type": "string", "minLength": True}, "`minLength` must be a whole number"),
        ({"type": "string", "minLength": 5, "maxLength": 2}, "no reply could satisfy both"),
        ({"type": "array", "items": {}, "minItems": 3, "maxItems": 1}, "`minItems` (3)"),
        ({"enum": []}, "non-empty list"),
        ({"type": "string", "pattern": 5}, "`pattern` must be a string"),
        ({"type": "string", "pattern": "^" + "a" * 2000 + "$"}, "2002 characters"),
        ({"anyOf": [{"type": "null"}] * 300}, "`anyOf` has 300 entries"),
        ({"$defs": {f"d{i}": {} for i in range(300)}}, "`$defs` has 300 entries"),
    ],
)
def test_malformed_or_oversized_keywords_are_named(schema: dict[str, Any], named: str) -> None:
    with pytest.raises(StructuredOutputError, match=re.escape(named)):
        grammar_for_response_format(rf(schema))


def test_tool_refs_resolve_against_their_own_parameters() -> None:
    parameters = {
        "$defs": {"city": {"type": "string", "maxLength": 20}},
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/city"}, "to": {"$ref": "#/$defs/city"}},
        "required": ["from", "to"],
    }
    tools = [{"type": "function", "function": {"name": n, "parameters": parameters}} for n in "ab"]
    for count in (1, 2):
        assert grammar_for_tools(parse_tools(tools[:count]), "required")


def test_measure_grammar_skips_quotes_and_classes() -> None:
    shape = measure_grammar('root ::= "((\\"(" [(] ( ( "a" ) ) x{3,7} y{2}\nx ::= "("\ny ::= [)]\n')
    assert (shape.rules, shape.nesting, shape.repetitions) == (3, 2, 9)


@pytest.mark.parametrize(
    ("grammar", "named"),
    [
        ("root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000 + "\n", "256 levels (it has 20000)"),
        ("".join(f"r{i} ::= r{i + 1}\n" for i in range(5000)), "4096 (it has 5000 rules)"),
        ('root ::= "a"{0,150000} "b"{0,150000}\n', "200000 items (it has 300000 items)"),
        ('root ::= "a"{0,99999999999999}\n', "200000 items"),
        ('root ::= "' + "a" * (2 << 20) + '"\n', "1048576 bytes"),
    ],
    ids=["nesting", "rules", "repetitions", "huge count", "bytes"],
)
def test_grammars_past_a_limit_are_refused_in_no_time(grammar: str, named: str) -> None:
    started = time.monotonic()
    with pytest.raises(GrammarError, match=re.escape(named)):
        check_grammar_bounds(grammar)
    assert time.monotonic() - started < 0.5


def test_the_limit_itself_is_allowed() -> None:
    grammar = "root ::= " + "(" * MAX_GRAMMAR_NESTING + '"a"' + ")" * MAX_GRAMMAR_NESTING + "\n"
    assert check_grammar_bounds(grammar).nesting == MAX_GRAMMAR_NESTING
