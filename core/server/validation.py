"""Structured replies checked against their full JSON schema, sampled again when one fails.

The grammar shapes a reply but cannot say everything a schema can (`multipleOf`,
`uniqueItems`, a number's fraction, string formats): every JSON reply and every tool call's
arguments are checked with a real validator (jsonschema_rs, offline: no `$ref` is fetched).
A reply that fails is generated again, up to MAX_ATTEMPTS in all; if none passes the request
fails with `InvalidReplyError` rather than answer with an invalid value.

A stream whose schema the grammar enforces in full streams as it is generated (the check at
the end only guards against a converter bug). Otherwise its text is held back until it passed,
since a streamed reply cannot be taken back; plain text in tool `auto` mode needs no check and
is let through as soon as it shows it is not a call.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import jsonschema_rs

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.errors import HearthsideError
from hearthside.core.server.schema_converter import enforced_by_grammar
from hearthside.core.server.schema_limits import StructuredOutputError
from hearthside.core.server.structured import WHITESPACE, ToolSpec, parse_tool_calls

MAX_ATTEMPTS = 3
# A greedy request sampled again would repeat itself: later attempts sample at llama.cpp's
# default temperature, from a seed derived from the request's, so they stay reproducible.
RESAMPLE_TEMPERATURE = 0.8
MAX_PROBLEMS_SHOWN = 3
# Replies a limit cut short are returned as they are, unchecked (finish_reason "length").
UNFINISHED_STOPS = frozenset({"length", "context_full"})
DRAFTS = {
    "http://json-schema.org/draft-04/schema": jsonschema_rs.Draft4Validator,
    "http://json-schema.org/draft-06/schema": jsonschema_rs.Draft6Validator,
    "http://json-schema.org/draft-07/schema": jsonschema_rs.Draft7Validator,
    "https://json-schema.org/draft/2019-09/schema": jsonschema_rs.Draft201909Validator,
    "https://json-schema.org/draft/2020-12/schema": jsonschema_rs.Draft202012Validator,
}
log = logging.getLogger(__name__)

Generate = Callable[[SamplingParams, Callable[..., None] | None], GenerationResult]


class InvalidReplyError(HearthsideError):
    """No reply the model gave in MAX_ATTEMPTS tries follows the request's schema."""


def compile_validator(schema: Mapping[str, Any], what: str) -> Any:
    """A validator for `schema` (draft from its `$schema`, 2020-12 when unnamed or unknown),
    formats checked; an invalid schema is a StructuredOutputError naming what is wrong."""
    schema = dict(schema)
    draft = DRAFTS.get(
        str(schema.pop("$schema", "")).rstrip("#"), jsonschema_rs.Draft202012Validator
    )
    try:
        return draft(schema, validate_formats=True, offline=True)
    except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StructuredOutputError(f"{what} is not a valid JSON schema: {first_line}") from None


def _problems(validator: Any, value: Any, where: str) -> list[str]:
    return [
        f"{where}{''.join(f'[{part!r}]' for part in error.instance_path)}: {error.message}"
        for error in validator.iter_errors(value)
    ]


@dataclass(frozen=True)
class ReplyCheck:
    """How to check one request's replies: a JSON reply against `schema_validator`, or tool
    calls against each tool's validator."""

    schema_validator: Any = None
    tool_validators: Mapping[str, Any] | None = None
    tools: tuple[ToolSpec, ...] = ()
    grammar_enforces_all: bool = True

    def problems(self, text: str) -> list[str]:
        """Why `text` breaks the schema; [] when it follows it."""
        if self.tool_validators is None:
            return self._json_problems(text)
        if self.is_free_text(text):
            return []
        calls = parse_tool_calls(text, self.tools)
        if calls is None:
            return ["the reply is not a well-formed tool call"]
        found = []
        for call in calls:
            arguments = json.loads(call.arguments)
            found += _problems(self.tool_validators[call.name], arguments, f"{call.name} arguments")
        return found

    def _json_problems(self, text: str) -> list[str]:
        try:
            value = json.loads(text)
        except ValueError as exc:
            return [f"the reply is not JSON ({exc})"]
        return _problems(self.schema_validator, value, "reply")

    def is_free_text(self, text: str) -> bool:
        """Whether `text` (so far) is plain content, which no schema constrains."""
        stripped = text.lstrip(WHITESPACE)
        return self.tool_validators is not None and bool(stripped) and stripped[0] not in "{["


