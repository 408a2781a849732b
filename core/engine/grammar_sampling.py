"""Grammar-constrained sampling that checks the drawn token first (issue 34).

llama.cpp's grammar sampler, placed in a chain, tests every one of the vocabulary's tokens
against the grammar at every step: 6-10 ms of one core per token for SmolLM2's 49152 tokens,
20-35 ms inside a JSON string (measured with `llama_sampler_apply` on the vendored build), as
much as the whole decode step of a small model. llama.cpp's own server (`common_sampler`)
samples without the grammar first and asks the grammar only about the drawn token; only when
the grammar refuses it does it filter the whole vocabulary and draw again. A model that was
told the format follows it almost always, so the full pass is rare.

Greedy picks the same token either way (the best token, when allowed, is the best allowed
one). With temperature the result is the drawn token when allowed, else a draw from the
grammar-filtered distribution, as llama-server samples.

The full pass is what a hostile schema makes every token pay (issue 36): a string with a
`minLength` of 65536 keeps refusing the closing quote the model wants, and a pass over Gemma
3's 262144 tokens costs 100-150 ms of one core, ten times a decode step, held by every reply
batched beside it. So a refused draw first asks the grammar about the best-scored tokens only:
every token whose logit is within a band below the best, the band widening until it holds as
many allowed tokens as the chain keeps (1 for greedy, `top_k` for sampling). With no penalty
reordering the scores, the allowed tokens the chain would keep from the whole vocabulary are
then all in the shortlist (every token above its threshold is), and the chain draws the same
token from it as from the full pass (up to the order of exactly tied logits). Past
`SHORTLIST_MAX` tokens the full pass runs. What the grammar costs a reply is counted
(`grammar_s`, CPU seconds) and limited (`MAX_GRAMMAR_S`): a reply past the limit fails with
`GrammarTooSlowError`.
"""

from __future__ import annotations

import ctypes
import math
import time
from typing import Any

import llama_cpp
import numpy as np

from hearthside.core.engine.grammar_limits import GrammarError

TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)
# How far below the best logit the shortlist reaches, widening until it holds enough allowed
# tokens, and the most tokens it may hold before the full pass is cheaper.
SHORTLIST_BANDS = (4.0, 8.0, 16.0, 32.0)
SHORTLIST_MAX = 4096
# CPU seconds the grammar may cost one reply. Ordinary structured replies spend well under a
# second; a schema that makes every token a full pass over a large vocabulary reaches this in
# a few hundred tokens, and its reply ends with an error instead of holding a slot for minutes.
MAX_GRAMMAR_S = 30.0


class GrammarTooSlowError(GrammarError):
    """A reply's grammar cost more CPU time than `MAX_GRAMMAR_S` (a schema whose constraints
    fight what the model writes: nearly every token refused and searched for again)."""


