"""llama.cpp's JSON-schema converter, bounded in time and size, with repetitions that do not nest.

The stock converter writes `maxLength: n` as `(char (char (char ...)?)?)?`, n groups deep:
llama.cpp's recursive grammar parser refuses that past about 1000 and overflows its stack
(SIGSEGV) near 18700. Here a length or item count becomes flat `{m,n}` repetitions of named
rules instead, split into chunks below llama.cpp's ceiling of 2000 for one count (above it,
llama.cpp would quietly drop the upper bound). Integer `minimum`/`maximum` bounds become
exact rules, number bounds limit the whole part (core/server/number_grammar.py).

`enforced_by_grammar` says whether the grammar alone makes every reply valid; where it does
not (`multipleOf`, `uniqueItems`, a number's fraction, ...) the reply validator catches the
rest (core/server/validation.py).

Every rule the converter adds is counted against a step budget, a deadline and a size cap, so
a schema that would take long (the optional-property rules grow with the square of their
number) or grow large stops with a clear error instead of holding a worker.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from llama_cpp.llama_grammar import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    STRING_FORMAT_RULES,
    SchemaConverter,
)

from hearthside.core.engine.grammar_limits import MAX_GRAMMAR_BYTES
from hearthside.core.server.number_grammar import (
    UnwritableBound,
    integer_bounds,
    integer_range,
    number_bounds,
    number_range,
)
from hearthside.core.server.schema_limits import StructuredOutputError, subschemas

# Items per chunk: a `{m,n}` count stays at most this, half of llama.cpp's ceiling.
CHUNK = 1000
MAX_CONVERSION_STEPS = 200_000
CONVERSION_SECONDS = 2.0
# Keys that send the stock `visit` elsewhere before it reaches arrays or string lengths.
_EARLIER_BRANCHES = frozenset({"$ref", "oneOf", "anyOf", "const", "enum"})
T = TypeVar("T")
_HINT = "Simplify the schema: fewer properties, alternatives or `$ref`s that repeat each other."


class BoundedSchemaConverter(SchemaConverter):
    """A `SchemaConverter` that stops past its budget and never nests repetitions."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._steps = 0
        self._deadline = time.monotonic() + CONVERSION_SECONDS
        self._rule_sizes: dict[str, int] = {}
        self._total_size = 0

    def _add_rule(self, name: str, rule: str) -> str:
        self._charge_step()
        key = str(super()._add_rule(name, rule))
        self._total_size += len(rule) - self._rule_sizes.get(key, 0)
        self._rule_sizes[key] = len(rule)
        if self._total_size > MAX_GRAMMAR_BYTES:
            raise StructuredOutputError(
                f"The grammar for this JSON schema grows past {MAX_GRAMMAR_BYTES} bytes.",
                hint=_HINT,
            )
        return key

    def _charge_step(self) -> None:
        self._steps += 1
        if self._steps > MAX_CONVERSION_STEPS:
            raise StructuredOutputError(
                f"Turning this JSON schema into a grammar takes more than "
                f"{MAX_CONVERSION_STEPS} steps.",
                hint=_HINT,
            )
        if time.monotonic() > self._deadline:
            raise StructuredOutputError(
                f"Turning this JSON schema into a grammar takes more than "
                f"{CONVERSION_SECONDS:g} s.",
                hint=_HINT,
            )

    def visit(self, schema: Mapping[str, Any], name: str) -> str:
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if _is_bounded(schema, "integer"):
            whole = _bounds(integer_bounds, schema)
            return self._alternatives(integer_range(*whole), rule_name, "integer", schema)
        if _is_bounded(schema, "number"):
            real = _bounds(number_bounds, schema)
            return self._alternatives(number_range(*real), rule_name, "number", schema)
        if _is_untyped_value(schema):
            return self._add_rule(rule_name, self._add_primitive("value", PRIMITIVE_RULES["value"]))
        if _is_length_bounded_string(schema):
            return self._bounded_string(schema, rule_name)
        if _is_array_of_items(schema):
            return self._array(schema, name, rule_name)
        return str(super().visit(schema, name))

    def _alternatives(
        self, alternatives: list[str], rule_name: str, kind: str, schema: Mapping[str, Any]
    ) -> str:
        if not alternatives:
            raise StructuredOutputError(
                f"No {kind} satisfies the bounds {_bounds_text(schema)}; no reply could follow "
                "the schema."
            )
        return self._add_rule(rule_name, f"({' | '.join(alternatives)}) space")

    def _bounded_string(self, schema: Mapping[str, Any], rule_name: str) -> str:
        char = str(self._add_primitive("char", PRIMITIVE_RULES["char"]))
        body = self.repetition(char, schema.get("minLength", 0), schema.get("maxLength"))
        return self._add_rule(rule_name, rf'"\"" {body} "\"" space')

    def _array(self, schema: Mapping[str, Any], name: str, rule_name: str) -> str:
        item = self.visit(_item_schema(schema), f"{name}{'-' if name else ''}item")
        low, high = schema.get("minItems", 0), schema.get("maxItems")
        if high == 0:
            return self._add_rule(rule_name, '"[" space "]" space')
        more = self._add_rule(f"{item}-more", f'"," space {item}')
        rest = self.repetition(more, max(low - 1, 0), None if high is None else high - 1)
        items = self._add_rule(f"{rule_name}-items", f"{item} {rest}".strip())
        optional = "?" if low == 0 else ""
        return self._add_rule(rule_name, f'"[" space {items}{optional} "]" space')

    def repetition(self, item: str, low: int, high: int | None) -> str:
        """GBNF for `low` to `high` (None: no limit) of rule `item` in a row: flat `{m,n}`
        counts of named rules, none above CHUNK, so llama.cpp neither nests nor refuses it."""
        parts = [self._exactly(item, low)] if low else []
        if high is None:
            parts.append(f"{item}*")
        elif high > low:
            parts.append(self._up_to(item, high - low))
        return " ".join(parts)

    def _exactly(self, item: str, count: int) -> str:
        chunks, rest = divmod(count, CHUNK)
        parts = [f"{self._chunk(item)}{{{chunks}}}"] if chunks else []
        if rest:
            parts.append(f"{item}{{{rest}}}")
        return " ".join(parts)

    def _up_to(self, item: str, count: int) -> str:
        if count < CHUNK:
            return f"{item}{{0,{count}}}"
        # Either every chunk and a short tail, or fewer chunks and any tail below a chunk:
        # together exactly 0..count items.
        chunks, rest = divmod(count, CHUNK)
        full = f"{self._chunk(item)}{{{chunks}}}" + (f" {item}{{0,{rest}}}" if rest else "")
        fewer = f"{self._chunk(item)}{{0,{chunks - 1}}} " if chunks > 1 else ""
        return self._add_rule(f"{item}-up-to-{count}", f"{full} | {fewer}{item}{{0,{CHUNK - 1}}}")

    def _chunk(self, item: str) -> str:
        return self._add_rule(f"{item}-{CHUNK}", f"{item}{{{CHUNK}}}")


