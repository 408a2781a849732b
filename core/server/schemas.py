"""The request bodies the API accepts, in OpenAI's shape. Unknown fields are dropped, never
passed on; out-of-range values are refused with a 400 naming the field."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from hearthside.core.engine.config import MAX_TOP_LOGPROBS

MAX_STOP_SEQUENCES = 4
MAX_COMPLETION_LOGPROBS = 5  # OpenAI's bound for completions' `logprobs`
MAX_CHOICES = 8  # per request (prompts × n): each is a job in the bounded queue
# OpenAI's own limit. The chat template renders every message within its 1 s cap: 5000 short
# messages ran past it on two cores and got a 500 (issue 36); 2048 render in a fraction of it.
MAX_MESSAGES = 2048
# JSON's "\ud800" decodes to a lone surrogate, which no UTF-8 encoder (nor llama.cpp) takes.
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _TextChecked(_Request):
    """Refuses text that is not valid Unicode in any field, naming the field. (Not on
    ContentPart: inside `content`'s union its error would hide behind the `str` branch's.)"""

    @field_validator("*", mode="after")
    @classmethod
    def _check_unicode(cls, value: Any) -> Any:
        surrogate = first_lone_surrogate(value)
        if surrogate is not None:
            raise ValueError(
                f"the text is not valid Unicode: it holds a lone UTF-16 surrogate "
                f"(\\u{ord(surrogate):04x}); send UTF-8 text, and write a character beyond "
                "U+FFFF as a surrogate pair in JSON"
            )
        return value


def first_lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any string inside `value` (keys too), walked without
    recursion; None when there is none."""
    pending = [value]
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            found = LONE_SURROGATE.search(node)
            if found:
                return found.group()
        elif isinstance(node, dict):
            pending.extend(node.keys())
            pending.extend(node.values())
        elif isinstance(node, list | tuple):
            pending.extend(node)
        elif isinstance(node, BaseModel):
            pending.extend(node.__dict__.values())
    return None


class ContentPart(_Request):
    type: str
    text: str | None = None


class ChatMessageIn(_TextChecked):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content if part.type == "text")
        return self.content or ""


class _Sampling(_TextChecked):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    # Unset: llama.cpp's own defaults (llama-server's too), see `_sampling` in app.py.
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, description="llama.cpp extension")
    min_p: float | None = Field(default=None, ge=0.0, le=1.0, description="llama.cpp extension")
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES, description="Choices, each its own generation.")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @field_validator("stop")
    @classmethod
    def _check_stop(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOP_SEQUENCES or any(not stop for stop in stops):
            raise ValueError(f"give at most {MAX_STOP_SEQUENCES} non-empty stop sequences")
        return value

    def stop_sequences(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.get("include_usage"))


def check_message_count(value: Any) -> Any:
    """Before each message is parsed (30000 of them fit in the 1 MiB body): at most
    MAX_MESSAGES, or a 400 that says how many and what to do."""
    if isinstance(value, list) and len(value) > MAX_MESSAGES:
        raise ValueError(
            f"give at most {MAX_MESSAGES} messages; this request has {len(value)}. "
            "Send fewer (drop or summarise the oldest turns)"
        )
    return value


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # Unset or true (OpenAI's default): one reply may hold several tool calls.
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    @field_validator("messages", mode="before")
    @classmethod
    def _check_message_count(cls, value: Any) -> Any:
        return check_message_count(value)

    @field_validator("top_logprobs")
    @classmethod
    def _check_top_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs set to true")  # as OpenAI refuses it
        return value

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprob_count(self) -> int | None:
        """Alternatives to report per token; None: no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(_Sampling):
    # Text, texts (one set of choices each), token ids, or lists of token ids.
    prompt: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_COMPLETION_LOGPROBS)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens or 16  # OpenAI's default for completions

    def logprob_count(self) -> int | None:
        return self.logprobs


class EmbeddingRequest(_TextChecked):
    model: str | None = None
    input: str | list[str]
