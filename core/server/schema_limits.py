"""Limits on the JSON schemas a request may send (`response_format`, tool parameters).

Everything here runs before the schema is copied or converted, so no request can make the
server build something large: the converter's output grows with `maxLength`, `maxItems`,
`enum` and property counts, and llama.cpp's sampler checks every candidate token against
each live alternative (a 1000-value `enum` costs about 11 s a token on Gemma's 262k-token
vocabulary, measured on two cores). The limits sit well above what real clients send and
name the keyword, the value found and the limit when they refuse.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hearthside.core.errors import HearthsideError

MAX_SCHEMA_BYTES = 256 * 1024
MAX_JSON_NESTING = 100
MAX_SCHEMA_DEPTH = 32
MAX_STRING_LENGTH = 65_536
MAX_ARRAY_ITEMS = 65_536
MAX_ENUM_VALUES = 256
MAX_ENUM_VALUES_TOTAL = 1024
MAX_ENUM_BYTES_TOTAL = 64 * 1024
MAX_PROPERTIES_PER_OBJECT = 256
MAX_PROPERTIES_TOTAL = 1024
MAX_ALTERNATIVES = 256
MAX_DEFINITIONS = 256
MAX_PATTERN_LENGTH = 1024
# Each `{m,n}` in a pattern nests n groups in the grammar; this keeps under its nesting limit.
MAX_PATTERN_REPEAT = 200

# Keywords that need dynamic scopes, which neither the grammar nor the validator set-up here
# resolves. Every other keyword is met: by the grammar, or by validating the reply (and
# sampling again), see core/server/validation.py.
UNSUPPORTED_KEYWORDS = frozenset({"$dynamicRef", "$recursiveRef"})
SCHEMA_MAP_KEYWORDS = ("properties", "$defs", "definitions")
SCHEMA_LIST_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems")
SCHEMA_VALUE_KEYWORDS = ("items", "additionalProperties")
LENGTH_LIMITS = (
    ("minLength", "maxLength", MAX_STRING_LENGTH),
    ("minItems", "maxItems", MAX_ARRAY_ITEMS),
)
_HINT = "Make the schema smaller, or check that part of the reply yourself."


class StructuredOutputError(HearthsideError):
    """A `response_format`, `tools` or `tool_choice` field is malformed or unsupported."""


def check_json_nesting(value: Any, what: str) -> None:
    """Refuses containers nested deeper than MAX_JSON_NESTING, without recursing (copying or
    printing a deeper value would overflow Python's stack)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        node, depth = pending.pop()
        if not isinstance(node, Mapping | list | tuple):
            continue
        children = node.values() if isinstance(node, Mapping) else node
        if depth > MAX_JSON_NESTING:
            raise StructuredOutputError(
                f"{what} nests objects and arrays more than {MAX_JSON_NESTING} levels deep.",
                hint=_HINT,
            )
        pending.extend((child, depth + 1) for child in children)


def check_schema(schema: Mapping[str, Any]) -> None:
    """Every limit above, for one schema (all of a request's tools come as one `anyOf`)."""
    check_json_nesting(schema, "The JSON schema")
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_SCHEMA_BYTES:
        raise StructuredOutputError(
            f"The JSON schema is {size} bytes; the limit is {MAX_SCHEMA_BYTES}.", hint=_HINT
        )
    _check_subschema(schema, "$", 0, _Tally())


@dataclass
class _Tally:
    """Counts that are limited over the whole schema, not per keyword."""

    enum_values: int = 0
    enum_bytes: int = 0
    properties: int = 0


def _check_subschema(schema: Any, path: str, depth: int, tally: _Tally) -> None:
    if not isinstance(schema, Mapping):
        if isinstance(schema, bool) and path != "$":
            return
        raise StructuredOutputError(f"The JSON schema at {path} must be an object.")
    if depth > MAX_SCHEMA_DEPTH:
        raise StructuredOutputError(
            f"The JSON schema nests subschemas more than {MAX_SCHEMA_DEPTH} levels deep "
            f"(at {path}).",
            hint=_HINT,
        )
    _check_supported(schema, path)
    _check_bounds(schema, path)
    _check_ref(schema, path)
    _check_lengths(schema, path)
    _check_constants(schema, path, tally)
    _check_counts(schema, path, tally)
    _check_pattern(schema, path)
    for child_path, child in subschemas(schema, path):
        _check_subschema(child, child_path, depth + 1, tally)


def subschemas(schema: Mapping[str, Any], path: str) -> Iterator[tuple[str, Any]]:
    """The schemas inside `schema` that the converter visits, with their paths."""
    for keyword in SCHEMA_MAP_KEYWORDS:
        children = schema.get(keyword)
        if isinstance(children, Mapping):
            for key, child in children.items():
                yield f"{path}.{keyword}.{key}", child
    for keyword in SCHEMA_LIST_KEYWORDS:
        children = schema.get(keyword)
        if isinstance(children, list):
            for index, child in enumerate(children):
                yield f"{path}.{keyword}[{index}]", child
    for keyword in SCHEMA_VALUE_KEYWORDS:
        child = schema.get(keyword)
        if isinstance(child, Mapping):
            yield f"{path}.{keyword}", child
        elif isinstance(child, list):
            for index, item in enumerate(child):
                yield f"{path}.{keyword}[{index}]", item


def _check_supported(schema: Mapping[str, Any], path: str) -> None:
    unsupported = sorted(UNSUPPORTED_KEYWORDS.intersection(schema))
    if unsupported:
        keyword = unsupported[0]
        raise StructuredOutputError(
            f"The JSON schema uses `{keyword}` (at {path}), which Hearthside does not support.",
            hint="Use a local `$ref` (`#/$defs/...`) instead.",
        )


def _check_bounds(schema: Mapping[str, Any], path: str) -> None:
    """Refuses a lower bound above the upper one (a number range no value can meet)."""
    lows = [
        (key, schema[key]) for key in ("minimum", "exclusiveMinimum") if _is_number(schema, key)
    ]
    highs = [
        (key, schema[key]) for key in ("maximum", "exclusiveMaximum") if _is_number(schema, key)
    ]
    for low_key, low in lows:
        for high_key, high in highs:
            inclusive = low_key == "minimum" and high_key == "maximum"
            if low > high or (low == high and not inclusive):
                raise StructuredOutputError(
                    f"The JSON schema's `{low_key}` ({low}) is not below its `{high_key}` "
                    f"({high}) (at {path}); no reply could satisfy both."
                )


def _is_number(schema: Mapping[str, Any], keyword: str) -> bool:
    value = schema.get(keyword)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_ref(schema: Mapping[str, Any], path: str) -> None:
    ref = schema.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        raise StructuredOutputError(
            f"The JSON schema refers to {ref!r} (at {path}); only local `#/...` refs work."
        )


def _check_lengths(schema: Mapping[str, Any], path: str) -> None:
    for low_keyword, high_keyword, limit in LENGTH_LIMITS:
        low = _count(schema, low_keyword, limit, path)
        high = _count(schema, high_keyword, limit, path)
        if low is not None and high is not None and low > high:
            raise StructuredOutputError(
                f"The JSON schema's `{low_keyword}` ({low}) is larger than its "
                f"`{high_keyword}` ({high}) (at {path}); no reply could satisfy both."
            )


def _count(schema: Mapping[str, Any], keyword: str, limit: int, path: str) -> int | None:
    value = schema.get(keyword)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StructuredOutputError(
            f"The JSON schema's `{keyword}` must be a whole number of at least 0 (at {path})."
        )
    if value > limit:
        raise StructuredOutputError(
            f"The JSON schema sets `{keyword}` to {value} (at {path}); the limit is {limit}.",
            hint=f"Use a `{keyword}` of at most {limit}; a reply is at most max_tokens long.",
        )
    return value


def _check_constants(schema: Mapping[str, Any], path: str, tally: _Tally) -> None:
    values: list[Any] = []
    if "enum" in schema:
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            raise StructuredOutputError(
                f"The JSON schema's `enum` must be a non-empty list (at {path})."
            )
        if len(enum) > MAX_ENUM_VALUES:
            raise StructuredOutputError(
                f"The JSON schema's `enum` has {len(enum)} values (at {path}); the limit is "
                f"{MAX_ENUM_VALUES}.",
                hint="For a long list of choices use a plain string and check the value yourself.",
            )
        values.extend(enum)
    if "const" in schema:
        values.append(schema["const"])
    tally.enum_values += len(values)
    tally.enum_bytes += sum(len(json.dumps(value, ensure_ascii=False)) for value in values)
    if tally.enum_values > MAX_ENUM_VALUES_TOTAL:
        raise StructuredOutputError(
            f"The JSON schema has more than {MAX_ENUM_VALUES_TOTAL} `enum`/`const` values in "
            f"all ({tally.enum_values} by {path}).",
            hint=_HINT,
        )
    if tally.enum_bytes > MAX_ENUM_BYTES_TOTAL:
        raise StructuredOutputError(
            f"The JSON schema's `enum`/`const` values come to more than {MAX_ENUM_BYTES_TOTAL} "
            f"bytes ({tally.enum_bytes} by {path}).",
            hint=_HINT,
        )


def _check_counts(schema: Mapping[str, Any], path: str, tally: _Tally) -> None:
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        _at_most(len(properties), MAX_PROPERTIES_PER_OBJECT, "`properties`", path)
        tally.properties += len(properties)
        if tally.properties > MAX_PROPERTIES_TOTAL:
            raise StructuredOutputError(
                f"The JSON schema has more than {MAX_PROPERTIES_TOTAL} properties in all "
                f"({tally.properties} by {path}).",
                hint=_HINT,
            )
    for keyword in (*SCHEMA_LIST_KEYWORDS, "type", "items"):
        if isinstance(schema.get(keyword), list):
            _at_most(len(schema[keyword]), MAX_ALTERNATIVES, f"`{keyword}`", path)
    for keyword in ("$defs", "definitions"):
        if isinstance(schema.get(keyword), Mapping):
            _at_most(len(schema[keyword]), MAX_DEFINITIONS, f"`{keyword}`", path)


def _at_most(found: int, limit: int, what: str, path: str) -> None:
    if found > limit:
        raise StructuredOutputError(
            f"The JSON schema's {what} has {found} entries (at {path}); the limit is {limit}.",
            hint=_HINT,
        )


def _check_pattern(schema: Mapping[str, Any], path: str) -> None:
    pattern = schema.get("pattern")
    if pattern is None:
        return
    if not isinstance(pattern, str):
        raise StructuredOutputError(f"The JSON schema's `pattern` must be a string (at {path}).")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise StructuredOutputError(
            f"The JSON schema's `pattern` is {len(pattern)} characters long (at {path}); the "
            f"limit is {MAX_PATTERN_LENGTH}.",
            hint=_HINT,
        )
    largest = max(_pattern_repeat_counts(pattern), default=0)
    if largest > MAX_PATTERN_REPEAT:
        raise StructuredOutputError(
            f"The JSON schema's `pattern` repeats something {largest} times (at {path}); the "
            f"limit for one `{{m,n}}` in a pattern is {MAX_PATTERN_REPEAT}.",
            hint="Use a smaller count in the pattern, or `maxLength` for the length of a string.",
        )


def _pattern_repeat_counts(pattern: str) -> Iterator[int]:
    """The numbers in a pattern's `{m}`, `{m,}` and `{m,n}` quantifiers (escapes skipped)."""
    index = 0
    while index < len(pattern):
        if pattern[index] == "\\":
            index += 2
            continue
        if pattern[index] == "{":
            end = pattern.find("}", index)
            if end < 0:
                return
            for part in pattern[index + 1 : end].split(","):
                digits = part.strip()
                if digits.isascii() and digits.isdigit():
                    yield int(digits) if len(digits) < 10 else MAX_PATTERN_REPEAT + 1
            index = end
        index += 1
