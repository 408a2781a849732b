"""Several choices in one reply: `n` per prompt and, for completions, several prompts (text
or token ids). Each choice is its own generation, submitted as its own shared job so that an
engine with several slots decodes them together; these helpers are the request-side rules.

Choice `prompt_index * n + j` answers prompt `prompt_index` (OpenAI's numbering). With a
seed, choice j of a prompt samples with `seed + j`: the choices differ, and the same request
gives the same choices again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hearthside.core.server.request_errors import InvalidRequestError
from hearthside.core.server.schemas import MAX_CHOICES

CompletionPrompt = str | tuple[int, ...]  # text, or token ids sent as they are


def choice_seeds(seed: int | None, n: int) -> list[int | None]:
    """The seed of each of `n` choices: consecutive from `seed`, or all unseeded."""
    return [None if seed is None else seed + j for j in range(n)]


def completion_prompts(
    prompt: str | list[str] | list[int] | list[list[int]],
) -> list[CompletionPrompt]:
    """The prompts of a completions request: a string, strings, token ids, or lists of ids
    (the schema lets through only one of those shapes at a time)."""
    if isinstance(prompt, str):
        return [prompt]
    token_ids: list[int] = []
    prompts: list[CompletionPrompt] = []
    for item in prompt:
        if isinstance(item, int):
            token_ids.append(item)
        elif isinstance(item, str):
            prompts.append(item)
        elif item:
            prompts.append(tuple(item))
        else:
            raise InvalidRequestError(
                "A prompt holds no token ids.", param="prompt", code="empty_prompt"
            )
    return [tuple(token_ids)] if token_ids else prompts


def check_choice_count(n_prompts: int, n: int) -> None:
    if n_prompts * n > MAX_CHOICES:
        raise InvalidRequestError(
            f"This request asks for {n_prompts * n} choices ({n_prompts} prompts × n={n}); "
            f"Hearthside generates at most {MAX_CHOICES} per request.",
            param="prompt" if n_prompts > 1 else "n",
            code="too_many_choices",
            hint="Send fewer prompts per request, or a smaller n.",
        )


def check_token_ids(tokens: Sequence[int], n_vocab: int) -> None:
    """Refuse ids the model's vocabulary lacks (llama.cpp would read past its tables)."""
    for token in tokens:
        if not 0 <= token < n_vocab:
            raise InvalidRequestError(
                f"Token id {token} is not in this model's vocabulary (ids 0 to {n_vocab - 1}).",
                param="prompt",
                code="invalid_token_id",
            )


def with_choice_index(payload: dict[str, Any], index: int) -> dict[str, Any]:
    """`payload` (a reply or a chunk built for one choice) renumbered as choice `index`."""
    choices = [{**choice, "index": index} for choice in payload.get("choices", ())]
    return {**payload, "choices": choices}


def merged_reply(bodies: Sequence[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
    """One reply holding every choice of `bodies` (one body per choice, in choice order)."""
    choices = [
        choice
        for index, body in enumerate(bodies)
        for choice in with_choice_index(body, index)["choices"]
    ]
    return {**bodies[0], "choices": choices, "usage": usage}


def total_usage(
    prompt_indices: Sequence[int], usages: Sequence[Mapping[str, int]]
) -> dict[str, int]:
    """Usage over all choices: each prompt's tokens counted once, every choice's completion."""
    prompt_tokens: dict[int, int] = {}
    for prompt_index, usage in zip(prompt_indices, usages, strict=True):
        prompt_tokens.setdefault(prompt_index, usage["prompt_tokens"])
    prompt = sum(prompt_tokens.values())
    completion = sum(usage["completion_tokens"] for usage in usages)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
