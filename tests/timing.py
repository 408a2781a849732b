"""Timing checks that a shared machine cannot fail by chance, nor a slow path pass by it.

A bound is set against a baseline measured in the same test on the same machine (how long
one decode step takes here), and a check is tried up to `TRIES` times: one stall of a busy
neighbour holds one try past the bound, a path that is really slow holds every try there.
See docs/testing.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

TRIES = 3
# What a person pressing Stop is promised (the chat's Stop button, Esc, an API client's close)
CANCEL_BUDGET_S = 0.25


def cancel_bound_s(decode_step_s: float) -> float:
    """How soon a cancel must end a reply: within the promise, or, on a machine where one
    decode step alone takes longer, within two steps (the step in flight, and the one that
    sees the cancel: it is looked at between tokens)."""
    return max(CANCEL_BUDGET_S, 2 * decode_step_s)


def decode_step_s(decode_tok_s: float | None) -> float:
    """One decode step's seconds from a measured rate (0 when nothing was decoded)."""
    return 1.0 / decode_tok_s if decode_tok_s else 0.0


@dataclass(frozen=True)
class Try:
    """One timed try: its seconds and the bound it was held to (set from its baseline)."""

    seconds: float
    bound_s: float

    @property
    def within(self) -> bool:
        return self.seconds < self.bound_s


def best_of(measure: Callable[[], Try], tries: int = TRIES) -> list[Try]:
    """Every try made, trying again only while a try missed its bound: the caller asserts
    `any(t.within for t in taken)` and shows `taken` when it fails."""
    taken: list[Try] = []
    for _ in range(tries):
        taken.append(measure())
        if taken[-1].within:
            break
    return taken
