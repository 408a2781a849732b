"""Structured output for the API: JSON replies (`response_format`) and tool calls (`tools`).

Everything here is pure: request fields in, GBNF grammars, prompts and parsed replies out. The
grammar makes the model's reply follow the shape; the parsers turn that reply into OpenAI's.

A tool call is the reply `{"name": "<tool>", "arguments": {...}}`; several calls in one reply
are a JSON array of such objects. Its `arguments` text is the model's own substring of that
value, so the streamed pieces and the non-streamed `ToolCall` carry exactly the same string.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hearthside.core.engine.grammar_limits import GrammarError, check_grammar_bounds
from hearthside.core.server.schema_converter import BoundedSchemaConverter, check_enforceable
from hearthside.core.server.schema_limits import (
    StructuredOutputError,
    check_json_nesting,
    check_schema,
    subschemas,
)

TOOL_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

# The converter's string `char` admits raw control characters, which strict JSON parsers reject.
STRICT_JSON_CHAR_RULE = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] '
    r"[0-9a-fA-F] [0-9a-fA-F])"
)
# Plain text in `auto` mode: whatever starts with neither "{" nor a space (the engine drops a
# reply's leading spaces, so " {" would read as a tool call).
PLAIN_TEXT_RULES = "plain-text ::= [^{[ \\t\\r\\n] [^\\x00]*"
# Matched again on every token while a call's head streams in, so each repetition is bounded:
# one try costs the same however long the reply grows (issue 36). A name is at most 64
# characters (TOOL_NAME_RE); a head that does not fit is parsed whole when the reply ends.
HEAD_RE = re.compile(
    r'[ \t\r\n]{0,64}\{[ \t\r\n]{0,64}"name"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}'
    r'("(?:[^"\\]|\\.){0,256}")'
    r'[ \t\r\n]{0,64},[ \t\r\n]{0,64}"arguments"[ \t\r\n]{0,64}:[ \t\r\n]{0,64}'
)
WHITESPACE = " \t\r\n"
# Several calls are an array the model opens with "[": a model that writes one call's object
# is done (Gemma 3 270M repeats a call, one per line, until the limit, given the choice).
MAX_PARALLEL_CALLS = 8
CALL_FORMAT = (
    '{"name": <tool name>, "arguments": <an object that follows the tool\'s parameters schema>}'
)
# What llama.cpp's converter raises on schemas it cannot handle (it asserts a lot).
_CONVERTER_FAILURES = (
    AssertionError,
    AttributeError,
    IndexError,
    KeyError,
    RecursionError,
    TypeError,
    ValueError,
)


# ---- JSON schemas to GBNF ----------------------------------------------------------------


class _GrammarBuilder:
    """Converts JSON schemas into named GBNF rules of one grammar, then adds a `root`."""

    def __init__(self) -> None:
        self._converter = BoundedSchemaConverter()

    def add_schema(self, schema: Mapping[str, Any], rule_name: str) -> str:
        """Rules for `schema`; returns the rule that matches it (never `root`)."""
        check_schema(schema)
        own_copy = copy.deepcopy(dict(schema))  # the converter rewrites `$ref`s in place
        try:
            resolved = self._converter.resolve_refs(own_copy, "")
            return str(self._converter.visit(resolved, rule_name))
        except _CONVERTER_FAILURES as exc:
            raise StructuredOutputError(
                f"The JSON schema could not be turned into a grammar ({_short(exc)}).",
                hint="Simplify the schema: plain types, properties, required, enum, items.",
            ) from exc

    def grammar(self, root_rule: str, *extra_rules: str) -> str:
        rules = [_strict_json_rule(line) for line in self._converter.format_grammar().splitlines()]
        grammar = "\n".join([f"root ::= {root_rule}", *extra_rules, *rules]) + "\n"
        try:
            check_grammar_bounds(grammar)
        except GrammarError as exc:
            raise StructuredOutputError(exc.message, hint=exc.hint) from None
        return grammar


def _strict_json_rule(line: str) -> str:
    return STRICT_JSON_CHAR_RULE if line.startswith("char ::= ") else line


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def _json_grammar(schema: Mapping[str, Any]) -> str:
    check_enforceable(schema, "The JSON schema of response_format")
    builder = _GrammarBuilder()
    reply = builder.add_schema(schema, "json-reply")
    return builder.grammar(f'" "? {reply}')


# ---- response_format ---------------------------------------------------------------------


def grammar_for_response_format(response_format: Mapping[str, Any] | None) -> str | None:
    """The grammar an OpenAI `response_format` asks for; None when the reply is free text."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise StructuredOutputError("response_format must be an object with a `type`.")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return _json_grammar({"type": "object"})
    if kind == "json_schema":
        return _json_grammar(_schema_of(response_format.get("json_schema")))
    raise StructuredOutputError(
        f"response_format type {kind!r} is not supported; use text, json_object or json_schema."
    )


