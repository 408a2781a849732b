"""Token log-probabilities: the model's own distribution at each sampled position.

A logprob is the log-softmax of the raw logits at the position that produced the token, before
penalties, grammar, temperature or truncation (what OpenAI reports, and llama-server with its
default `post_sampling_probs` off). Nothing here runs unless a request asks for logprobs.

`LogprobLedger` ties each sampled token to the text the reply shows. Text reaches the reply
late or never: the stop matcher holds back what may grow into a stop sequence, a token that
ends inside a UTF-8 character shows nothing until the next one completes it, a reply's
leading whitespace is stripped. The ledger hands out a token's entry once all of its text has
been shown, drops tokens whose text was wholly stripped, and at a stop keeps the tokens that
show at least one character before it: the tokens that make up the final text, in order.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp
import numpy as np

LogprobsCallback = Callable[[tuple["TokenLogprob", ...]], None]


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position, sampled or not."""

    token: int
    piece: bytes  # the token's bytes (a control token's own text, e.g. b"<|im_end|>")
    logprob: float

    @property
    def text(self) -> str:
        return self.piece.decode("utf-8", "replace")


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token, its logprob, and the most likely tokens at its position."""

    token: int
    piece: bytes  # the bytes it adds to the reply (may end inside a UTF-8 character)
    logprob: float
    top: tuple[TopLogprob, ...]  # most likely first
    # Where its text lies in the reply's text, in characters: [text_offset, text_end). A
    # token that ends inside a UTF-8 character ends with the character the next one completes.
    text_offset: int = 0
    text_end: int = 0

    @property
    def text(self) -> str:
        return self.piece.decode("utf-8", "replace")


def logits_row(ctx: llama_cpp.llama_context_p, output: int, n_vocab: int) -> np.ndarray:
    """The logits of one output of the last `llama_decode` (negative: counted from the end),
    as a float32 view into llama.cpp's buffer: read it before the next decode."""
    pointer = llama_cpp.llama_get_logits_ith(ctx, output)
    if not pointer:
        raise ValueError(f"llama.cpp holds no logits for output {output}")
    return np.ctypeslib.as_array(pointer, shape=(n_vocab,))


def token_logprob(
    logits: np.ndarray, token: int, piece: bytes, n_top: int, piece_of: Callable[[int], bytes]
) -> TokenLogprob:
    """`token`'s log-softmax over `logits`, with the `n_top` most likely tokens there
    (their bytes from `piece_of`); `piece` is what `token` adds to the reply."""
    scores = logits.astype(np.float64)
    peak = float(scores.max())
    log_total = peak + float(np.log(np.exp(scores - peak).sum()))
    return TokenLogprob(
        token=token,
        piece=piece,
        logprob=float(scores[token]) - log_total,
        top=_most_likely(scores, log_total, n_top, piece_of),
    )


def _most_likely(
    scores: np.ndarray, log_total: float, n_top: int, piece_of: Callable[[int], bytes]
) -> tuple[TopLogprob, ...]:
    if n_top <= 0:
        return ()
    n_top = min(n_top, scores.size)
    candidates = np.argpartition(-scores, n_top - 1)[:n_top]
    ordered = candidates[np.argsort(-scores[candidates], kind="stable")]
    return tuple(
        TopLogprob(int(index), piece_of(int(index)), float(scores[index]) - log_total)
        for index in ordered
    )


def display_piece(vocab: llama_cpp.llama_vocab_p, token: int) -> bytes:
    """A token's bytes with control tokens written out (`<|im_end|>`, not b""), so an
    alternative that would have ended the reply shows what it is."""
    buffer = ctypes.create_string_buffer(64)
    length = llama_cpp.llama_token_to_piece(vocab, token, buffer, 64, 0, True)
    if length < 0:  # -length is the size needed
        buffer = ctypes.create_string_buffer(-length)
        length = llama_cpp.llama_token_to_piece(vocab, token, buffer, -length, 0, True)
    return buffer.raw[:length]


@dataclass
class _Pending:
    entry: TokenLogprob
    start: int  # where the token's text begins in the decoded stream, in characters
    end: int  # where it ends (one more while its last UTF-8 character is incomplete)


class LogprobLedger:
    """Entries of sampled tokens, handed out as their text is shown (see the module doc).

    Offsets are characters of the decoded stream: everything the model's tokens spelled,
    before stop matching and stripping.
    """

    def __init__(self) -> None:
        self._pending: deque[_Pending] = deque()
        self._kept: list[TokenLogprob] = []

    def add(self, entry: TokenLogprob, start: int, end: int) -> None:
        self._pending.append(_Pending(entry, start, end))

    def release(self, shown: int, lead: int) -> tuple[TokenLogprob, ...]:
        """Entries whose text lies within the first `shown` characters; those wholly inside
        the `lead` characters stripped from the reply's start are dropped."""
        released = []
        while self._pending and self._pending[0].end <= shown:
            pending = self._pending.popleft()
            if not pending.start < pending.end <= lead:
                released.append(self._kept_entry(pending, lead))
        return tuple(released)

    def finish(self, shown: int, lead: int, *, stopped: bool) -> tuple[TokenLogprob, ...]:
        """The entries still held once the reply is over. At a stop sequence (`stopped`) only
        tokens with text before the cut at `shown` count; else every token does."""
        released = []
        while self._pending:
            pending = self._pending.popleft()
            visible = pending.start < shown or not stopped
            if visible and not pending.start < pending.end <= lead:
                released.append(self._kept_entry(pending, lead))
        return tuple(released)

    @property
    def kept(self) -> tuple[TokenLogprob, ...]:
        """Every entry handed out so far: the tokens of the reply's text."""
        return tuple(self._kept)

    def _kept_entry(self, pending: _Pending, lead: int) -> TokenLogprob:
        entry = dataclasses.replace(
            pending.entry,
            text_offset=max(0, pending.start - lead),
            text_end=max(0, pending.end - lead),
        )
        self._kept.append(entry)
        return entry
