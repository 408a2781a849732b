"""GBNF for JSON numbers within `minimum`/`maximum` bounds.

Integers are exact: the rule matches the in-range integers and nothing else, written without
leading zeros (JSON's own form). Numbers with a fraction are bounded on their whole part only
(`0 <= x <= 1` allows `1.5`), so the grammar never excludes a valid value and the validator
catches the rest. An unbounded side stops at 16 digits, as llama.cpp's own integer rule does.

The integer rule splits the range the way a range becomes a regular expression: numbers of
one digit count at a time, then, digit by digit, a shared prefix, a class for the digits
strictly between the ends, and the two edges recursively. For 0..150 that is
`[0-9] | [1-9] [0-9]{1} | "1" [0-4] [0-9]{1} | "150"`.
"""

from __future__ import annotations

import math

FREE_DIGITS = 16
# Bounds beyond this are either no bound at all (an open side) or out of any reply's reach.
MAX_BOUND_DIGITS = 20
FRACTION = '("." [0-9]{1,16})?'


class UnwritableBound(ValueError):
    """A bound that needs more digits than a reply may write."""


def integer_range(low: int | None, high: int | None) -> list[str]:
    """GBNF alternatives for exactly the integers low..high (None: unbounded); [] if none."""
    alternatives = []
    if high is None or high >= 0:
        alternatives += _naturals(0 if low is None else max(low, 0), high)
    if low is None or low < 0:
        magnitude_low = 1 if high is None else max(1, -high)
        magnitudes = _naturals(magnitude_low, None if low is None else -low)
        alternatives += [f'"-" {alternative}' for alternative in magnitudes]
    return alternatives


def number_range(low: float | None, high: float | None) -> list[str]:
    """GBNF alternatives for decimal numbers whose whole part is in reach of low..high: every
    value in low..high matches one of them (in plain decimal form), some slightly outside do."""
    alternatives = []
    if high is None or high >= 0:
        whole_low = 0 if low is None or low <= 0 else math.floor(low)
        whole_high = None if high is None else math.floor(high)
        alternatives += [f"{part} {FRACTION}" for part in _naturals(whole_low, whole_high)]
    if low is None or low < 0:
        magnitude_low = 0 if high is None or high >= 0 else math.floor(-high)
        magnitudes = _naturals(magnitude_low, None if low is None else math.floor(-low))
        alternatives += [f'"-" {part} {FRACTION}' for part in magnitudes]
    return alternatives


def integer_bounds(schema: dict[str, object]) -> tuple[int | None, int | None]:
    """The inclusive integer bounds of `schema`'s minimum/maximum/exclusive* keywords."""
    lows = [math.ceil(v) for v in _numbers(schema, "minimum")]
    lows += [math.floor(v) + 1 for v in _numbers(schema, "exclusiveMinimum")]
    highs = [math.floor(v) for v in _numbers(schema, "maximum")]
    highs += [math.ceil(v) - 1 for v in _numbers(schema, "exclusiveMaximum")]
    low = _reachable(max(lows, default=None), low_side=True)
    high = _reachable(min(highs, default=None), low_side=False)
    return (None if low is None else int(low)), (None if high is None else int(high))


def number_bounds(schema: dict[str, object]) -> tuple[float | None, float | None]:
    """`schema`'s lower and upper bound, exclusive ones taken as inclusive (a superset)."""
    low = max([*_numbers(schema, "minimum"), *_numbers(schema, "exclusiveMinimum")], default=None)
    high = min([*_numbers(schema, "maximum"), *_numbers(schema, "exclusiveMaximum")], default=None)
    return _reachable(low, low_side=True), _reachable(high, low_side=False)


def _numbers(schema: dict[str, object], keyword: str) -> list[float]:
    """The keyword's value when it is a finite number (anything else is the validator's to
    refuse; a draft-4 boolean `exclusiveMinimum` is not a bound by itself)."""
    value = schema.get(keyword)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return []
    return [value] if math.isfinite(value) else []


def _reachable(bound: float | None, *, low_side: bool) -> float | None:
    limit = 10**MAX_BOUND_DIGITS
    if bound is None or -limit < bound < limit:
        return bound
    if (bound <= -limit) == low_side:  # a minimum far below, or a maximum far above: open
        return None
    raise UnwritableBound(f"the bound {bound:g} needs more than {MAX_BOUND_DIGITS} digits to write")


def _naturals(low: int, high: int | None) -> list[str]:
    """Alternatives for the integers low..high (high None: up to FREE_DIGITS digits, or the
    digits of `low` if it has more), low >= 0."""
    low_digits = len(str(low))
    high_digits = max(FREE_DIGITS, low_digits) if high is None else len(str(high))
    if high is not None and low > high:
        return []
    if low_digits == high_digits:
        return _span(str(low), str(_top(high, high_digits)))
    alternatives = _span(str(low), "9" * low_digits)
    if high_digits - low_digits > 1:  # every count in between, in full
        alternatives.append(f"[1-9] [0-9]{{{low_digits},{high_digits - 2}}}")
    return alternatives + _span(str(10 ** (high_digits - 1)), str(_top(high, high_digits)))


def _top(high: int | None, digits: int) -> int:
    return 10**digits - 1 if high is None else high


def _span(low: str, high: str) -> list[str]:
    """Alternatives for low..high, two numbers written with the same count of digits."""
    if low == high:
        return [f'"{low}"']
    rest = len(low) - 1
    if low[0] == high[0]:
        return [f'"{low[0]}" {alternative}' for alternative in _span(low[1:], high[1:])]
    first, last = int(low[0]), int(high[0])
    alternatives = []
    if rest and low[1:] != "0" * rest:
        alternatives += [f'"{low[0]}" {alt}' for alt in _span(low[1:], "9" * rest)]
        first += 1
    tail = []
    if rest and high[1:] != "9" * rest:
        tail = [f'"{high[0]}" {alt}' for alt in _span("0" * rest, high[1:])]
        last -= 1
    if first <= last:
        digits = f"[{first}-{last}]" if first < last else f'"{first}"'
        alternatives.append(f"{digits} [0-9]{{{rest}}}" if rest else digits)
    return alternatives + tail
