"""The context-capacity audit: does the context hold what was promised, and how fast is decode
as it fills?

Users of other tools have found the "advertised" context silently smaller than real. For a
loaded engine this audit (1) compares the context llama.cpp really allocated with the one
asked for, (2) measures decode speed at several depths (empty, ~25%, ~90% full — llama-bench's
`-d`), and (3) fills the context to ~90% and checks that the KV cache still holds every
position from 0, with none evicted or shifted, and that generation continues.
With a time limit (the tuner's budget) the fill stops where the time runs out: the audit is
then `complete=False`, does not claim the context holds, and says how far it checked.
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
    complete: bool = True  # False: the time limit stopped the fill before the last depth

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["speeds"] = [asdict(speed) for speed in self.speeds]  # JSON has lists, not tuples
        return data


def audit_context(
    engine: Engine,
    *,
    depths: Sequence[float] = DEPTHS,
    decode_steps: int = DECODE_STEPS,
    time_limit_s: float | None = None,
) -> CapacityAudit:
    """Run the audit on `engine` (the engine thread's job: it resets the engine's cache).

    The context fills once, in order: a prompt-sized batch up to each depth, then
    `decode_steps` tokens one at a time there, timed. So the audit costs one fill of the
    context, not one per depth (which made it the longest step of a short tuning run).
    With `time_limit_s` the fill stops, between batches, once that much time has passed."""
    requested = engine.config.n_ctx
    allocated = engine.n_ctx
    tokens = _random_tokens(engine, allocated)
    llama = engine.llama
    llama.reset()
    deadline = None if time_limit_s is None else time.perf_counter() + time_limit_s
    speeds: list[DepthSpeed] = []
    for fraction in sorted(depths):
        speed = _decode_at(engine, tokens, fraction, decode_steps, deadline)
        if speed is None:
            break
        speeds.append(speed)
    complete = len(speeds) == len(depths)
    filled = llama.n_tokens
    first, last = _cached_positions(engine)
    holds = complete and first == 0 and last == filled - 1 and allocated >= requested
    engine.clear_cache()
    message = _verdict(requested, allocated, filled, first, last, speeds)
    if not complete:
        message = _cut_short(allocated, filled, first, last, speeds)
    return CapacityAudit(
        requested_ctx=requested,
        allocated_ctx=allocated,
        filled_tokens=filled,
        first_position=first,
        last_position=last,
        holds=holds,
        speeds=tuple(speeds),
        message=message,
        complete=complete,
    )


def audit_context_within(engine: Engine, time_limit_s: float) -> CapacityAudit:
    """`audit_context` stopped after `time_limit_s` (a module-level function, so a worker
    process can run it by name with a positional argument)."""
    return audit_context(engine, time_limit_s=time_limit_s)


def _random_tokens(engine: Engine, count: int) -> list[int]:
    rng = np.random.default_rng(0)
    return [int(token) for token in rng.integers(0, engine.n_vocab, size=count)]


def _decode_at(
    engine: Engine, tokens: list[int], fraction: float, steps: int, deadline: float | None
) -> DepthSpeed | None:
    """Fill the cache up to `fraction` of the context (from where it is), then time `steps`
    tokens decoded one at a time; None when `deadline` (perf_counter) passed first."""
    llama = engine.llama
    depth = max(llama.n_tokens, min(int(engine.n_ctx * fraction), engine.n_ctx - steps - 1))
    chunk = max(1, engine.config.n_batch)
    while depth > llama.n_tokens:  # batched, like a long prompt
        if deadline is not None and time.perf_counter() > deadline:
            return None
        llama.eval(tokens[llama.n_tokens : min(depth, llama.n_tokens + chunk)])
    if deadline is not None and time.perf_counter() > deadline:
        return None
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


def _cut_short(
    allocated: int, filled: int, first: int, last: int, speeds: Sequence[DepthSpeed]
) -> str:
    evicted = first != 0 or last != filled - 1
    so_far = "tokens were evicted or shifted" if evicted else "nothing evicted so far"
    measured = ", ".join(f"{s.decode_tps:.1f} tok/s at {s.fraction:.0%} full" for s in speeds)
    return (
        f"Checked {filled} of {allocated} tokens of context before the time for the check ran "
        f"out: {so_far}" + (f"; decode {measured}." if measured else ".")
    )


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
