"""How many prompt tokens a batch step carries (`next_prompt_chunk`), on a simulated machine
whose every step has a fixed cost: what issue 31's stall came from. Four requests arriving
together on a busy machine got their first tokens after 15-30 s, because the chunk size was
computed from whole-step times and the fixed cost read as slow prefill."""

from __future__ import annotations

from hearthside.core.engine.batch import (
    FIRST_PROMPT_CHUNK,
    MIN_PROMPT_CHUNK,
    STEP_TARGET_S,
    next_prompt_chunk,
)

N_BATCH = 2048
PER_TOKEN_S = 0.002  # prompt cost per token, SmolLM2 on 2 cores
PROMPT_TOKENS = 4 * 300  # four requests' prompts, arrived together


def read_prompts(plain_step_s: float) -> tuple[int, float]:
    """Steps and seconds to read every prompt token, each step costing `plain_step_s` (what a
    step without prompt tokens takes: the decoding neighbours, a busy machine) plus its
    prompt tokens."""
    chunk, left, steps, seconds = FIRST_PROMPT_CHUNK, PROMPT_TOKENS, 0, 0.0
    while left > 0:
        taken = min(chunk, left)
        added_s = taken * PER_TOKEN_S
        steps, seconds, left = steps + 1, seconds + plain_step_s + added_s, left - taken
        allowed_s = max(STEP_TARGET_S, plain_step_s)
        chunk = next_prompt_chunk(
            chunk, taken, added_s=added_s, allowed_s=allowed_s, n_batch=N_BATCH
        )
    return steps, seconds


def test_on_a_busy_machine_the_prompts_are_read_in_a_few_large_chunks() -> None:
    plain_step_s = 0.3  # a step on a machine with another program busy
    steps, seconds = read_prompts(plain_step_s)
    all_at_once_s = plain_step_s + PROMPT_TOKENS * PER_TOKEN_S  # llama-server: one step
    assert steps <= 10, steps
    assert seconds <= 2 * all_at_once_s, (seconds, all_at_once_s)


def test_on_a_quiet_machine_a_chunk_adds_about_the_step_target() -> None:
    chunk = FIRST_PROMPT_CHUNK
    for _ in range(20):
        chunk = next_prompt_chunk(
            chunk, chunk, added_s=chunk * PER_TOKEN_S, allowed_s=STEP_TARGET_S, n_batch=N_BATCH
        )
    # doubling stops once a chunk adds more than the target: a neighbour's token waits for it
    assert STEP_TARGET_S / 2 < chunk * PER_TOKEN_S <= 2 * STEP_TARGET_S, chunk


def test_one_slow_step_halves_the_chunk_and_it_never_falls_below_the_minimum() -> None:
    assert next_prompt_chunk(256, 256, added_s=1.0, allowed_s=0.1, n_batch=N_BATCH) == 128
    assert next_prompt_chunk(8, 8, added_s=1.0, allowed_s=0.1, n_batch=N_BATCH) == MIN_PROMPT_CHUNK
    # a step that carried less than its chunk (the prompt ended) says nothing about a bigger one
    assert next_prompt_chunk(64, 10, added_s=0.01, allowed_s=0.1, n_batch=N_BATCH) == 64