_UUID_FORMAT = re.compile(r"^uuid[1-5]?$")
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


# Keys the stock `visit` branches on when a schema has no `type`.
_UNTYPED_BRANCHES = frozenset(
    {"$ref", "oneOf", "anyOf", "const", "enum", "properties", "additionalProperties", "allOf",
     "items", "prefixItems", "pattern", "format"}
)  # fmt: skip


def _is_untyped_value(schema: Mapping[str, Any]) -> bool:
    """A schema with no type and none of the keys the stock `visit` needs (`{"title": ...}`,
    as Pydantic writes `Any`; `{"multipleOf": 2}`), which it would refuse: any JSON value."""
    return bool(schema) and "type" not in schema and not _UNTYPED_BRANCHES & schema.keys()


def _is_bounded(schema: Mapping[str, Any], kind: str) -> bool:
    """Whether the stock `visit` would write this schema as a plain `kind` that has bounds."""
    if schema.get("type") != kind or _EARLIER_BRANCHES & schema.keys():
        return False
    return any(keyword in schema for keyword in BOUND_KEYWORDS)


def _bounds(read: Callable[[dict[str, object]], T], schema: Mapping[str, Any]) -> T:
    try:
        return read(dict(schema))
    except UnwritableBound as exc:
        raise StructuredOutputError(
            f"The JSON schema's bounds {_bounds_text(schema)} cannot be met: {exc}."
        ) from None


def _bounds_text(schema: Mapping[str, Any]) -> str:
    return ", ".join(f"{key} {schema[key]}" for key in BOUND_KEYWORDS if key in schema)


def _is_length_bounded_string(schema: Mapping[str, Any]) -> bool:
    """Whether the stock `visit` would write this schema as a string of bounded length."""
    if schema.get("type") != "string" or not {"minLength", "maxLength"} & schema.keys():
        return False
    if _EARLIER_BRANCHES & schema.keys() or "pattern" in schema:
        return False
    string_format = schema.get("format") or ""
    return not (
        _UUID_FORMAT.match(string_format) or f"{string_format}-string" in STRING_FORMAT_RULES
    )


def _is_array_of_items(schema: Mapping[str, Any]) -> bool:
    """Whether the stock `visit` would write this schema as an array of one item schema."""
    kind = schema.get("type")
    if kind not in (None, "array") or _EARLIER_BRANCHES & schema.keys():
        return False
    if kind is None and _is_object_like(schema):
        return False
    return isinstance(_item_schema(schema), Mapping)


def _item_schema(schema: Mapping[str, Any]) -> Any:
    return schema.get("items") or schema.get("prefixItems")


def _is_object_like(schema: Mapping[str, Any]) -> bool:
    extra = schema.get("additionalProperties", True)
    return "properties" in schema or extra is not True or "allOf" in schema


# ---- what the grammar enforces ---------------------------------------------------------------