def shortlist_need(
    temperature: float,
    top_k: int,
    repeat_penalty: float = 1.0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> int | None:
    """Allowed tokens a shortlist of the best-scored ones must hold for a draw from it to be
    the full pass's: 1 for greedy, `top_k` for top-k sampling; None (always the full pass)
    when penalties move scores or no top-k cuts the vocabulary."""
    if repeat_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0:
        return None
    if temperature == 0:
        return 1
    return top_k if temperature > 0 and top_k > 0 else None


class GrammarLastSampler:
    """Samples with `chain` (no grammar in it), consulting `grammar` on the drawn token first.
    Owns `grammar`, and `chain` unless `owns_chain` is False."""

    def __init__(
        self,
        chain: llama_cpp.llama_sampler_p,
        grammar: llama_cpp.llama_sampler_p,
        n_vocab: int,
        *,
        owns_chain: bool = True,
        need: int | None = None,
        time_limit_s: float = MAX_GRAMMAR_S,
    ) -> None:
        """`need`: what `shortlist_need` says of the chain (None: refusals take the full
        pass)."""
        self._chain: llama_cpp.llama_sampler_p | None = chain
        self._owns_chain = owns_chain
        self._grammar: llama_cpp.llama_sampler_p | None = grammar
        self._n_vocab = n_vocab
        self._candidates = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._need = need
        self._time_limit_s = time_limit_s
        self.refusals = 0  # steps whose drawn token the grammar refused
        self.full_passes = 0  # refusals the shortlist could not settle
        self.grammar_s = 0.0  # CPU seconds spent on the grammar

    def sample(self, ctx: llama_cpp.llama_context_p, output_index: int) -> int:
        """Sample (and accept) a token from the logits at `output_index` of the last decode."""
        assert self._chain is not None and self._grammar is not None
        pointer = llama_cpp.llama_get_logits_ith(ctx, output_index)
        if not pointer:
            raise ValueError(f"llama.cpp holds no logits for output {output_index}")
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        token = self._draw(logits, with_grammar=False)
        started = time.thread_time()
        if not self._allowed(token, float(logits[token])):
            self.refusals += 1
            token = self._draw_allowed(logits)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        self._charge(time.thread_time() - started)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _draw_allowed(self, logits: np.ndarray) -> int:
        """A token drawn from the grammar-filtered scores: from the shortlist when it settles
        the draw, else from the whole vocabulary."""
        if self._need is not None:
            shortlist = self._shortlist(logits, self._need)
            if shortlist is not None:
                return _chosen(self._chain, shortlist)
        self.full_passes += 1
        return self._draw(logits, with_grammar=True)

    def _shortlist(self, logits: np.ndarray, need: int) -> np.ndarray | None:
        """Every token scored at least some threshold below the best, refused ones at -inf,
        once `need` of them are allowed; None when that takes more than SHORTLIST_MAX tokens.
        The threshold widens band by band, each band checked once."""
        best = float(logits.max())
        bands: list[np.ndarray] = []
        allowed = size = 0
        upper = math.inf
        for width in SHORTLIST_BANDS:
            lower = best - width
            ids = np.flatnonzero((logits >= lower) & (logits < upper)).astype(np.intc)
            upper = lower
            size += len(ids)
            if size > SHORTLIST_MAX:
                return None
            band = np.zeros(len(ids), dtype=TOKEN_DATA)
            band["id"], band["logit"] = ids, logits[ids]
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(_token_data_array(band)))
            bands.append(band)
            allowed += int(np.count_nonzero(np.isfinite(band["logit"])))
            if allowed >= need:
                return np.concatenate(bands)
        return None

    def _charge(self, grammar_s: float) -> None:
        self.grammar_s += grammar_s
        if self.grammar_s > self._time_limit_s:
            raise GrammarTooSlowError(
                f"The requested output format made this reply too slow to write: checking its "
                f"tokens against the JSON schema took over {self._time_limit_s:g} s of "
                f"processor time ({self.refusals} tokens refused), so it was stopped.",
                hint="Loosen the schema (smaller minLength/minItems, fewer constraints the "
                "model has to fight), or describe the format in the prompt.",
            )

    def _draw(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        candidates = self._candidates
        candidates["id"] = np.arange(self._n_vocab, dtype=np.intc)
        candidates["logit"] = logits
        candidates["p"] = 0.0
        if with_grammar:
            array = _token_data_array(candidates)
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return _chosen(self._chain, candidates)

    def _allowed(self, token: int, logit: float) -> bool:
        one = self._one
        one["id"], one["logit"], one["p"] = token, logit, 0.0
        array = _token_data_array(one)
        llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        return not math.isinf(float(one["logit"][0]))

    def close(self) -> None:
        chain, self._chain = self._chain, None
        grammar, self._grammar = self._grammar, None
        if chain and self._owns_chain:
            llama_cpp.llama_sampler_free(chain)
        if grammar:
            llama_cpp.llama_sampler_free(grammar)


def _chosen(chain: llama_cpp.llama_sampler_p | None, candidates: np.ndarray) -> int:
    """The token `chain` selects among `candidates` (refused ones carry a -inf logit)."""
    array = _token_data_array(candidates)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))
    if not 0 <= array.selected < array.size:
        raise ValueError("llama.cpp's sampler selected no token")
    return int(candidates["id"][array.selected])


def _token_data_array(candidates: np.ndarray) -> llama_cpp.llama_token_data_array:
    data = candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
    return llama_cpp.llama_token_data_array(data, len(candidates), -1, False)


class LlamaSamplerWithGrammarLast:
    """What llama-cpp-python's `Llama.generate` samples with (`.sample(ctx, idx)`): its own
    sampler chain built without the grammar, and the grammar consulted last."""

    def __init__(
        self,
        chain: Any,
        grammar: llama_cpp.llama_sampler_p,
        n_vocab: int,
        *,
        need: int | None = None,
    ) -> None:
        self._chain_owner = chain  # a `LlamaSampler`: frees its chain when it goes
        self._sampler = GrammarLastSampler(
            chain.sampler, grammar, n_vocab, owns_chain=False, need=need
        )

    def sample(self, ctx: Any, idx: int) -> int:
        return self._sampler.sample(ctx.ctx, idx)

    def close(self) -> None:
        self._sampler.close()
        self._chain_owner.close()

    def __del__(self) -> None:
        self._sampler.close()
