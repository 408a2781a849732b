"""Speculative decoding: cheap drafts that the target model verifies in one batch.

llama-cpp-python's `Llama.generate` already knows the protocol: after each sampled token it
asks `draft_model(input_ids)` for guesses, evaluates the sampled token plus the guesses in
one batch, samples the target at every position and keeps the drafted tokens only while they
equal the target's own samples. Every emitted token is therefore a sample of the target, so
with greedy sampling the reply is token-for-token the reply without speculation, and with
temperature > 0 it follows the target's distribution (one sampler draw per emitted token, in
the same order as without drafts).

What this module adds:
- `SpeculativeLlama`: a `Llama` that asks llama.cpp for logits only at the positions that
  will be sampled. llama-cpp-python turns `logits_all` on when it is given a draft model, and
  on a model with a 262k-token vocabulary the output layer then runs for every prompt token
  and TTFT grows several-fold (FIELD_NOTES). The draft is attached after construction, so it
  can also be switched at run time (the tuner compares drafts without reloading).
- `PromptLookupDraft` and `ModelDraft`: drafts that count what they drafted and, from the
  next call's input ids, what the target accepted.
- `ModelDraft` owns a second, small llama.cpp model with the same vocabulary, drafts greedily
  and keeps its KV cache in step with the target: only the tokens it has not evaluated yet
  are evaluated, and the rejected tail is removed from its cache.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import numpy.typing as npt
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from hearthside.core.engine import native_log
from hearthside.core.engine.config import EngineConfig, SpeculativeConfig
from hearthside.core.engine.grammar_sampling import LlamaSamplerWithGrammarLast, shortlist_need
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.engine.template_free_llama import TemplateFreeLlama
from hearthside.core.engine.tensor_overrides import LlamaWithOverrides
from hearthside.core.errors import EngineError, EngineLoadError

TokenIds = npt.NDArray[np.intc]


class SpeculationCounter:
    """Counts drafted and accepted tokens from the sequence of draft calls.

    A call's input ids are everything the target has accepted so far plus its newest sample.
    The draft returned by the previous call was accepted exactly as far as it agrees with what
    now follows its position: the first disagreement is where the target sampled otherwise.
    """

    def __init__(self) -> None:
        self.drafted = self.accepted = self.steps = self.draft_steps = self.rejections = 0
        self._pending: tuple[int, TokenIds] | None = None

    def reset(self) -> None:
        self.drafted = self.accepted = self.steps = self.draft_steps = self.rejections = 0
        self._pending = None

    def observe(self, input_ids: TokenIds) -> None:
        """Settle the previous draft against the ids the target passes now."""
        if self._pending is not None:
            self._settle(input_ids)

    def record(self, position: int, draft: TokenIds) -> None:
        self.steps += 1
        self._pending = (position, draft) if len(draft) else None

    def finish(self, final_ids: TokenIds) -> None:
        """Settle the last draft against the tokens the generation really produced."""
        if self._pending is not None:
            self._settle(final_ids)

    def _settle(self, ids: TokenIds) -> None:
        assert self._pending is not None
        position, draft = self._pending
        self._pending = None
        following = ids[position : position + len(draft)]
        if len(following) == 0:
            return  # the generation ended before this draft was verified
        reached = draft[: len(following)]
        accepted = _common_prefix_length(reached, following)
        self.drafted += len(reached)
        self.accepted += accepted
        self.draft_steps += 1
        self.rejections += int(accepted < len(reached))

    def stats(self, mode: str, draft_tokens: int) -> SpeculationStats:
        return SpeculationStats(
            mode=mode,
            draft_tokens=draft_tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            steps=self.steps,
            draft_steps=self.draft_steps,
            rejections=self.rejections,
            acceptance_rate=self.accepted / self.drafted if self.drafted else None,
            mean_accepted_length=self.accepted / self.draft_steps if self.draft_steps else None,
        )


class CountingDraft(LlamaDraftModel):
    """A draft that keeps within the target's limits and counts its own success."""

    mode = "off"

    def __init__(self, draft_tokens: int) -> None:
        self.draft_tokens = draft_tokens
        self.counter = SpeculationCounter()
        self._token_limit = 1 << 31  # the target's vocabulary size, once attached
        self._batch_room = draft_tokens  # the target verifies one batch: n_batch - 1 drafts

    def attach(self, target: llama_cpp.Llama) -> None:
        self._token_limit = int(target.n_vocab())
        self._batch_room = max(1, int(target.n_batch) - 1)

    def __call__(self, input_ids: TokenIds, /, **kwargs: Any) -> TokenIds:
        return self.draft_for(input_ids, self.counter)

    def draft_for(
        self, input_ids: TokenIds, counter: SpeculationCounter, room: int | None = None
    ) -> TokenIds:
        """Guesses after `input_ids` (at most `room` of them: the cells left in the context),
        counted in `counter`: the batch scheduler keeps one per sequence."""
        counter.observe(input_ids)
        limit = min(self.draft_tokens, self._batch_room)
        if room is not None:
            limit = min(limit, room)
        draft = np.array([], dtype=np.intc)
        if limit > 0:
            draft = np.asarray(self.propose(input_ids), dtype=np.intc)
            draft = _within_vocabulary(draft[:limit], self)
        counter.record(len(input_ids), draft.copy())
        return draft

    def stats_of(self, counter: SpeculationCounter) -> SpeculationStats:
        return counter.stats(self.mode, self.draft_tokens)

    @abc.abstractmethod
    def propose(self, input_ids: TokenIds) -> TokenIds:
        """Up to `draft_tokens` guesses for the tokens after `input_ids`."""

    def begin_generation(self) -> None:
        self.counter.reset()

    def finish_generation(self, final_ids: TokenIds) -> SpeculationStats:
        self.counter.finish(final_ids)
        return self.counter.stats(self.mode, self.draft_tokens)

    def live_stats(self) -> SpeculationStats:
        """The counts so far (the last draft not yet settled), for a status line."""
        return self.counter.stats(self.mode, self.draft_tokens)

    def close(self) -> None:
        """Free whatever the draft holds."""