# Keywords that constrain a value (JSON Schema's applicator and validation vocabularies);
# anything else is an annotation (title, description, default, ...) or a container ($defs).
CONSTRAINT_KEYWORDS = frozenset(
    {
        "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum",
        "exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "maxItems",
        "minItems", "uniqueItems", "maxContains", "minContains", "contains", "maxProperties",
        "minProperties", "required", "dependentRequired", "properties", "patternProperties",
        "additionalProperties", "propertyNames", "items", "prefixItems", "additionalItems",
        "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "not", "if",
        "then", "else", "dependentSchemas", "dependencies", "$ref", "$dynamicRef",
        "$recursiveRef",
    }
)  # fmt: skip
_OBJECT_KEYWORDS = frozenset({"type", "properties", "required", "additionalProperties"})
_ARRAY_KEYWORDS = frozenset({"type", "items", "prefixItems", "minItems", "maxItems"})
_TUPLE_KEYWORDS = frozenset({"type", "items", "prefixItems"})


def enforced_by_grammar(schema: Any) -> bool:
    """Whether the converter's grammar for `schema` admits only values the schema accepts:
    every constraint in every subschema is one the branch `visit` takes writes into the
    grammar. False for `oneOf` (written as `anyOf`), `allOf`, `uniqueItems`, number bounds."""
    pending: list[Any] = [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, bool):
            if not node:
                return False
            continue
        if not isinstance(node, Mapping):
            return False
        if not CONSTRAINT_KEYWORDS.intersection(node) <= _written_keywords(node):
            return False
        pending.extend(child for _, child in subschemas(node, ""))
    return True


def _written_keywords(schema: Mapping[str, Any]) -> frozenset[str]:
    """The constraint keywords of `schema` that the converter's branch for it writes (the
    branches in the order the stock `visit` tries them)."""
    kind = schema.get("type")
    if "$ref" in schema:
        return frozenset({"$ref"})
    if "oneOf" in schema:
        return frozenset()
    if "anyOf" in schema:
        return frozenset({"anyOf"})
    if isinstance(kind, list):
        return frozenset({"type"})
    for keyword in ("const", "enum"):
        if keyword in schema:
            return frozenset({keyword})
    if kind in (None, "object") and _is_object_like(schema):
        return _object_keywords(schema)
    if kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
        return _ARRAY_KEYWORDS if isinstance(_item_schema(schema), Mapping) else _TUPLE_KEYWORDS
    if kind in (None, "string") and "pattern" in schema:
        return frozenset({"type", "pattern"})
    if kind in (None, "string") and _UUID_FORMAT.match(schema.get("format") or ""):
        return frozenset({"type", "format"})
    if kind == "string" and "format" not in schema:
        return frozenset({"type", "minLength", "maxLength"})
    if kind == "integer":
        return frozenset({"type", *BOUND_KEYWORDS})
    return frozenset({"type"})


def _object_keywords(schema: Mapping[str, Any]) -> frozenset[str]:
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    if "properties" not in schema and (extra is None or extra is True):
        return frozenset()  # the converter's `allOf` branch merges properties loosely
    required = schema.get("required", [])
    names = list(properties) if isinstance(properties, Mapping) else []
    if not isinstance(required, list) or any(name not in names for name in required):
        return frozenset()  # a required name the properties never list is not forced
    return _OBJECT_KEYWORDS


# ---- what the grammar cannot enforce at all ----------------------------------------------------

# Keywords the converter writes nothing for, which a reply would meet only by chance: a request
# that uses one is refused before any token is generated (#34: a `multipleOf` the model missed
# cost three full replies, 183 s, then a 422). Keywords the grammar writes in part are served,
# the validator checking the rest: number bounds (the whole part), `oneOf` (as `anyOf`),
# `allOf` (merged), `uniqueItems` (the items), string `format`s.
UNENFORCEABLE_KEYWORDS = frozenset(
    {
        "multipleOf", "not", "if", "then", "else", "dependentRequired", "dependentSchemas",
        "dependencies", "minProperties", "maxProperties", "patternProperties", "propertyNames",
        "contains", "minContains", "maxContains", "unevaluatedItems", "unevaluatedProperties",
    }
)  # fmt: skip


class UnenforceableSchemaError(StructuredOutputError):
    """A JSON schema uses a keyword the grammar cannot enforce; refused before generating."""

    code = "unenforceable_schema"


def check_enforceable(schema: Any, what: str) -> None:
    """Refuses `schema` (called `what` in the message) when any subschema uses one of
    UNENFORCEABLE_KEYWORDS, naming the first and where it is."""
    pending: list[tuple[str, Any]] = [("$", schema)]
    while pending:
        path, node = pending.pop()
        if not isinstance(node, Mapping):
            continue
        found = sorted(UNENFORCEABLE_KEYWORDS.intersection(node))
        if found:
            raise UnenforceableSchemaError(
                f"{what} uses `{found[0]}` (at {path}), which Hearthside cannot make the model "
                f"follow: a reply would meet it only by chance, so the request is refused "
                f"before generating. Remove `{found[0]}` from the schema and check that rule in "
                "your own code (or describe it in the prompt), then send the request again.",
                hint=f"Remove `{found[0]}` and check it yourself.",
            )
        pending.extend(subschemas(node, path))
