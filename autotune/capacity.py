"""The context-capacity audit: does the context hold what was promised, and how fast is decode
as it fills?

Users of other tools have found the "advertised" context silently smaller than real. For a
loaded engine this audit (1) compares the context llama.cpp really allocated with the one
asked for, (2) measures decode speed at several depths (empty, ~25%, ~90% full — llama-bench's
`-d`), and (3) fills the context to ~90% and checks that the KV cache still holds every
position from 0, with none evicted or shifted, and that generation continues.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import llama_cpp
import numpy as np

from hearthside.core.engine.engine import Engine

DEPTHS = (0.0, 0.25, 0.9)
DECODE_STEPS = 16


@dataclass(frozen=True)
class DepthSpeed:
    fraction: float  # of the context already filled
    depth_tokens: int
    decode_tps: float


@dataclass(frozen=True)
class CapacityAudit:
    requested_ctx: int
    allocated_ctx: int
    filled_tokens: int  # how far the fill check went
    first_position: int  # the oldest position still in the cache (0: nothing evicted)
    last_position: int  # the newest (filled_tokens - 1: nothing shifted or lost)
    holds: bool
    speeds: tuple[DepthSpeed, ...]
    message: str

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["speeds"] = [asdict(speed) for speed in self.speeds]  # JSON has lists, not tuples
        return data


def audit_context(
    engine: Engine, *, depths: Sequence[float] = DEPTHS, decode_steps: int = DECODE_STEPS
) -> CapacityAudit:
    """Run the audit on `engine` (the engine thread's job: it resets the engine's cache).

    The context fills once, in order: a prompt-sized batch up to each depth, then
    `decode_steps` tokens one at a time there, timed. So the audit costs one fill of the
    context, not one per depth (which made it the longest step of a short tuning run)."""
    requested = engine.config.n_ctx
    allocated = engine.n_ctx
    tokens = _random_tokens(engine, allocated)
    llama = engine.llama
    llama.reset()
    speeds = tuple(
        _decode_at(engine, tokens, fraction, decode_steps) for fraction in sorted(depths)
    )
    filled = llama.n_tokens
    first, last = _cached_positions(engine)
    holds = first == 0 and last == filled - 1 and allocated >= requested
    engine.clear_cache()
    return CapacityAudit(
        requested_ctx=requested,
        allocated_ctx=allocated,
        filled_tokens=filled,
        first_position=first,
        last_position=last,
        holds=holds,
        speeds=speeds,
        message=_verdict(requested, allocated, filled, first, last, speeds),
    )


def _random_tokens(engine: Engine, count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(token) for token in rng.integers(0, engine.n_vocab, size=count)]


def _decode_at(engine: Engine, tokens: list[int], fraction: float, steps: int) -> DepthSpeed:
    """Fill the cache up to `fraction` of the context (from where it is), then time `steps`
    tokens decoded one at a time."""
    llama = engine.llama
    depth = max(llama.n_tokens, min(int(engine.n_ctx * fraction), engine.n_ctx - steps - 1))
    if depth > llama.n_tokens:
        llama.eval(tokens[llama.n_tokens : depth])  # batched, like a long prompt
    started = time.perf_counter()
    for token in tokens[depth : depth + steps]:
        llama.eval([token])
    elapsed = time.perf_counter() - started
    return DepthSpeed(fraction, depth, steps / elapsed if elapsed else 0.0)


def _cached_positions(engine: Engine) -> tuple[int, int]:
    """The oldest and newest positions sequence 0 holds in the KV cache."""
    memory = llama_cpp.llama_get_memory(engine.llama.ctx)
    first = int(llama_cpp.llama_memory_seq_pos_min(memory, 0))
    last = int(llama_cpp.llama_memory_seq_pos_max(memory, 0))
    return first, last


def _verdict(
    requested: int,
    allocated: int,
    filled: int,
    first: int,
    last: int,
    speeds: Sequence[DepthSpeed],
) -> str:
    if allocated < requested:
        return f"Only {allocated} of the {requested} tokens of context asked for were allocated."
    if first != 0 or last != filled - 1:
        return (
            f"After {filled} tokens the cache holds positions {first}..{last}: "
            "tokens were evicted or shifted."
        )
    empty, deepest = speeds[0], speeds[-1]
    slowdown = deepest.decode_tps / empty.decode_tps if empty.decode_tps else 0.0
    return (
        f"The context holds {filled} of {allocated} tokens with nothing evicted; decode runs at "
        f"{empty.decode_tps:.1f} tok/s empty and {deepest.decode_tps:.1f} tok/s at "
        f"{deepest.fraction:.0%} full ({slowdown:.0%} of empty)."
    )