def _schema_of(json_schema: Any) -> Mapping[str, Any]:
    if not isinstance(json_schema, Mapping):
        raise StructuredOutputError(
            "response_format of type json_schema needs a `json_schema` object."
        )
    name = json_schema.get("name")
    if name is not None and not isinstance(name, str):
        raise StructuredOutputError("response_format.json_schema.name must be a string.")
    strict = json_schema.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise StructuredOutputError("response_format.json_schema.strict must be true or false.")
    schema = json_schema.get("schema", {"type": "object"})
    if not isinstance(schema, Mapping):
        raise StructuredOutputError("response_format.json_schema.schema must be an object.")
    return schema


# ---- tools -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolSpec:
    """One function the model may call; `parameters` is its arguments' JSON schema."""

    name: str
    description: str | None
    parameters: dict[str, Any]


def parse_tools(tools: Sequence[Mapping[str, Any]] | None) -> tuple[ToolSpec, ...]:
    """The tools of an OpenAI request (`[{"type": "function", "function": {...}}]`), checked."""
    if tools is None:
        return ()
    if isinstance(tools, str | bytes | Mapping) or not isinstance(tools, Sequence):
        raise StructuredOutputError("tools must be a list of tool objects.")
    specs = tuple(_parse_tool(tool, f"tools[{index}]") for index, tool in enumerate(tools))
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise StructuredOutputError(
            f"Tool names must be unique; repeated: {', '.join(duplicates)}."
        )
    return specs


def _parse_tool(tool: Any, where: str) -> ToolSpec:
    if not isinstance(tool, Mapping) or tool.get("type") != "function":
        raise StructuredOutputError(f'{where} must be an object with "type": "function".')
    function = tool.get("function")
    if not isinstance(function, Mapping):
        raise StructuredOutputError(f"{where}.function must be an object.")
    name = function.get("name")
    if not isinstance(name, str) or not TOOL_NAME_RE.fullmatch(name):
        raise StructuredOutputError(
            f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'."
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise StructuredOutputError(f"{where}.function.description must be a string.")
    parameters = function.get("parameters", NO_PARAMETERS)
    if not isinstance(parameters, Mapping):
        raise StructuredOutputError(f"{where}.function.parameters must be a JSON schema object.")
    check_json_nesting(parameters, f"{where}.function.parameters")  # before copying it
    return ToolSpec(name=name, description=description, parameters=copy.deepcopy(dict(parameters)))


def tool_prompt(tools: Sequence[ToolSpec], *, parallel: bool = True) -> str:
    """A system-message paragraph that lists the tools and says how to call them."""
    listed = "\n".join(_tool_line(tool) for tool in tools)
    how = (
        "To call a tool, reply with a JSON object and nothing else: " + CALL_FORMAT + ". When "
        "the request needs several calls (the same tool for two cities, say), reply with a "
        "JSON array of such objects instead, one per call."
        if parallel
        else "To call one, reply with exactly one JSON object and nothing else: "
        + CALL_FORMAT
        + "."
    )
    return (
        f"You can call the tools listed below. {how} To answer without a tool, reply in plain "
        'text that does not start with "{".\n'
        f"Tools:\n{listed}"
    )


def _tool_line(tool: ToolSpec) -> str:
    description = f": {tool.description}" if tool.description else ""
    schema = json.dumps(tool.parameters, ensure_ascii=False)
    return f"- {tool.name}{description} Parameters (JSON schema): {schema}"


def allows_parallel_calls(tool_choice: Any, parallel_tool_calls: bool | None) -> bool:
    """Whether a reply may make several calls: unless the request says no (OpenAI's default
    is yes) or names the one function to call."""
    return parallel_tool_calls is not False and not isinstance(tool_choice, Mapping)


def grammar_for_tools(
    tools: Sequence[ToolSpec],
    tool_choice: str | Mapping[str, Any] | None,
    *,
    parallel: bool = True,
) -> str | None:
    """The grammar a `tool_choice` asks for; None when the reply is free text. With `parallel`
    a reply may instead be a JSON array of 1 to MAX_PARALLEL_CALLS calls."""
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none" or (not tools and choice == "auto"):
        return None
    if choice == "auto":
        return _tool_grammar(tools, allow_plain_text=True, parallel=parallel)
    if choice == "required":
        if not tools:
            raise StructuredOutputError('tool_choice "required" needs at least one tool.')
        return _tool_grammar(tools, allow_plain_text=False, parallel=parallel)
    named = [_named_tool(tools, choice)]
    return _tool_grammar(named, allow_plain_text=False, parallel=False)  # see allows_parallel_calls


def _named_tool(tools: Sequence[ToolSpec], choice: Any) -> ToolSpec:
    function = choice.get("function") if isinstance(choice, Mapping) else None
    if not isinstance(function, Mapping) or choice.get("type") != "function":
        raise StructuredOutputError(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}.'
        )
    name = function.get("name")
    for tool in tools:
        if tool.name == name:
            return tool
    raise StructuredOutputError(f"tool_choice names {name!r}, which is not among the tools.")