def _within_vocabulary(draft: TokenIds, owner: CountingDraft) -> TokenIds:
    # A draft with a slightly larger (padded) vocabulary could propose an id the target
    # lacks; llama_decode would fail on it, so the draft stops there.
    outside = np.nonzero(draft >= owner._token_limit)[0]
    return draft[: int(outside[0])] if len(outside) else draft


class PromptLookupDraft(CountingDraft):
    """Drafts the tokens that followed the latest n-gram where it occurred before.

    Uses llama-cpp-python's lookup: the longest n-gram (up to `ngram_size`) that matches the
    end of the text, first occurrence first; in a code edit that is the original code.
    """

    mode = "prompt_lookup"

    def __init__(self, draft_tokens: int, ngram_size: int) -> None:
        super().__init__(draft_tokens)
        self.ngram_size = ngram_size

    def propose(self, input_ids: TokenIds) -> TokenIds:
        found = LlamaPromptLookupDecoding.find_candidate_pred_tokens(
            input_ids=input_ids,
            max_ngram_size=self.ngram_size,
            num_pred_tokens=self.draft_tokens,
        )
        return np.asarray(found, dtype=np.intc)


class ModelDraft(CountingDraft):
    """A second, small model that drafts `draft_tokens` tokens greedily.

    Its KV cache follows the target: each call keeps the prefix of its cache that matches the
    target's input ids, removes the rest (the rejected drafts) and evaluates only the new
    tokens, so a verify step costs k single-token evaluations of the draft, never a re-run of
    the conversation.
    """

    mode = "draft_model"

    def __init__(self, llama: llama_cpp.Llama, draft_tokens: int) -> None:
        super().__init__(draft_tokens)
        self.llama = llama
        self._vocab = llama_cpp.llama_model_get_vocab(llama.model)
        self._n_vocab = int(llama.n_vocab())
        self.evaluated_tokens = 0  # tokens the draft has run through its model, for tests

    @classmethod
    def load(cls, speculative: SpeculativeConfig, target: EngineConfig) -> ModelDraft:
        return cls(load_draft_llama(speculative, target), speculative.draft_tokens)

    def propose(self, input_ids: TokenIds) -> TokenIds:
        room = self.llama.n_ctx() - len(input_ids)
        if room <= 1:
            return np.array([], dtype=np.intc)
        self._catch_up(input_ids)
        drafted: list[int] = []
        for _ in range(min(self.draft_tokens, room - 1)):
            token = self._greedy_token()
            drafted.append(token)
            if len(drafted) == self.draft_tokens or llama_cpp.llama_vocab_is_eog(
                self._vocab, token
            ):
                break
            self._evaluate([token])
        return np.array(drafted, dtype=np.intc)

    def _catch_up(self, input_ids: TokenIds) -> None:
        """Make the draft's cache hold exactly `input_ids`, evaluating only what is new."""
        llama = self.llama
        cached = llama.input_ids[: llama.n_tokens]
        # The last id is always evaluated again when cached, so there are logits to read.
        shared = min(_common_prefix_length(cached, input_ids), len(input_ids) - 1)
        memory = llama_cpp.llama_get_memory(llama.ctx)
        if shared < llama.n_tokens and not llama_cpp.llama_memory_seq_rm(memory, 0, shared, -1):
            llama.reset()
            shared = 0
        llama.n_tokens = shared
        self._evaluate(input_ids[shared:].tolist())

    def _evaluate(self, tokens: list[int]) -> None:
        self.llama.eval(tokens)
        self.evaluated_tokens += len(tokens)

    def _greedy_token(self) -> int:
        pointer = llama_cpp.llama_get_logits_ith(self.llama.ctx, -1)
        logits = np.ctypeslib.as_array(pointer, shape=(self._n_vocab,))
        return int(np.argmax(logits))

    def close(self) -> None:
        self.llama.close()


