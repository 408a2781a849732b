"""Chat templates rendered in Jinja's immutable sandbox with a time and an output-size cap.

A GGUF's `tokenizer.chat_template` is code written by whoever made the file; plain Jinja
rendering of it was CVE-2024-34359 (code execution in llama-cpp-python). The sandbox blocks
attribute tricks; the caps below stop templates that loop forever or build huge strings,
and `template_limits` bounds every single call that can grow a value, inside the call.
"""

from __future__ import annotations

import json.encoder
import pprint
import string
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from types import FrameType
from typing import Any

import jinja2
import jinja2.filters
import jinja2.utils
import markupsafe
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup

from hearthside.core.engine import template_limits as limits
from hearthside.core.engine.template_limits import (
    SizeGuard,
    TemplateLimitError,
    TemplateOutOfMemoryError,
    TemplateTimeout,
)
from hearthside.core.errors import TemplateError

RENDER_TIME_LIMIT_S = 1.0
RENDER_MAX_CHARS = 4 * 1024 * 1024
# Compiling costs about 2.5 KB of memory per character of a dense template (`{{a(b,c)|d}}`
# repeated: 320 MB for 128 KiB) and seconds; real templates are a few thousand characters,
# the longest (a default system prompt built in) a few tens of thousands.
MAX_TEMPLATE_CHARS = 128 * 1024
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
_TOO_SLOW_HINT = (
    "A shorter conversation may fit. If a short one does not, the model file's chat template "
    "is faulty: use another copy of this model (for example from its original publisher)."
)
# Jinja compiles templates made with from_string under this file name.
_TEMPLATE_FILENAME = "<template>"
# Pure-Python code that filters and `str.format` loop in: the deadline is checked on each of
# their lines too, so that one long call cannot outlive it.
_WATCHED_FILES = frozenset(
    module.__file__
    for module in (jinja2.filters, jinja2.utils, textwrap, json.encoder, pprint, string, markupsafe)
    if module.__file__
) | {_TEMPLATE_FILENAME}


class _CappedCodeGenerator(CodeGenerator):
    """Jinja's code generator, except that `a ~ b` checks the size of what it joins first,
    and that no expression of the template is evaluated while it is compiled.

    Jinja folds constant expressions at compile time (`{{ 'a'|center(4000000) }}` becomes a
    4-million-character literal in the generated code), outside any render's deadline and
    work budget: 300 such outputs took a compile past 2 GB (issue 36). With the optimizer off
    (`optimized=False`), outputs and `{% autoescape %}` values are the two places left where
    the code generator evaluates an expression; both wait for the render here.
    """

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        elif frame.eval_ctx.autoescape:
            join = "markup_join"
        else:
            join = "str_join"
        self.write(f"environment.checked_concat({join}(environment.checked_pieces((")
        for argument in node.nodes:
            self.visit(argument, frame)
            self.write(", ")
        self.write("))))")

    def _output_child_to_const(
        self, node: nodes.Expr, frame: Frame, finalize: CodeGenerator._FinalizeInfo
    ) -> str:
        if not isinstance(node, nodes.TemplateData):  # the template's own text is safe as is
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def visit_EvalContextModifier(self, node: nodes.EvalContextModifier, frame: Frame) -> None:
        for keyword in node.options:
            self.writeline(f"context.eval_ctx.{keyword.key} = ")
            self.visit(keyword.value, frame)
        frame.eval_ctx.volatile = True  # known only when rendering, like any non-constant