def _tool_grammar(tools: Sequence[ToolSpec], *, allow_plain_text: bool, parallel: bool) -> str:
    for tool in tools:
        check_enforceable(tool.parameters, f"The parameters schema of tool {tool.name!r}")
    if len(tools) == 1:
        schema = _call_schema(tools[0], "#/properties/arguments")
    else:  # llama.cpp's converter resolves refs through objects only, never list indices
        calls = {
            f"call-{i}": _call_schema(tool, f"#/$defs/call-{i}/properties/arguments")
            for i, tool in enumerate(tools)
        }
        schema = {"$defs": calls, "anyOf": [{"$ref": f"#/$defs/{name}"} for name in calls]}
    builder = _GrammarBuilder()
    call_rule = builder.add_schema(schema, "tool-call")
    if parallel:
        more = f'"," space {call_rule}'
        call_rule = (
            f'({call_rule} | "[" space {call_rule} ({more}){{0,{MAX_PARALLEL_CALLS - 1}}} "]")'
        )
    if allow_plain_text:
        return builder.grammar(f'" "? ({call_rule} | plain-text)', PLAIN_TEXT_RULES)
    return builder.grammar(f'" "? {call_rule}')


def _call_schema(tool: ToolSpec, arguments_at: str) -> dict[str, Any]:
    # "name" comes first so a stream can announce the tool before its arguments.
    return {
        "type": "object",
        "properties": {
            "name": {"const": tool.name},
            "arguments": _rebased_refs(tool.parameters, arguments_at),
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _rebased_refs(parameters: dict[str, Any], root: str) -> dict[str, Any]:
    """A copy of `parameters` whose local `$ref`s (written against the parameters as their own
    document) point at `root`, where the parameters sit inside the call schema."""
    rebased = copy.deepcopy(parameters)
    pending: list[Any] = [rebased]
    while pending:
        schema = pending.pop()
        if not isinstance(schema, dict):
            continue
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            schema["$ref"] = root + ref[1:]
        pending.extend(child for _, child in subschemas(schema, ""))
    return rebased


# ---- parsing replies ---------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A call the model made; `arguments` is JSON text, as OpenAI returns it."""

    id: str
    name: str
    arguments: str


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def parse_tool_call(text: str, tools: Sequence[ToolSpec]) -> ToolCall | None:
    """The one tool call `text` makes, or None when it is a plain answer, not a valid call,
    or several calls."""
    calls = parse_tool_calls(text, tools)
    return calls[0] if calls is not None and len(calls) == 1 else None


def parse_tool_calls(
    text: str, tools: Sequence[ToolSpec], *, cut_off: bool = False
) -> tuple[ToolCall, ...] | None:
    """The tool calls `text` makes (one call's JSON object, or a JSON array of them), or None
    when it is a plain answer or anything in it is not a valid call. With `cut_off` (the
    token limit ended the reply) an array's unfinished last call is left out, as a stream
    would have sent the calls before it."""
    stripped = text.strip(WHITESPACE)
    names = {tool.name for tool in tools}
    if stripped.startswith("["):
        return _parse_calls(stripped[1:], names, in_list=True, cut_off=cut_off)
    calls = _parse_calls(stripped, names, in_list=False, cut_off=False)
    return calls if calls is not None and len(calls) == 1 else None


def _parse_calls(
    text: str, names: set[str], *, in_list: bool, cut_off: bool
) -> tuple[ToolCall, ...] | None:
    """Calls one after another in `text` (comma-separated up to a "]" when `in_list`)."""
    decoder = json.JSONDecoder()
    calls: list[ToolCall] = []
    index = _skip_space(text, 0)
    while index < len(text):
        if in_list and text[index] == "]":
            closed = _skip_space(text, index + 1) == len(text)
            return tuple(calls) or None if closed else None
        if text[index] != "{":
            return None
        try:
            reply, end = decoder.raw_decode(text, index)
        except ValueError:
            return tuple(calls) if cut_off and calls else None
        call = _call_from(text[index:end], reply, names)
        if call is None:
            return None
        calls.append(call)
        index = _skip_space(text, end)
        if in_list and index < len(text) and text[index] == ",":
            index = _skip_space(text, index + 1)
    return tuple(calls) if calls and (cut_off or not in_list) else None


def _call_from(text: str, reply: Any, names: set[str]) -> ToolCall | None:
    if not isinstance(reply, dict) or not isinstance(reply.get("arguments"), dict):
        return None
    name = reply.get("name")
    if not isinstance(name, str) or name not in names:
        return None
    start, end = _member_spans(text)["arguments"]
    return ToolCall(id=new_tool_call_id(), name=name, arguments=text[start:end])


def render_tool_calls(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant message's OpenAI `tool_calls` as the model writes calls: one
    `{"name": ..., "arguments": {...}}`, or an array of them (arguments that are no JSON stay
    text)."""
    rendered: list[dict[str, Any]] = []
    for call in tool_calls:
        function = call.get("function")
        function = function if isinstance(function, Mapping) else {}
        arguments = function.get("arguments", "{}")
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        rendered.append({"name": function.get("name"), "arguments": arguments})
    return json.dumps(rendered[0] if len(rendered) == 1 else rendered)


def _member_spans(text: str) -> dict[str, tuple[int, int]]:
    """Where each top-level member's value lies in `text`, a JSON object known to be valid."""
    decoder = json.JSONDecoder()
    spans: dict[str, tuple[int, int]] = {}
    index = _skip_space(text, text.index("{") + 1)
    while text[index] == '"':
        key, index = decoder.raw_decode(text, index)
        value_start = _skip_space(text, _skip_space(text, index) + 1)  # past the ":"
        _, value_end = decoder.raw_decode(text, value_start)
        spans[key] = (value_start, value_end)
        index = _skip_space(text, value_end)
        if text[index] == ",":
            index = _skip_space(text, index + 1)
    return spans


def _skip_space(text: str, index: int) -> int:
    while index < len(text) and text[index] in WHITESPACE:
        index += 1
    return index


# ---- streaming ---------------------------------------------------------------------------


class _JsonValueEnd:
    """Follows a JSON object or array one character at a time, to see where it ends."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.done = False

    def take(self, char: str) -> None:
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
        elif char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            self.done = self.depth == 0


class ToolCallStream:
    """Turns streamed reply text into OpenAI `chat.completion.chunk` deltas.

    Text is held back until its first non-space character says what the reply is: "{" starts
    a tool call, "[" an array of them, anything else is plain content. A tool call is announced
    (its `index`, id and whole name) once `"arguments":` has been seen; the arguments'
    characters then stream as they come, and the outer object's closing brace is dropped. In
    an array, the next "{" starts the next call, with the next index. A call in another key
    order is sent whole by `finish` (with any calls after it), which also turns a "{" reply
    that is no valid call into content.
    """

    def __init__(self, tools: Sequence[ToolSpec]) -> None:
        self._tools = tuple(tools)
        self._names = {tool.name for tool in tools}
        self.tool_call_ids: list[str] = []  # one per call announced, in order
        self._mode = "undecided"  # -> "content" | "head" | "arguments" | "between" | "whole"
        self._held = ""
        self._arguments = _JsonValueEnd()
        self._in_list = False  # the reply is an array of calls
        self._call_open = False  # a streamed call's closing brace is still to come

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The deltas `piece` makes ready."""
        if self._mode == "content":
            return _content(piece)
        if self._mode == "arguments":
            return self._stream_arguments(piece)
        self._held += piece
        if self._mode == "undecided":
            return self._decide()
        if self._mode == "head":
            return self._try_head()
        if self._mode == "between":
            return self._try_next_call()
        return []

    def finish(self, *, cut_off: bool = False) -> tuple[list[dict[str, Any]], str]:
        """The deltas still held back, and the finish_reason ("tool_calls" or "stop"). With
        `cut_off` (the token limit ended the reply) call syntax is never sent as content: a call
        whose name was written is sent with the arguments written so far, the rest is dropped."""
        if self._mode in ("arguments", "between"):
            return [], "tool_calls"
        if cut_off and self._mode in ("head", "whole"):
            return self._cut_off_call(), "tool_calls"
        if self._mode in ("head", "whole"):
            calls = _parse_calls(
                self._held, self._names, in_list=self._in_list, cut_off=self._in_list
            )
            if not self._in_list and calls is not None and len(calls) != 1:
                calls = None
            if calls is not None:
                deltas = []
                for call in calls:
                    deltas += [
                        self._announce(call.name, call.id),
                        *self._arguments_delta(call.arguments),
                    ]
                return deltas, "tool_calls"
            if self.tool_call_ids:  # a later call cut short: the earlier ones stand
                return [], "tool_calls"
        held, self._held = self._held, ""
        return _content(held), "stop"

    def _cut_off_call(self) -> list[dict[str, Any]]:
        """The call whose head the token limit left whole, with its arguments so far."""
        held, self._held = self._held, ""
        head = HEAD_RE.match(held)
        if head is None or json.loads(head.group(1)) not in self._names:
            return []
        arguments = held[head.end() :]
        if arguments and not arguments.startswith("{"):
            return []
        announced = self._announce(json.loads(head.group(1)), new_tool_call_id())
        return [announced, *self._arguments_delta(arguments)]

    def _decide(self) -> list[dict[str, Any]]:
        stripped = self._held.lstrip(WHITESPACE)
        if not stripped:
            return []
        if stripped.startswith("{"):
            self._mode = "head"
            return self._try_head()
        if stripped.startswith("["):
            self._mode, self._in_list, self._held = "between", True, stripped[1:]
            return self._try_next_call()
        self._mode = "content"
        held, self._held = self._held, ""
        return _content(held)

    def _try_head(self) -> list[dict[str, Any]]:
        head = HEAD_RE.match(self._held)
        if head is None or head.end() == len(self._held):
            return []  # the first character of the arguments says whether they can stream
        name = json.loads(head.group(1))
        if name not in self._names or self._held[head.end()] != "{":
            self._mode = "whole"
            return []
        self._mode = "arguments"
        self._arguments = _JsonValueEnd()
        rest, self._held = self._held[head.end() :], ""
        return [self._announce(name, new_tool_call_id()), *self._stream_arguments(rest)]

    def _stream_arguments(self, piece: str) -> list[dict[str, Any]]:
        taken = 0
        while taken < len(piece) and not self._arguments.done:
            self._arguments.take(piece[taken])
            taken += 1
        deltas = self._arguments_delta(piece[:taken])
        if self._arguments.done:
            self._mode, self._call_open, self._held = "between", True, piece[taken:]
            deltas += self._try_next_call()
        return deltas

    def _try_next_call(self) -> list[dict[str, Any]]:
        """Between calls: the last one's closing brace, then in an array "," and the next "{"."""
        rest = self._held.lstrip(WHITESPACE)
        if self._call_open:
            if not rest.startswith("}"):
                return []
            rest, self._call_open = rest[1:], False
        self._held = rest.lstrip(WHITESPACE + ",") if self._in_list else rest
        if not (self._in_list and self._held.startswith("{")):
            return []
        self._mode = "head"
        return self._try_head()

    def _announce(self, name: str, call_id: str) -> dict[str, Any]:
        self.tool_call_ids.append(call_id)
        call = {"index": len(self.tool_call_ids) - 1, "id": call_id, "type": "function"}
        return {"tool_calls": [{**call, "function": {"name": name, "arguments": ""}}]}

    def _arguments_delta(self, piece: str) -> list[dict[str, Any]]:
        if not piece:
            return []
        index = len(self.tool_call_ids) - 1
        return [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]}]


def cut_off_tool_calls(text: str, tools: Sequence[ToolSpec]) -> tuple[ToolCall, ...] | None:
    """The calls a reply the token limit cut short had begun, exactly as a stream of it sends
    them (the last one's arguments unfinished); None when the reply is plain text."""
    if not text.lstrip(WHITESPACE).startswith(("{", "[")):
        return None
    stream = ToolCallStream(tools)
    deltas = stream.feed(text)
    rest, _finish = stream.finish(cut_off=True)
    return calls_from_deltas([*deltas, *rest])


def calls_from_deltas(deltas: Sequence[Mapping[str, Any]]) -> tuple[ToolCall, ...]:
    """The calls a client assembles from stream deltas, by `index`, as OpenAI's SDK does."""
    calls: list[ToolCall] = []
    for delta in deltas:
        for part in delta.get("tool_calls", ()):
            function = part["function"]
            if part["index"] == len(calls):
                calls.append(ToolCall(part["id"], function["name"], function["arguments"]))
            else:
                call = calls[part["index"]]
                arguments = call.arguments + function["arguments"]
                calls[part["index"]] = ToolCall(call.id, call.name, arguments)
    return tuple(calls)


def _content(piece: str) -> list[dict[str, Any]]:
    return [{"content": piece}] if piece else []