def load_draft_llama(speculative: SpeculativeConfig, target: EngineConfig) -> llama_cpp.Llama:
    """The draft model, loaded like the target (threads, GPU layers) unless set apart."""
    if speculative.draft_model_path is None:
        raise EngineError("Draft-model speculation needs a draft model file.")
    path = Path(speculative.draft_model_path)
    kwargs = target.llama_kwargs()
    kwargs.update(
        model_path=str(path),
        n_ctx=speculative.draft_n_ctx or target.n_ctx,
        n_threads=speculative.draft_threads or target.decode_threads,
        n_gpu_layers=(
            target.n_gpu_layers
            if speculative.draft_gpu_layers is None
            else speculative.draft_gpu_layers
        ),
    )
    native_log.install()
    native_log.forget()
    try:
        return TemplateFreeLlama(**kwargs, verbose=False)
    except (ValueError, RuntimeError) as exc:
        reason = native_log.last_failure_line()
        raise EngineLoadError(
            f"llama.cpp could not load the draft model {path.name}"
            + (f" ({reason})." if reason else "."),
            hint="Choose a smaller draft model, or turn draft-model speculation off.",
        ) from exc


class SpeculativeLlama(TemplateFreeLlama):
    """A `Llama` that computes logits only where `generate` will sample.

    Without a draft that is the last position of each evaluation (llama-cpp-python's own
    behaviour); with one it is the last `draft_tokens + 1` positions, which covers a verify
    batch (the sampled token plus its drafts) and, for a prompt, just its final tokens.
    """

    draft: CountingDraft | None = None

    def attach_draft(self, draft: CountingDraft | None) -> None:
        if draft is not None:
            draft.attach(self)
        self.draft = draft
        self.draft_model = draft

    def _init_sampler(self, *, grammar: Any = None, **kwargs: Any) -> Any:  # type: ignore[override]
        """llama-cpp-python's sampler chain, with a grammar consulted on the drawn token
        first instead of on every token of the vocabulary (grammar_sampling.py, #34)."""
        chain = super()._init_sampler(grammar=None, **kwargs)  # it is called with keywords
        if grammar is None:
            return chain
        gbnf, root = grammar._grammar.encode(), grammar._root.encode()
        native = llama_cpp.llama_sampler_init_grammar(self._model.vocab, gbnf, root)
        if not native:
            chain.close()
            raise ValueError("llama.cpp refused the grammar")
        need = None
        if not kwargs.get("mirostat_mode"):
            need = shortlist_need(
                kwargs.get("temp", 0.8),
                kwargs.get("top_k", 40),
                kwargs.get("repeat_penalty", 1.0),
                kwargs.get("frequency_penalty", 0.0),
                kwargs.get("presence_penalty", 0.0),
            )
        return LlamaSamplerWithGrammarLast(chain, native, self.n_vocab(), need=need)

    def eval(self, tokens: Any) -> None:
        wanted = 1 if self.draft is None else self.draft.draft_tokens + 1
        self.evaluate(list(tokens), logits_for_last=wanted)

    def evaluate(self, tokens: list[int], *, logits_for_last: int) -> None:
        """Evaluate `tokens` after the cached ones, with logits for the last few positions
        (at most one batch's worth: sampling reads the last decode's outputs)."""
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            is_last_chunk = start + self.n_batch >= len(tokens)
            self._decode_chunk(chunk, logits_for_last if is_last_chunk else 1)

    def _decode_chunk(self, chunk: list[int], with_logits: int) -> None:
        n_past = self.n_tokens
        self._batch.set_batch(batch=chunk, n_past=n_past, logits_all=False)
        logits = self._batch.batch.logits
        for index in range(max(0, len(chunk) - with_logits), len(chunk)):
            logits[index] = True
        self._ctx.decode(self._batch)
        self.input_ids[n_past : n_past + len(chunk)] = chunk
        self.n_tokens += len(chunk)
        self._requires_eval = False


