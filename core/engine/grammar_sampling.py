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
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import llama_cpp
import numpy as np

TOKEN_DATA = np.dtype([("id", np.intc), ("logit", np.float32), ("p", np.float32)], align=True)
assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)


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
    ) -> None:
        self._chain: llama_cpp.llama_sampler_p | None = chain
        self._owns_chain = owns_chain
        self._grammar: llama_cpp.llama_sampler_p | None = grammar
        self._n_vocab = n_vocab
        self._candidates = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self.full_passes = 0  # steps whose drawn token the grammar refused

    def sample(self, ctx: llama_cpp.llama_context_p, output_index: int) -> int:
        """Sample (and accept) a token from the logits at `output_index` of the last decode."""
        assert self._chain is not None and self._grammar is not None
        pointer = llama_cpp.llama_get_logits_ith(ctx, output_index)
        if not pointer:
            raise ValueError(f"llama.cpp holds no logits for output {output_index}")
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        token = self._draw(logits, with_grammar=False)
        if not self._allowed(token, float(logits[token])):
            self.full_passes += 1
            token = self._draw(logits, with_grammar=True)
        llama_cpp.llama_sampler_accept(self._grammar, token)
        llama_cpp.llama_sampler_accept(self._chain, token)
        return token

    def _draw(self, logits: np.ndarray, *, with_grammar: bool) -> int:
        candidates = self._candidates
        candidates["id"] = np.arange(self._n_vocab, dtype=np.intc)
        candidates["logit"] = logits
        candidates["p"] = 0.0
        array = _token_data_array(candidates)
        if with_grammar:
            llama_cpp.llama_sampler_apply(self._grammar, ctypes.byref(array))
        llama_cpp.llama_sampler_apply(self._chain, ctypes.byref(array))
        if not 0 <= array.selected < array.size:
            raise ValueError("llama.cpp's sampler selected no token")
        return int(candidates["id"][array.selected])

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


def _token_data_array(candidates: np.ndarray) -> llama_cpp.llama_token_data_array:
    data = candidates.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
    return llama_cpp.llama_token_data_array(data, len(candidates), -1, False)


class LlamaSamplerWithGrammarLast:
    """What llama-cpp-python's `Llama.generate` samples with (`.sample(ctx, idx)`): its own
    sampler chain built without the grammar, and the grammar consulted last."""

    def __init__(self, chain: Any, grammar: llama_cpp.llama_sampler_p, n_vocab: int) -> None:
        self._chain_owner = chain  # a `LlamaSampler`: frees its chain when it goes
        self._sampler = GrammarLastSampler(chain.sampler, grammar, n_vocab, owns_chain=False)

    def sample(self, ctx: Any, idx: int) -> int:
        return self._sampler.sample(ctx.ctx, idx)

    def close(self) -> None:
        self._sampler.close()
        self._chain_owner.close()

    def __del__(self) -> None:
        self._sampler.close()
