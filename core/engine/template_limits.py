"""Size and time bounds that hold inside every single call a chat template makes.

Checking the rendered output between lines is not enough: one filter call such as
`'a'|center(8000000000)` allocates gigabytes before control comes back. So every operation
that can grow a value predicts the size of its result *before* running, refuses one over the
cap, and charges what it built to a per-render work budget (which stops a loop that keeps
many capped values alive). Sizes are character counts for text and item counts for lists;
the estimate of a value's text (what `str()` would make of it) stops counting at the cap.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import re
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, MappingView, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, cast

from jinja2.filters import make_attrgetter
from jinja2.sandbox import SandboxedEscapeFormatter, SandboxedFormatter
from jinja2.utils import Namespace, generate_lorem_ipsum

from hearthside.core.errors import TemplateError
from hearthside.core.units import MIB

# How much more than the output cap one render may build in all (intermediate strings and
# lists included): real templates copy each message a few times, never this often.
WORK_BUDGET_FACTOR = 16
# Integers beyond this are no chat template's business and multiply slowly.
MAX_INT_BITS = 1 << 16
_SIZE_OF_SCALAR = 24
_SIZE_OF_OPAQUE_OBJECT = 64
_DEADLINE_CHECK_EVERY = 4096
FAULTY_TEMPLATE_HINT = (
    "The model file's chat template is faulty or hostile. Use another copy of this model "
    "(for example from its original publisher), or tell whoever published this file."
)


class TemplateTimeout(Exception):
    """The render's deadline passed; raised inside template code and bounded helpers."""


class TemplateLimitError(TemplateError):
    """A template went past a bound Hearthside sets on every template (time, size, work,
    memory, nesting, the sandbox), as opposed to refusing a conversation or failing on it.
    `models add` refuses a file whose template does so on an ordinary conversation."""


class TemplateOutOfMemoryError(TemplateLimitError):
    """A template's compile or render ran out of memory (in the `models add` check, out of
    the memory it is allowed there)."""


@dataclass
class RenderBudget:
    """What one render may still spend: a deadline and a number of characters/items."""

    deadline: float
    work_left: int
    work_limit: int


_current_render: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "hearthside_template_render", default=None
)


def start_render(deadline: float, max_chars: int) -> contextvars.Token[RenderBudget | None]:
    work = max_chars * WORK_BUDGET_FACTOR
    return _current_render.set(RenderBudget(deadline, work, work))


def end_render(token: contextvars.Token[RenderBudget | None]) -> None:
    _current_render.reset(token)


def check_deadline() -> None:
    budget = _current_render.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise TemplateTimeout()


def describe_chars(count: int) -> str:
    if count % MIB == 0:
        return f"{count // MIB} MiB"
    return f"{count:,}-character"


def too_long(kind: str, max_chars: int) -> TemplateError:
    if kind == "list":
        message = f"The chat template tried to build a list of more than {max_chars:,} items."
    else:
        message = (
            f"The chat template tried to build a string longer than the "
            f"{describe_chars(max_chars)} limit."
        )
    return TemplateLimitError(message, hint=FAULTY_TEMPLATE_HINT)


def too_big_a_number() -> TemplateError:
    return TemplateLimitError(
        "The chat template computed an oversized number.", hint=FAULTY_TEMPLATE_HINT
    )


class SizeGuard:
    """The checks for one template environment, whose output cap is `max_chars`."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars

    def refuse_over(self, predicted: int, kind: str = "string") -> None:
        if predicted > self.max_chars:
            raise too_long(kind, self.max_chars)

    def check_text_of(self, value: Any) -> None:
        """Refuse a value whose text (`str(value)`) would be over the cap."""
        if not isinstance(value, str | int | float | bool | types.NoneType):
            self.refuse_over(text_size(value, self.max_chars))

    def charge(self, result: Any) -> Any:
        """Refuse a result over the cap and count it against this render's work budget."""
        size = _shallow_size(result)
        if size == 0:
            return result
        self.refuse_over(size, "string" if isinstance(result, str) else "list")
        budget = _current_render.get()
        if budget is not None:
            budget.work_left -= size
            if budget.work_left < 0:
                raise TemplateLimitError(
                    "The chat template built more than "
                    f"{describe_chars(budget.work_limit)} of text while rendering one prompt; "
                    "it was stopped.",
                    hint=FAULTY_TEMPLATE_HINT,
                )
        return result


def _shallow_size(value: Any) -> int:
    if isinstance(value, str | list | tuple | dict | set | frozenset):
        return len(value)
    return 0


