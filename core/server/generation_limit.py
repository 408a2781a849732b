"""A time limit for a generation under a grammar (issue 36).

A schema such as `{"type": "string", "minLength": 65536}` can make every token cost far more
than a decode step. The engine keeps such a reply to its fair share of each step
(core/engine/batch.py's FAIR_SAMPLING_SHARE) and caps its grammar's processor time
(core/engine/grammar_sampling.py's MAX_GRAMMAR_S); a reply that merely crawls could still hold a
slot for hours. So a generation under a grammar has a wall-clock limit from the moment it starts
on the engine: `grace_s` plus its `max_tokens` at `min_tokens_per_s`, which an ordinary
structured reply never comes near (it would have to average under 2 tokens a second over
minutes). Past the limit it is cancelled as when its client leaves (its sequence leaves the
batch at the next step), and the request ends with `StructuredOutputTooSlowError`: HTTP 400
`structured_output_too_slow`, or that error as an event in a stream that has started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hearthside.core.engine.cancel import CancelEvent
from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.grammar_sampling import GrammarTooSlowError

STRUCTURED_GRACE_S = 60.0  # time for the prompt and a slow start, whatever max_tokens is
STRUCTURED_MIN_TOKENS_PER_S = 2.0  # below this on average over the whole reply, it is stopped


@dataclass(frozen=True)
class StructuredTimeLimit:
    """How long a generation under a grammar may run: `grace_s` plus `max_tokens` at
    `min_tokens_per_s`."""

    grace_s: float = STRUCTURED_GRACE_S
    min_tokens_per_s: float = STRUCTURED_MIN_TOKENS_PER_S

    def __post_init__(self) -> None:
        if self.grace_s <= 0 or self.min_tokens_per_s <= 0:
            raise ValueError("a structured-output time limit needs a positive grace and rate")

    def seconds_for(self, sampling: SamplingParams) -> float | None:
        """The limit for a generation with `sampling`; None (no limit) without a grammar."""
        if sampling.grammar is None:
            return None
        max_tokens = sampling.max_tokens or sampling.default_max_tokens
        if max_tokens is None:
            return None  # the API always sets one; a caller that does not gets no limit
        return self.grace_s + max_tokens / self.min_tokens_per_s


class StructuredOutputTooSlowError(GrammarTooSlowError):
    """A generation under a grammar ran past its `StructuredTimeLimit`."""


def run_within(
    limit_s: float, cancel: Any, generate: Callable[[Any], GenerationResult]
) -> GenerationResult:
    """`generate(cancel)`, cancelled once `limit_s` have passed; raises
    StructuredOutputTooSlowError when the limit, not `cancel`, stopped it."""
    if not isinstance(cancel, CancelEvent):  # the API's jobs always carry one
        return generate(cancel)
    limited = CancelEvent()
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        limited.set()

    forget = cancel.when_set(limited.set)
    timer = threading.Timer(limit_s, expire)
    timer.daemon = True
    timer.start()
    try:
        result = generate(limited)
    finally:
        timer.cancel()
        forget()
    if expired.is_set() and not cancel.is_set() and result.metrics.stop_reason == "cancelled":
        raise too_slow(limit_s, result)
    return result


def too_slow(limit_s: float, result: GenerationResult) -> StructuredOutputTooSlowError:
    tokens = result.metrics.completion_tokens
    return StructuredOutputTooSlowError(
        f"The requested output format made this reply too slow to write: it was still "
        f"running after {limit_s:g} s ({tokens} tokens written), the limit for its max_tokens "
        f"on this server, so it was stopped.",
        hint="Loosen the schema (a smaller minLength or minItems, fewer constraints the model "
        "has to fight), ask for fewer max_tokens, or describe the format in the prompt.",
    )
