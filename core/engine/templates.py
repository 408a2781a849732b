"""Chat templates rendered in Jinja's immutable sandbox with a time and an output-size cap.

A GGUF's `tokenizer.chat_template` is code written by whoever made the file; plain Jinja
rendering of it was CVE-2024-34359 (code execution in llama-cpp-python). The sandbox blocks
attribute tricks; the caps below stop templates that loop forever or build huge strings.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import FrameType
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from hearthside.core.errors import TemplateError

RENDER_TIME_LIMIT_S = 1.0
RENDER_MAX_CHARS = 4 * 1024 * 1024
# A GGUF without a chat template is almost always a base (pretrained) model, such as the
# default Gemma 3 270M: it has never seen chat turns but continues a Q&A transcript well.
TRANSCRIPT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}Question: {{ message['content'] | trim }}\nAnswer:"
    "{% elif message['role'] == 'assistant' %} {{ message['content'] | trim }}\n\n"
    "{% else %}{{ message['content'] | trim }}\n\n{% endif %}"
    "{% endfor %}"
)
TRANSCRIPT_STOPS = ("\nQuestion:",)
# Jinja compiles templates made with from_string under this file name.
_TEMPLATE_FILENAME = "<template>"


class _TemplateTimeout(Exception):
    pass


class _CappedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus a cap on the size of `*` and `**` results."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _is_number(left) and _is_number(right) and abs(right) > 64:
            raise TemplateError("The chat template computed an oversized power.")
        if operator == "*" and _repeat_length(left, right) > RENDER_MAX_CHARS:
            raise TemplateError("The chat template tried to build an oversized value.")
        return super().call_binop(context, operator, left, right)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _repeat_length(left: Any, right: Any) -> int:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, str | list | tuple) and isinstance(count, int):
            return len(sequence) * max(count, 0)
    return 0


def _raise_exception(message: str) -> None:
    raise TemplateError(f"The model's chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    """One model's chat template, compiled once and rendered with caps."""

    def __init__(
        self,
        source: str | None,
        *,
        bos_token: str = "",
        eos_token: str = "",
        time_limit_s: float = RENDER_TIME_LIMIT_S,
        max_chars: int = RENDER_MAX_CHARS,
    ) -> None:
        self.source = source or TRANSCRIPT_TEMPLATE
        self.is_transcript = not source
        # Text that ends the assistant's turn in this format, beyond the model's EOS token.
        self.stop_sequences: tuple[str, ...] = TRANSCRIPT_STOPS if self.is_transcript else ()
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.time_limit_s = time_limit_s
        self.max_chars = max_chars
        env = _CappedSandbox(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=["jinja2.ext.loopcontrols"],
            undefined=jinja2.Undefined,
        )
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            self._template = env.from_string(self.source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"The model's chat template is not valid Jinja: {exc}") from exc

    def render(
        self,
        messages: Iterable[Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for `messages`, ending with the assistant's turn opener."""
        variables = {
            "messages": [dict(message) for message in messages],
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
        }
        deadline = time.monotonic() + self.time_limit_s
        try:
            with _deadline_trace(deadline):
                return self._render_capped(variables)
        except _TemplateTimeout as exc:
            raise TemplateError(
                f"The model's chat template ran longer than {self.time_limit_s:g} s; "
                "it was stopped."
            ) from exc
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError("The model's chat template tried something unsafe.") from exc
        except Exception as exc:  # a template can fail in any way Python code can
            raise TemplateError(f"The model's chat template failed: {exc}") from exc

    def _render_capped(self, variables: dict[str, Any]) -> str:
        pieces: list[str] = []
        size = 0
        for piece in self._template.generate(variables):
            size += len(piece)
            if size > self.max_chars:
                raise TemplateError("The model's chat template produced an oversized prompt.")
            pieces.append(piece)
        return "".join(pieces)


class _deadline_trace:
    """Raise _TemplateTimeout inside template code once `deadline` has passed.

    Jinja compiles a template to Python, so a line tracer limited to the template's frames
    can interrupt a runaway loop; a thread-based timeout could not stop it.
    """

    def __init__(self, deadline: float) -> None:
        self.deadline = deadline
        self._previous: Callable[..., Any] | None = None

    def __enter__(self) -> None:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)

    def __exit__(self, *exc_info: object) -> None:
        sys.settrace(self._previous)

    def _on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename == _TEMPLATE_FILENAME:
            self._check()
            return self._on_line
        return None

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._check()
        return self._on_line

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise _TemplateTimeout()
