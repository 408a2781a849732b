"""Token logprobs in OpenAI's shapes, for whole replies and for stream chunks.

Chat completions carry `{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}`;
completions carry the legacy parallel lists `tokens`, `token_logprobs`, `top_logprobs` (one
`{token: logprob}` per position) and `text_offset`. The values are the engine's
(core/engine/logprobs.py): log-softmax of the raw logits, before any sampling setting.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.logprobs import TokenLogprob, TopLogprob


def chat_logprobs(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """A chat choice's `logprobs` (OpenAI's ChatCompletionTokenLogprob list)."""
    return {"content": [_chat_entry(entry) for entry in entries], "refusal": None}


def _chat_entry(entry: TokenLogprob) -> dict[str, Any]:
    return {
        **_chat_alternative(entry),
        "top_logprobs": [_chat_alternative(top) for top in entry.top],
    }


def _chat_alternative(entry: TokenLogprob | TopLogprob) -> dict[str, Any]:
    return {"token": entry.text, "logprob": entry.logprob, "bytes": list(entry.piece)}


def completion_logprobs(entries: Sequence[TokenLogprob], prompt_chars: int) -> dict[str, Any]:
    """A completion choice's `logprobs`. Offsets count from the start of the prompt, as
    OpenAI's (and llama-cpp-python's) do without `echo`. Each position's `top_logprobs` holds
    the N most likely tokens and, when it is not among them, the sampled one (OpenAI: "up to
    logprobs+1 elements")."""
    return {
        "tokens": [entry.text for entry in entries],
        "token_logprobs": [entry.logprob for entry in entries],
        "top_logprobs": [_completion_alternatives(entry) for entry in entries],
        "text_offset": [prompt_chars + entry.text_offset for entry in entries],
    }


def _completion_alternatives(entry: TokenLogprob) -> dict[str, float]:
    alternatives = {top.text: top.logprob for top in entry.top}
    if entry.token not in {top.token for top in entry.top}:
        alternatives.setdefault(entry.text, entry.logprob)
    return alternatives


class StreamedLogprobs:
    """Gives each stream chunk the logprob entries of the text it carries.

    The engine hands entries over (`hold`, on its own thread) just before the text piece that
    completes them, and that piece reaches the event loop later, through the stream's queue;
    entries may therefore be held ahead of their text, never behind it. `take(piece)` counts
    the reply's characters and gives out the entries whose text ends within them. Entries of
    text a stop sequence cut through come after the last piece: `rest` has them.
    """

    def __init__(self) -> None:
        self._held: deque[TokenLogprob] = deque()
        self._chars = 0
        self._given = 0

    def hold(self, entries: tuple[TokenLogprob, ...]) -> None:
        self._held.extend(entries)

    def take(self, piece: str) -> list[TokenLogprob]:
        self._chars += len(piece)
        taken = []
        while self._held and self._held[0].text_end <= self._chars:
            taken.append(self._held.popleft())
        self._given += len(taken)
        return taken

    def rest(self, result: GenerationResult) -> Sequence[TokenLogprob]:
        """The entries of the finished `result` no chunk has carried yet."""
        return (result.logprobs or ())[self._given :]