class SpeculativeLlamaWithOverrides(SpeculativeLlama, LlamaWithOverrides):
    """`SpeculativeLlama` whose model loads with tensor buffer-type overrides."""


def merge_stats(runs: list[SpeculationStats]) -> SpeculationStats | None:
    """The counts of several generations together (rates recomputed from the sums)."""
    if not runs:
        return None
    counter = SpeculationCounter()
    for stats in runs:
        counter.drafted += stats.drafted
        counter.accepted += stats.accepted
        counter.steps += stats.steps
        counter.draft_steps += stats.draft_steps
        counter.rejections += stats.rejections
    return counter.stats(runs[0].mode, max(stats.draft_tokens for stats in runs))


def make_draft(speculative: SpeculativeConfig, target: EngineConfig) -> CountingDraft | None:
    """The draft a speculative config asks for (None when speculation is off)."""
    if speculative.mode == "prompt_lookup":
        return PromptLookupDraft(speculative.draft_tokens, speculative.ngram_size)
    if speculative.mode == "draft_model":
        return ModelDraft.load(speculative, target)
    return None


def _common_prefix_length(first: TokenIds, second: TokenIds) -> int:
    length = min(len(first), len(second))
    differ = np.nonzero(np.asarray(first[:length]) != np.asarray(second[:length]))[0]
    return int(differ[0]) if len(differ) else length


__all__ = [
    "CountingDraft",
    "ModelDraft",
    "PromptLookupDraft",
    "SpeculationCounter",
    "SpeculationStats",
    "SpeculativeLlama",
    "SpeculativeLlamaWithOverrides",
    "load_draft_llama",
    "make_draft",
    "merge_stats",
]