def text_size(value: Any, limit: int, indent: int = 0) -> int:
    """About how long `str(value)` (or its JSON with `indent`) is; stops counting past `limit`.

    Shared references count each time they are printed, which is what printing costs.
    """
    if isinstance(value, str):
        return len(value)
    total = _own_size(value)
    steps = 0
    pending: list[Iterator[Any]] = [iter(_children(value))]
    while pending and total <= limit:
        child = next(pending[-1], _DONE)
        if child is _DONE:
            pending.pop()
            continue
        steps += 1
        if steps % _DEADLINE_CHECK_EVERY == 0:
            check_deadline()
        total += _own_size(child) + (indent * len(pending) + 1 if indent else 0)
        grandchildren = _children(child)
        if grandchildren:
            pending.append(iter(grandchildren))
    return total


_DONE = object()


def _own_size(item: Any) -> int:
    if isinstance(item, str):
        return len(item) + 4  # quotes and separator
    if isinstance(item, bool) or item is None:
        return 6
    if isinstance(item, int):
        return item.bit_length() // 3 + 2
    if isinstance(item, float):
        return _SIZE_OF_SCALAR
    if isinstance(item, Mapping | Sequence | AbstractSet | MappingView | Namespace):
        return 2
    return _SIZE_OF_OPAQUE_OBJECT


def _children(item: Any) -> Iterable[Any]:
    """What printing `item` prints too; never consumes an iterator."""
    if isinstance(item, str | range):
        return ()
    if isinstance(item, Mapping):
        return itertools.chain.from_iterable(item.items()) if item else ()
    if isinstance(item, Sequence | AbstractSet | MappingView):
        return cast(Iterable[Any], item)
    if isinstance(item, Namespace):
        return _children(item._Namespace__attrs)
    return ()


def as_int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


# ----- operators ---------------------------------------------------------------------------


def check_binop(guard: SizeGuard, operator: str, left: Any, right: Any) -> None:
    """Refuse `left <operator> right` before Python computes a result over the caps."""
    if operator == "+":
        _check_addition(guard, left, right)
    elif operator == "*":
        _check_multiplication(guard, left, right)
    elif operator == "**":
        _check_power(left, right)
    elif operator == "%" and isinstance(left, str):
        guard.refuse_over(printf_size(left, right, guard.max_chars))


def _check_addition(guard: SizeGuard, left: Any, right: Any) -> None:
    if isinstance(left, str) and isinstance(right, str):
        guard.refuse_over(len(left) + len(right))
    elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
        guard.refuse_over(len(left) + len(right), "list")


def _check_multiplication(guard: SizeGuard, left: Any, right: Any) -> None:
    for sequence, count in ((left, right), (right, left)):
        if isinstance(sequence, str | list | tuple) and _is_int(count):
            kind = "string" if isinstance(sequence, str) else "list"
            guard.refuse_over(len(sequence) * max(count, 0), kind)
    if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
        raise too_big_a_number()


def _check_power(left: Any, right: Any) -> None:
    if _is_number(left) and _is_number(right) and abs(right) > 64:
        raise TemplateLimitError(
            "The chat template computed an oversized power.", hint=FAULTY_TEMPLATE_HINT
        )
    if _is_int(left) and _is_int(right) and left.bit_length() * max(right, 0) > MAX_INT_BITS:
        raise too_big_a_number()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


