"""Timing helpers shared by the side-by-side benchmarks.

Both sides of a comparison are timed by the same rule between the same events, and count
tokens, never the pieces text arrives in (the engine worker sends the pieces of fast tokens
together, 20 ms apart at least, so a piece may hold several tokens):

  decode tok/s  = (completion tokens - 1) / (arrival of the last token - arrival of the first)
  prefill tok/s = prompt tokens / (first token out - request made)

The completion tokens come from the engine's or the server's own count (`usage`), the
arrival times from the side that receives the text.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

DECODE_RULE = "decode tok/s = (completion tokens - 1) / (last token's arrival - first token's)"
PREFILL_RULE = "prefill tok/s = prompt tokens / (first token out - request made)"


def decode_tok_s(completion_tokens: int, first_token_s: float, last_token_s: float) -> float:
    """Tokens after the first over the time from the first token's arrival to the last's."""
    if completion_tokens < 2 or last_token_s <= first_token_s:
        raise ValueError(
            f"a decode rate needs two tokens or more, apart in time (got {completion_tokens} "
            f"tokens over {last_token_s - first_token_s:.6f} s): raise max_tokens or use a "
            "prompt the model does not end at once"
        )
    return (completion_tokens - 1) / (last_token_s - first_token_s)


def prefill_tok_s(prompt_tokens: int, requested_s: float, first_token_s: float) -> float:
    return prompt_tokens / (first_token_s - requested_s)


def paired(first: Callable[[], None], second: Callable[[], None], flip: bool) -> None:
    """Run both, back to back, in an order that alternates between calls."""
    for run in (second, first) if flip else (first, second):
        run()


def median_ratio(ours: Sequence[float], theirs: Sequence[float]) -> float:
    """The median of the ratios of back-to-back pairs, so slow drifts of the machine cancel."""
    return statistics.median(a / b for a, b in zip(ours, theirs, strict=True))
