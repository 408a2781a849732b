"""Backing off to settings that fit: fewer parallel requests, a shorter context, a quantized
KV cache, smaller batches.

Loading what does not fit in the memory this process may use (a container's or a job's cgroup
limit, or the machine's RAM) does not fail politely: llama.cpp writes the whole KV cache at
load, and under a limit the kernel's OOM killer ends the process without a word. So the
context is first capped at what the model was trained on; then, in this order:
1. fewer parallel requests (slots), when more than one was asked for: at the context asked
   for, with the KV cache the planner picks for one slot (never a coarser one), the slots
   halved down to one — a slot is a convenience for a second client, while the context and
   the KV precision are what every conversation lives with;
2. a shorter context: one slot, at the asked size and then halved down to MIN_CONTEXT — at
   each size the planner's pick of KV cache (f16, q8_0, q4_0, so a quantized cache comes
   before a shorter context), then the same with smaller micro-batches.
The first plan that fits is the one loaded, with one sentence saying what changed and why.
When the planner chooses the slots itself it already gives them only what is left over
(autotune/planner.py), so only a number that was asked for is backed off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hearthside.autotune.planner import (
    DEFAULT_FREE_MARGIN_BYTES,
    KV_CHOICES,
    Plan,
    plan,
)
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile, MemoryInfo
from hearthside.core.units import format_bytes

MIN_CONTEXT = 512
DEFAULT_UBATCH = EngineConfig("").n_ubatch
# A quarter of the default: the logits buffer (vocabulary x micro-batch floats) shrinks 4x,
# 512 to 128 MiB for Gemma 3's 262k-token vocabulary; prompts are read a little slower.
SMALL_UBATCH = 128
# Under a memory limit, kept free beyond what is already in use there: the process's own growth
# (the chat, Python objects, llama.cpp's small allocations). At most the whole-machine margin.
LIMIT_CUSHION_SHARE = 8

Step = tuple[int, int | None]  # (n_ctx, n_ubatch; None: the engine's default)


def trained_context(spec: ModelSpec, n_ctx: int) -> int:
    """`n_ctx`, but no more than the context the model was trained on (where the file says)."""
    return min(n_ctx, spec.context_length) if spec.context_length else n_ctx


def backoff_steps(n_ctx: int) -> list[Step]:
    """What to try, in order: `n_ctx`, then halved down to MIN_CONTEXT; each with the default
    micro-batch, then a small one."""
    sizes = [n_ctx]
    while sizes[-1] // 2 >= MIN_CONTEXT:
        sizes.append(sizes[-1] // 2)
    return [(size, ubatch) for size in sizes for ubatch in (None, SMALL_UBATCH)]


def slot_steps(n_parallel: int) -> list[int]:
    """The slot counts to try before one: `n_parallel`, then halved while above one."""
    counts = []
    while n_parallel > 1:
        counts.append(n_parallel)
        n_parallel //= 2
    return counts


def free_margin(memory: MemoryInfo) -> int:
    """What a load leaves free. On a whole machine, room for the other programs; under a cgroup
    limit, what is already in use under it (this process's Python and libraries among it) plus
    a cushion: the usual 2 GiB may be more than the whole limit."""
    limit = memory.cgroup_limit_bytes
    if limit is None:
        return DEFAULT_FREE_MARGIN_BYTES
    in_use = limit - memory.available_bytes if memory.available_bytes is not None else 0
    return max(0, in_use) + min(DEFAULT_FREE_MARGIN_BYTES, limit // LIMIT_CUSHION_SHARE)


def plans_backing_off(
    spec: ModelSpec,
    profile: HardwareProfile,
    calibration: dict[str, float],
    n_ctx: int,
    margin: int,
    n_parallel: int | None = None,
) -> Iterator[Plan]:
    """The planner's pick at each step, in the module docstring's order, lazily: stop at the
    first that fits. `n_parallel` None lets the planner choose the slots at the asked context."""

    def planned(size: int, ubatch: int | None, slots: int | None, **more: Any) -> Plan:
        return plan(
            spec,
            profile,
            n_ctx=size,
            calibration=calibration,
            free_margin_bytes=margin,
            n_ubatch=ubatch,
            n_parallel=slots,
            **more,
        )

    steps = backoff_steps(n_ctx)
    if n_parallel is None or n_parallel == 1:
        yield planned(*steps[0], n_parallel)
    else:
        single = planned(*steps[0], 1)
        finest = KV_CHOICES[: KV_CHOICES.index(single.config.type_k) + 1]
        kv = finest if single.fits else KV_CHOICES
        for slots in slot_steps(n_parallel):
            yield planned(*steps[0], slots, kv_types=kv)
        yield single
    for size, ubatch in steps[1:]:
        yield planned(size, ubatch, 1)


def first_usable(plans: Iterator[Plan], n_ctx: int) -> tuple[Plan | None, Plan | None]:
    """(the first plan that fits — or, at the asked `n_ctx` with one slot and the default
    batches, streams its weights from disk — else None; the last one looked at, for "even
    this fails")."""
    last = None
    for candidate in plans:
        config = candidate.config
        as_asked = config.n_ctx == n_ctx and config.n_parallel == 1 and _default_batches(config)
        if candidate.fits or (candidate.streams_from_disk and as_asked):
            return candidate, candidate
        last = candidate
    return None, last


def is_backed_off(config: EngineConfig, n_ctx: int, n_parallel: int | None) -> bool:
    """Less than asked: a shorter context, fewer slots than asked for, smaller batches (the
    planner's own pick of KV cache is not a back-off)."""
    fewer_slots = n_parallel is not None and config.n_parallel < n_parallel
    return config.n_ctx != n_ctx or fewer_slots or not _default_batches(config)


def _default_batches(config: EngineConfig) -> bool:
    return config.n_ubatch >= DEFAULT_UBATCH


def describe_cap(asked: int, trained: int) -> str:
    return f"The model was trained on {trained} tokens, so the context is {trained}, not {asked}."


def describe_backoff(
    asked: int, chosen: EngineConfig, memory: MemoryInfo, margin: int, asked_parallel: int = 1
) -> str:
    """E.g. "A 32768-token context does not fit in the 412 MiB this process may still use
    under its 700 MiB memory limit; loading with 8192 tokens and a q8_0 KV cache.", or "4
    parallel requests of 8192 tokens each do not fit in …; loading with 2 parallel requests." """
    what = (
        f"{asked_parallel} parallel requests of {asked} tokens each do not"
        if asked_parallel > 1
        else f"A {asked}-token context does not"
    )
    changes = describe_changes(asked, chosen, asked_parallel)
    return f"{what} fit in {describe_room(memory, margin)}; loading with {changes}."


def describe_nothing_fits(closest: EngineConfig, memory: MemoryInfo, margin: int) -> str:
    return (
        f"Even {closest.n_ctx} tokens with {kv_cache(closest.type_k)} do not fit in "
        f"{describe_room(memory, margin)}; trying those anyway."
    )


def kv_cache(type_name: str) -> str:
    """ "a q8_0 KV cache", "an f16 KV cache" """
    article = "an" if type_name.startswith("f") else "a"
    return f"{article} {type_name} KV cache"


def describe_changes(asked: int, config: EngineConfig, asked_parallel: int = 1) -> str:
    """What differs from the asked-for context and slots at full precision: "2 parallel
    requests, 8192 tokens, a q8_0 KV cache and 128-token batches"."""
    changes = []
    if config.n_parallel != asked_parallel:
        slots = config.n_parallel
        changes.append("1 request at a time" if slots == 1 else f"{slots} parallel requests")
    if config.n_ctx != asked:
        changes.append(f"{config.n_ctx} tokens")
    if config.type_k != "f16":
        changes.append(kv_cache(config.type_k))
    if config.n_ubatch < DEFAULT_UBATCH:
        changes.append(f"{config.n_ubatch}-token batches")
    if not changes:
        return "the settings that fit"
    if len(changes) == 1:
        return changes[0]
    return ", ".join(changes[:-1]) + " and " + changes[-1]


def describe_room(memory: MemoryInfo, margin: int) -> str:
    limit = memory.cgroup_limit_bytes
    if limit is not None:
        room = max(0, limit - margin)
        return (
            f"the {format_bytes(room)} this process may still use under its "
            f"{format_bytes(limit)} memory limit"
        )
    total = memory.total_bytes or 0
    return (
        f"the {format_bytes(max(0, total - margin))} of RAM left after keeping "
        f"{format_bytes(margin)} free for other programs"
    )