def check_for_response_format(response_format: Mapping[str, Any] | None) -> ReplyCheck | None:
    """The check for a `json_object`/`json_schema` reply; None for free text. Call it after
    `grammar_for_response_format`, which has refused malformed and oversized schemas."""
    if not isinstance(response_format, Mapping):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        schema: Mapping[str, Any] = {"type": "object"}
    elif kind == "json_schema":
        schema = response_format["json_schema"].get("schema", {"type": "object"})
    else:
        return None
    return ReplyCheck(
        schema_validator=compile_validator(schema, "response_format.json_schema.schema"),
        grammar_enforces_all=enforced_by_grammar(schema),
    )


def check_for_tools(tools: Sequence[ToolSpec]) -> ReplyCheck:
    """The check for replies that may call `tools` (after `grammar_for_tools` accepted them)."""
    validators = {
        tool.name: compile_validator(tool.parameters, f"The parameters of tool {tool.name!r}")
        for tool in tools
    }
    return ReplyCheck(
        tool_validators=validators,
        tools=tuple(tools),
        grammar_enforces_all=all(enforced_by_grammar(tool.parameters) for tool in tools),
    )


# ---- generating until a reply passes ---------------------------------------------------------


def generate_checked(
    generate: Generate,
    sampling: SamplingParams,
    check: ReplyCheck,
    on_text: Callable[..., None] | None,
) -> GenerationResult:
    """The first of up to MAX_ATTEMPTS replies that passes `check` (or that a limit cut short,
    which is reported as such, or that was cancelled); raises InvalidReplyError when none does."""
    live = on_text is not None and check.grammar_enforces_all
    failures: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        held = None if on_text is None or live else _HeldText(check, on_text)
        sink = on_text if live else (held.take if held else None)
        result = generate(attempt_sampling(sampling, attempt), sink)
        if result.metrics.stop_reason == "cancelled":
            return result  # the client left (#34): a reply nobody reads is not tried again
        unfinished = result.metrics.stop_reason in UNFINISHED_STOPS
        problems = [] if unfinished else check.problems(result.text)
        if not problems:
            if held is not None:
                held.release()
            return result
        failures = problems
        log.warning(
            "structured reply failed validation (attempt %d of %d): %s",
            attempt + 1,
            MAX_ATTEMPTS,
            "; ".join(problems[:MAX_PROBLEMS_SHOWN]),
        )
        if live:
            break  # its text has been sent: it cannot be taken back and tried again
    raise InvalidReplyError(
        f"The model gave no reply that follows the JSON schema in {attempt + 1} "
        f"attempt{'s' if attempt else ''}; the last one broke it: "
        + "; ".join(failures[:MAX_PROBLEMS_SHOWN]),
        hint="Loosen the schema, describe the constraints in the prompt, or send the request "
        "again.",
    )


def attempt_sampling(sampling: SamplingParams, attempt: int) -> SamplingParams:
    """The sampling for attempt `attempt` (0: the request's own)."""
    if attempt == 0:
        return sampling
    if sampling.seed is not None:
        seed = (sampling.seed + attempt) % 2**32
    elif sampling.temperature == 0:
        seed = attempt  # a greedy request stays reproducible through its retries
    else:
        seed = secrets.randbelow(2**31)
    temperature = sampling.temperature or RESAMPLE_TEMPERATURE
    return replace(sampling, seed=seed, temperature=temperature)


class _HeldText:
    """Stream callbacks held back until the reply passed; plain content goes on at once."""

    def __init__(self, check: ReplyCheck, on_text: Callable[..., None]) -> None:
        self._check = check
        self._on_text = on_text
        self._held: list[tuple[Any, ...]] = []
        self._text = ""
        self._passing = False

    def take(self, *args: Any) -> None:
        if self._passing:
            self._on_text(*args)
            return
        self._held.append(args)
        if args and isinstance(args[0], str):
            self._text += args[0]
            if self._check.is_free_text(self._text):
                self.release()

    def release(self) -> None:
        held, self._held = self._held, []
        self._passing = True
        for args in held:
            self._on_text(*args)
