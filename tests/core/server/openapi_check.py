"""Validate API bodies against OpenAI's published OpenAPI schemas (tests/fixtures/openai_openapi).

The spec is OpenAPI 3.1 but still writes some of OpenAPI 3.0's dialect; it is turned into plain
JSON Schema 2020-12 on load:
- `nullable: true` becomes a `"null"` type (or an `anyOf` with null around a `$ref`);
- `$recursiveRef: "#"` (2019-09's) becomes a `$ref` to the component it sits in;
- a `discriminator` union becomes one `if`/`then` per tag value, so a mismatch inside a stream
  event or output item names its own path instead of "not valid under any of the schemas".
"""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path
from typing import Any

import jsonschema_rs

FIXTURE = Path(__file__).parents[2] / "fixtures" / "openai_openapi" / "openai_schemas.json"
SCHEMA_REF_PREFIX = "#/components/schemas/"
DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "dependentSchemas"})
DATA_KEYWORDS = frozenset({"enum", "const", "default", "required", "discriminator"})
MAX_ERRORS_SHOWN = 10
# Not in the spec: a completions stream chunk (see `_completion_chunk`).
COMPLETION_CHUNK = "CreateCompletionResponse.stream_chunk"


def assert_matches(body: Any, schema_name: str) -> None:
    """Fails with every mismatch (JSON pointer into `body`, message, schema path)."""
    problems = mismatches(body, schema_name)
    if problems:
        shown = "\n  ".join(problems[:MAX_ERRORS_SHOWN])
        more = len(problems) - MAX_ERRORS_SHOWN
        tail = f"\n  … and {more} more" if more > 0 else ""
        raise AssertionError(
            f"body does not match OpenAI's {schema_name}:\n  {shown}{tail}\n"
            f"body: {json.dumps(body)[:2000]}"
        )


def mismatches(body: Any, schema_name: str) -> list[str]:
    return [
        f"at {_pointer(error.instance_path) or '/'}: {error.message} "
        f"(schema {_pointer(error.schema_path)})"
        for error in _validator(schema_name).iter_errors(body)
    ]


def schema_names() -> frozenset[str]:
    return frozenset(_json_schema_components())


def _pointer(path: Any) -> str:
    return "".join(f"/{part}" for part in path)


@functools.cache
def _validator(schema_name: str) -> jsonschema_rs.Validator:
    components = _json_schema_components()
    if schema_name not in components:
        raise KeyError(f"{schema_name!r} is not in the fixture; add it to extract.py's ROOTS")
    root = {
        "$schema": DRAFT_2020_12,
        "$ref": SCHEMA_REF_PREFIX + schema_name,
        "components": {"schemas": components},
    }
    return jsonschema_rs.validator_for(root, validate_formats=False)


@functools.cache
def _raw_schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = json.loads(FIXTURE.read_text(encoding="utf-8"))["schemas"]
    return schemas


@functools.cache
def _json_schema_components() -> dict[str, Any]:
    raw = _raw_schemas()
    components = {name: to_json_schema(schema, name, raw) for name, schema in raw.items()}
    components[COMPLETION_CHUNK] = _completion_chunk(components["CreateCompletionResponse"])
    return components


def _completion_chunk(whole: dict[str, Any]) -> dict[str, Any]:
    """The spec gives completion stream chunks no schema of their own (they are "the same as
    the non-streaming response"), yet OpenAI's streams, like its chat chunks, carry
    `finish_reason: null` until the last one: that one field is widened to allow null."""
    chunk = copy.deepcopy(whole)
    choice = chunk["properties"]["choices"]["items"]
    choice["properties"]["finish_reason"] = _with_null(choice["properties"]["finish_reason"])
    return chunk


def to_json_schema(schema: Any, component: str, components: dict[str, Any]) -> Any:
    """One OpenAPI schema (of the component `component`) as JSON Schema 2020-12."""
    if isinstance(schema, list):
        return [to_json_schema(item, component, components) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted: dict[str, Any] = {}
    for keyword, value in schema.items():
        if keyword in DATA_KEYWORDS:
            converted[keyword] = value
        elif keyword in SCHEMA_MAPS and isinstance(value, dict):
            converted[keyword] = {
                name: to_json_schema(sub, component, components) for name, sub in value.items()
            }
        else:
            converted[keyword] = to_json_schema(value, component, components)
    if converted.get("$recursiveRef") == "#":
        del converted["$recursiveRef"]
        converted["$ref"] = SCHEMA_REF_PREFIX + component
    converted.pop("$recursiveAnchor", None)
    converted = _tagged_union(converted, components)
    return _with_null(converted) if converted.pop("nullable", False) else converted


def _with_null(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str | list) and "$ref" not in schema:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        widened = {**schema, "type": [*kinds, "null"] if "null" not in kinds else kinds}
        if "enum" in schema and None not in schema["enum"]:
            widened["enum"] = [*schema["enum"], None]
        return widened
    return {"anyOf": [schema, {"type": "null"}]}


def _tagged_union(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    """A `discriminator` union whose members all fix their tag, as one if/then per tag."""
    tag = (schema.get("discriminator") or {}).get("propertyName")
    union_keyword = next((k for k in ("anyOf", "oneOf") if k in schema), None)
    if not isinstance(tag, str) or union_keyword is None:
        return schema
    members_by_tag: dict[str, list[dict[str, Any]]] = {}
    for member in schema[union_keyword]:
        values = _tag_values(member, tag, components)
        if not values:
            return schema  # a member without a fixed tag: keep the plain union
        for value in values:
            members_by_tag.setdefault(value, []).append(member)
    branches = [
        {
            "if": {"properties": {tag: {"const": value}}},
            "then": members[0] if len(members) == 1 else {"anyOf": members},
        }
        for value, members in members_by_tag.items()
    ]
    rest = {k: v for k, v in schema.items() if k not in (union_keyword, "discriminator")}
    tag_check = {
        "type": "object",
        "required": [tag],
        "properties": {tag: {"enum": sorted(members_by_tag)}},
    }
    return {**rest, "allOf": [*rest.get("allOf", []), tag_check, *branches]}


def _tag_values(member: Any, tag: str, components: dict[str, Any]) -> list[str]:
    if not isinstance(member, dict):
        return []
    ref = member.get("$ref")
    target = components.get(ref.removeprefix(SCHEMA_REF_PREFIX), {}) if ref else member
    tag_schema = target.get("properties", {}).get(tag, {})
    if "const" in tag_schema:
        return [tag_schema["const"]]
    return [value for value in tag_schema.get("enum", []) if isinstance(value, str)]