# A mapping key stops at the next "(", ")" or "%": a key scan never runs past the next field, so
# finding the fields is linear even in a template of unclosed "%(" (issue 36). Python would take
# "%(a(b)c)s" (nested) or "%(a%b)s" as one key; here they read as conversion "(", refused.
_PRINTF_FIELD = re.compile(r"%(?:\(([^()%]*+)\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)
_UNREADABLE_CONVERSION = "("
_DIGITS = re.compile(r"\d+")


def printf_size(template: str, values: Any, limit: int) -> int:
    """An upper bound on the length of `template % values` (printf-style formatting)."""
    mapping = values if isinstance(values, Mapping) else None
    positional = iter(values if isinstance(values, tuple) else (values,))
    total = len(template)
    for field in _PRINTF_FIELD.finditer(template):
        key, width, precision, conversion = field.groups()
        if conversion == "%":
            continue
        if conversion == _UNREADABLE_CONVERSION:
            return limit + 1  # a key we cannot read: Python raises or formats an unknown value
        total += _printf_number(width, positional) + _printf_number(precision, positional)
        value = (
            mapping.get(key) if mapping is not None and key is not None else next(positional, "")
        )
        total += text_size(value, limit) + _SIZE_OF_SCALAR
        if total > limit:
            break
    return total


def _printf_number(spec: str | None, positional: Iterable[Any]) -> int:
    if spec == "*":
        return max(as_int(next(iter(positional), 0)), 0)
    return as_int(spec or 0)


# ----- str.format -------------------------------------------------------------------------


class _BoundedFormatting:
    """Counts what a `str.format` call builds, field by field, and stops it at the cap."""

    guard: SizeGuard
    built: int = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        widths = sum(as_int(number) for number in _DIGITS.findall(format_spec))
        self.built += widths + text_size(value, self.guard.max_chars) + _SIZE_OF_SCALAR
        self.guard.refuse_over(self.built)
        return super().format_field(value, format_spec)  # type: ignore[misc]


class BoundedFormatter(_BoundedFormatting, SandboxedFormatter):
    def __init__(self, env: Any, guard: SizeGuard) -> None:
        super().__init__(env)
        self.guard = guard


class BoundedEscapeFormatter(_BoundedFormatting, SandboxedEscapeFormatter):
    def __init__(self, env: Any, guard: SizeGuard, escape: Callable[[Any], Any]) -> None:
        super().__init__(env, escape=escape)
        self.guard = guard


# ----- filters ----------------------------------------------------------------------------

Predictor = Callable[..., tuple[int, str]]


def _center(guard: SizeGuard, value: Any, width: Any = 80, *_: Any) -> tuple[int, str]:
    return max(text_size(value, guard.max_chars), as_int(width)), "string"


def _replace(
    guard: SizeGuard, s: Any, old: Any = "", new: Any = "", count: Any = None
) -> tuple[int, str]:
    return replaced_size(guard, str(s), str(old), str(new), count), "string"


def replaced_size(guard: SizeGuard, s: str, old: str, new: str, count: Any) -> int:
    guard.refuse_over(len(s))
    occurrences = s.count(old) if old else len(s) + 1
    if count is not None and as_int(count, -1) >= 0:
        occurrences = min(occurrences, as_int(count))
    return len(s) + occurrences * max(len(new) - len(old), 0)


def _indent(
    guard: SizeGuard, s: Any, width: Any = 4, first: Any = False, blank: Any = False
) -> tuple[int, str]:
    text_length = text_size(s, guard.max_chars)
    guard.refuse_over(text_length)
    prefix = len(width) if isinstance(width, str) else as_int(width)
    lines = str(s).count("\n") + 1
    return text_length + lines * prefix, "string"


def _wordwrap(
    guard: SizeGuard, s: Any, width: Any = 79, break_long_words: Any = True,
    wrapstring: Any = None, *_: Any, **__: Any,
) -> tuple[int, str]:  # fmt: skip
    text_length = text_size(s, guard.max_chars)
    breaks = text_length // max(as_int(width, 1), 1) + str(s).count("\n") + 1
    return text_length + breaks * len(str(wrapstring or "\n")), "string"


def _format(guard: SizeGuard, value: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    return printf_size(str(value), kwargs or args, guard.max_chars), "string"


def _urlize(guard: SizeGuard, value: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    text = str(value)
    extras = sum(len(str(extra)) for extra in (*args, *kwargs.values()))
    words = len(text.split()) + 1
    return 3 * len(text) + words * (extras + 64), "string"


def _truncate(guard: SizeGuard, s: Any, *args: Any, **kwargs: Any) -> tuple[int, str]:
    end = kwargs.get("end", args[2] if len(args) > 2 else "...")
    return text_size(s, guard.max_chars) + len(str(end)), "string"


def _batch(guard: SizeGuard, value: Any, linecount: Any = 0, *_: Any) -> tuple[int, str]:
    return as_int(linecount), "list"


def _slice(guard: SizeGuard, value: Any, slices: Any = 0, *_: Any) -> tuple[int, str]:
    return as_int(slices), "list"


def _tojson(guard: SizeGuard, value: Any, indent: Any = None) -> tuple[int, str]:
    return text_size(value, guard.max_chars, indent=max(as_int(indent), 0)), "string"


def _pprint(guard: SizeGuard, value: Any) -> tuple[int, str]:
    return text_size(value, guard.max_chars, indent=1), "string"


PREDICTORS: dict[str, Predictor] = {
    "center": _center,
    "replace": _replace,
    "indent": _indent,
    "wordwrap": _wordwrap,
    "format": _format,
    "urlize": _urlize,
    "truncate": _truncate,
    "batch": _batch,
    "slice": _slice,
    "tojson": _tojson,
    "pprint": _pprint,
}
# Filters that look at their input without printing it, so a huge list is no threat to them.
KEEPS_VALUES = frozenset({
    "abs", "attr", "batch", "count", "d", "default", "dictsort", "first", "float", "groupby",
    "int", "items", "join", "last", "length", "list", "map", "max", "min", "pprint", "random",
    "reject", "rejectattr", "reverse", "round", "select", "selectattr", "slice", "sort", "sum",
    "tojson", "unique",
})  # fmt: skip


def bounded_filter(name: str, original: Callable[..., Any], guard: SizeGuard) -> Callable[..., Any]:
    """`original` with its result predicted and refused over the cap, then charged."""
    passes_first_argument = getattr(original, "jinja_pass_arg", None) is not None
    predictor = PREDICTORS.get(name)
    prints_its_input = name not in KEEPS_VALUES

    @functools.wraps(original)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        own = args[1:] if passes_first_argument else args
        if prints_its_input:
            for argument in (*own, *kwargs.values()):
                guard.check_text_of(argument)
        if predictor is not None and own:
            guard.refuse_over(*predictor(guard, *own, **kwargs))
        return guard.charge(original(*args, **kwargs))

    return bounded


def bounded_join(guard: SizeGuard) -> Callable[..., Any]:
    """The `join` filter, refusing a result over the cap before joining."""
    from jinja2.filters import sync_do_join
    from jinja2.utils import pass_eval_context

    @pass_eval_context
    def join(eval_ctx: Any, value: Iterable[Any], d: Any = "", attribute: Any = None) -> str:
        items = list(value)
        guard.charge(items)
        if attribute is not None:
            items = [make_attrgetter(eval_ctx.environment, attribute)(item) for item in items]
        guard.refuse_over(joined_size(guard, items, str(d)))
        return guard.charge(sync_do_join(eval_ctx, items, d))

    return join


def joined_size(guard: SizeGuard, items: list[Any], separator: str) -> int:
    total = len(separator) * max(len(items) - 1, 0)
    for item in items:
        total += text_size(item, guard.max_chars)
        if total > guard.max_chars:
            break
    return total


def bounded_sum(guard: SizeGuard) -> Callable[..., Any]:
    """The `sum` filter; lists are added in linear time and refused over the cap."""
    from jinja2.utils import pass_environment

    @pass_environment
    def sum_filter(environment: Any, iterable: Iterable[Any], attribute: Any = None,
                   start: Any = 0) -> Any:  # fmt: skip
        items = list(iterable)
        guard.charge(items)
        if attribute is not None:
            items = [make_attrgetter(environment, attribute)(item) for item in items]
        # map() rather than generator expressions: each generator step is a traced call.
        if isinstance(start, list) and all(map(isinstance, items, itertools.repeat(list))):
            guard.refuse_over(len(start) + sum(map(len, items)), "list")
            return guard.charge([*start, *itertools.chain.from_iterable(items)])
        for item in items:
            check_binop(guard, "+", start, item)
            start = guard.charge(start + item)
        return start

    return sum_filter


def bounded_lipsum(guard: SizeGuard) -> Callable[..., str]:
    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
        guard.refuse_over(as_int(n) * as_int(max) * 16)
        return guard.charge(generate_lorem_ipsum(n, html, min, max))

    return lipsum


# ----- str methods called from a template -------------------------------------------------


def check_str_method(guard: SizeGuard, method: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Refuse a str method call that would build a result over the cap.

    Returns the arguments to call it with (an iterable given to `join` is read once here).
    """
    if not isinstance(method, types.BuiltinMethodType) or not isinstance(
        getattr(method, "__self__", None), str
    ):
        return args
    text = cast(str, method.__self__)
    name = method.__name__
    if name in ("center", "ljust", "rjust", "zfill") and args:
        guard.refuse_over(max(len(text), as_int(args[0])))
    elif name == "expandtabs":
        tab = as_int(args[0], 8) if args else 8
        guard.refuse_over(len(text) + text.count("\t") * max(tab, 0))
    elif name == "replace" and len(args) >= 2:
        count = args[2] if len(args) > 2 else None
        guard.refuse_over(replaced_size(guard, text, str(args[0]), str(args[1]), count))
    elif name == "join" and args:
        items = list(args[0])
        guard.charge(items)
        guard.refuse_over(joined_size(guard, items, text))
        return (items, *args[1:])
    elif name == "translate" and args and isinstance(args[0], Mapping):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        guard.refuse_over(len(text) * max(longest, 1))
    return args