class _CappedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, with every operation that can grow a value bounded inside the
    call (see template_limits): operators, filters, str methods, `~`, blocks and output."""

    code_generator_class = _CappedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self, max_chars: int, **options: Any) -> None:
        self.guard = SizeGuard(max_chars)
        super().__init__(finalize=self._checked_output, optimized=False, **options)
        for name, original in list(self.filters.items()):
            self.filters[name] = limits.bounded_filter(name, original, self.guard)
        self.filters["join"] = limits.bounded_join(self.guard)
        self.filters["sum"] = limits.bounded_sum(self.guard)
        self.globals["lipsum"] = limits.bounded_lipsum(self.guard)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        limits.check_binop(self.guard, operator, left, right)
        return self.guard.charge(super().call_binop(context, operator, left, right))

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        args = limits.check_str_method(__self.guard, __obj, args)
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(__obj, Macro):
            return result  # its text was built, and counted, by `concat`
        return __self.guard.charge(result)

    def concat(self, pieces: Iterable[str]) -> str:
        """Joins the text of a `{% set %}` block, a macro or a `{% filter %}` block."""
        pieces = list(pieces)
        self.guard.refuse_over(sum(map(len, pieces)))
        return self.guard.charge("".join(pieces))

    def checked_pieces(self, pieces: tuple[Any, ...]) -> tuple[Any, ...]:
        limit = self.guard.max_chars
        self.guard.refuse_over(sum(limits.text_size(piece, limit) for piece in pieces))
        return pieces

    def checked_concat(self, joined: str) -> str:
        return self.guard.charge(joined)

    def _checked_output(self, value: Any) -> Any:
        self.guard.check_text_of(value)
        return value

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """`str.format` and `format_map`, counting each field against the cap."""
        if super().wrap_str_format(value) is None:
            return None
        text: str = value.__self__
        is_format_map = value.__name__ == "format_map"
        guard = self.guard

        def formatter() -> string.Formatter:
            if isinstance(text, Markup):
                return limits.BoundedEscapeFormatter(self, guard, escape=text.escape)
            return limits.BoundedFormatter(self, guard)

        def bounded_format(*args: Any, **kwargs: Any) -> str:
            if is_format_map and (kwargs or len(args) != 1):
                raise TypeError("format_map() takes exactly one argument")
            positional, named = ((), args[0]) if is_format_map else (args, kwargs)
            return guard.charge(type(text)(formatter().vformat(text, positional, named)))

        return bounded_format


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
        if len(self.source) > MAX_TEMPLATE_CHARS:
            raise TemplateLimitError(
                f"The model's chat template is {len(self.source):,} characters long; "
                f"Hearthside reads templates of up to {MAX_TEMPLATE_CHARS:,}.",
                hint=limits.FAULTY_TEMPLATE_HINT,
            )
        env = _CappedSandbox(
            max_chars,
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
        except RecursionError as exc:  # nesting deeper than Python's stack
            raise TemplateLimitError(
                "The model's chat template is nested too deeply to compile.",
                hint=limits.FAULTY_TEMPLATE_HINT,
            ) from exc
        except MemoryError as exc:
            raise TemplateOutOfMemoryError(
                "The model's chat template ran out of memory while it was compiled.",
                hint=limits.FAULTY_TEMPLATE_HINT,
            ) from exc

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
        budget = limits.start_render(deadline, self.max_chars)
        try:
            with _deadline_trace(deadline):
                return self._render_capped(variables)
        except TemplateError:
            raise
        except Exception as exc:  # a template can fail in any way Python code can
            raise _render_failure(exc, self.time_limit_s) from exc
        finally:
            limits.end_render(budget)

    def _render_capped(self, variables: dict[str, Any]) -> str:
        pieces: list[str] = []
        size = 0
        for piece in self._template.generate(variables):
            size += len(piece)
            if size > self.max_chars:
                raise TemplateLimitError(
                    "The model's chat template produced a prompt longer than the "
                    f"{limits.describe_chars(self.max_chars)} limit.",
                    hint=_TOO_SLOW_HINT,
                )
            pieces.append(piece)
        return "".join(pieces)


# What `models add` renders with a new file's template, within the template's bounds: one
# turn, and an exchange with a system prompt (a template may refuse that one; see below).
CHECK_CONVERSATIONS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Hello"},),
    (
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Name a colour."},
    ),
)


def check_chat_template(template: ChatTemplate) -> None:
    """Raise TemplateLimitError if an ordinary conversation takes `template` past a bound.

    A template that refuses a conversation (some allow no system prompt) or fails on it is
    not refused here: that is the model's format, and the chat says so when it happens.
    """
    for conversation in CHECK_CONVERSATIONS:
        try:
            template.render(conversation)
        except TemplateLimitError:
            raise
        except TemplateError:
            continue


def _render_failure(exc: Exception, time_limit_s: float) -> TemplateError:
    """What a render that raised `exc` tells the user."""
    if isinstance(exc, TemplateTimeout) and isinstance(exc.__context__, MemoryError):
        exc = exc.__context__  # the deadline passed while the MemoryError was on its way out
    if isinstance(exc, TemplateTimeout):
        return TemplateLimitError(
            f"The model's chat template ran longer than {time_limit_s:g} s; it was stopped.",
            hint=_TOO_SLOW_HINT,
        )
    if isinstance(exc, MemoryError):
        return TemplateOutOfMemoryError(
            "The model's chat template ran out of memory; it was stopped.",
            hint=limits.FAULTY_TEMPLATE_HINT,
        )
    if isinstance(exc, RecursionError):
        return TemplateLimitError(
            "The model's chat template recursed too deeply; it was stopped.",
            hint=limits.FAULTY_TEMPLATE_HINT,
        )
    if isinstance(exc, jinja2.exceptions.SecurityError):
        return TemplateLimitError(
            "The model's chat template tried something unsafe.", hint=limits.FAULTY_TEMPLATE_HINT
        )
    return TemplateError(f"The model's chat template failed: {exc}")


class _deadline_trace:
    """Raise TemplateTimeout inside template code once `deadline` has passed.

    Jinja compiles a template to Python, so a line tracer limited to the template's frames
    (and the pure-Python helpers they call) can interrupt a runaway loop; a thread-based
    timeout could not stop it.
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
        if frame.f_code.co_filename in _WATCHED_FILES:
            self._check()
            return self._on_line
        return None

    def _on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        # Not on "exception" or "return": raised there, the timeout would replace an error on
        # its way out (a MemoryError became "ran longer than 1 s") and end all tracing.
        if event == "line":
            self._check()
        return self._on_line

    def _check(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateTimeout()
