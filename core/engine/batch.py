"""Continuous batching: several conversations decoded together in one llama.cpp context.

With `n_parallel` > 1 the context has that many sequence slots (llama.cpp's `n_seq_max`), each
with its own `n_ctx` KV cells (`kv_unified` off, like llama-server's slots). `BatchScheduler`
owns generation on it. Its thread runs steps; each step is ONE `llama_decode` over a batch
that holds the next token of every generating sequence and a chunk of the prompt of newly
admitted ones, followed by one sample per sequence from that sequence's own sampler chain.
Prompt chunks are sized so that they add about `STEP_TARGET_S` to a step (or one plain
step's time, where a step without prompt tokens takes longer than that): a long prompt never
holds up the others for its whole length (decoding sequences get their token every step,
shorter prompts go first), and a cancel (checked between steps) lands fast.

Each slot remembers the tokens its cells hold. A request takes the free slot whose tokens
share the longest prefix with its prompt (among the slots that prefix serves, see
`_serves`), else the least recently used free slot, empty ones first; it drops the cells
after the shared prefix and evaluates only the rest, so turn N of a conversation costs only
its new tokens. Requests beyond the free slots wait, first come first served.

Callers block in `BatchScheduler.wait` and receive their text on their own thread, so a slow
`on_text` (a GUI bridge, an HTTP stream) never stalls the other sequences. A request made with
`direct` callbacks — quick ones: the engine worker's, which only write a frame to a pipe — has
them called on the scheduler's thread between steps instead; its caller's thread then wakes
once, at the end (a thread woken per token on a two-core machine stalls the decode threads).

Every sequence's sampling is timed. One whose tokens cost far more to sample than a decode
step (a grammar that refuses nearly everything the model wants to write, issue 36) sits out
steps while others decode, so that its sampling adds at most FAIR_SAMPLING_SHARE of the decode
time to theirs; it still gets its turns, and decodes at full speed when alone.

Speculative decoding runs while exactly one sequence is generating and nothing else is
prefilling or waiting: the step is then a verify batch of that sequence's last sample and its
draft (prompt lookup or a draft model) in its own slot, sampled position by position with its
own chain while the samples equal the draft; the rejected drafts' cells are removed from that
sequence alone. When another request comes, the next step is a plain batched one again (a
verify step would hold everyone's token for one sequence's guesses), and when the others are
done the remaining sequence speculates again. Each sequence counts its own drafts.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import llama_cpp
import numpy as np

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.grammar_sampling import GrammarLastSampler, shortlist_need
from hearthside.core.engine.logprobs import LogprobsCallback, TokenLogprob, logits_row
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.engine.speculative import (
    CountingDraft,
    SpeculationCounter,
    SpeculativeLlama,
    SpeculativeLlamaWithOverrides,
)
from hearthside.core.errors import EngineError

if TYPE_CHECKING:
    from hearthside.core.engine.engine import GenerationResult

log = logging.getLogger(__name__)

STEP_TARGET_S = 0.08  # a step this long keeps a cancel well inside 250 ms, even on a busy CPU
# The share of a step's decode time one sequence's sampling may add to everyone's step: a
# sequence that takes more (a grammar that refuses nearly every token) sits out steps until
# the others have had that much decode time without it (issue 36).
FAIR_SAMPLING_SHARE = 0.25
FIRST_PROMPT_CHUNK = 16  # prompt tokens in a step before any step is timed
MIN_PROMPT_CHUNK = 8
PENALTY_LAST_N = 64  # llama-cpp-python's last_n_tokens_size, so both paths penalise alike
_WAIT_POLL_S = 0.5
_DONE = object()

TextCallback = Callable[[str], None]


class _SlotContextMixin(llama_cpp.Llama):
    """A `Llama` whose context has `n_seq_max` sequences, each with its own KV cells.

    `Llama.__init__` has no parameter for either: it builds `llama_context_default_params()`,
    assigns them to `self.context_params`, sets the fields it knows and only then creates the
    context from them. Intercepting that one assignment (as tensor_overrides.py does for the
    model params) sets the two fields for this instance alone, before the context exists;
    wrapping `internals.LlamaContext` instead would patch a module shared by every `Llama`.
    """

    def __init__(self, *args: Any, n_seq_max: int, **kwargs: Any) -> None:
        self._n_seq_max = n_seq_max
        super().__init__(*args, **kwargs)

    @property
    def context_params(self) -> Any:
        return self._slot_context_params

    @context_params.setter
    def context_params(self, params: Any) -> None:
        params.n_seq_max = self._n_seq_max
        params.kv_unified = False
        self._slot_context_params = params


class ParallelLlama(_SlotContextMixin, SpeculativeLlama):
    """`SpeculativeLlama` with `n_seq_max` sequence slots."""


class ParallelLlamaWithOverrides(_SlotContextMixin, SpeculativeLlamaWithOverrides):
    """`ParallelLlama` whose model loads with tensor buffer-type overrides."""


class SamplerChain:
    """One sequence's llama.cpp sampler chain, built from its `SamplingParams`.

    The same samplers, in the same order, as llama-cpp-python's `Llama.generate` uses on the
    single-sequence path: penalties, then greedy (temperature 0) or top-k, top-p, min-p,
    temperature and a seeded draw; a grammar is consulted on the drawn token first
    (grammar_sampling.py). Owns `grammar` (a parsed grammar sampler) from here on.
    """

    def __init__(
        self, sampling: SamplingParams, n_vocab: int, grammar: llama_cpp.llama_sampler_p | None
    ) -> None:
        params = llama_cpp.llama_sampler_chain_default_params()
        params.no_perf = True
        self._chain: llama_cpp.llama_sampler_p | None = llama_cpp.llama_sampler_chain_init(params)
        self._grammar_last: GrammarLastSampler | None = None
        try:
            self._add(
                llama_cpp.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    sampling.repeat_penalty,
                    sampling.frequency_penalty,
                    sampling.presence_penalty,
                )
            )
            self._add_choice(sampling)
        except BaseException:
            if grammar is not None:
                llama_cpp.llama_sampler_free(grammar)
            self.close()
            raise
        # The grammar is asked about the drawn token first, not about every token (#34).
        if grammar is not None:
            chain, self._chain = self._chain, None
            assert chain is not None
            need = shortlist_need(
                sampling.temperature,
                sampling.top_k,
                sampling.repeat_penalty,
                sampling.frequency_penalty,
                sampling.presence_penalty,
            )
            self._grammar_last = GrammarLastSampler(chain, grammar, n_vocab, need=need)

    def _add_choice(self, sampling: SamplingParams) -> None:
        if sampling.temperature == 0:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        # Unseeded: llama.cpp draws a fresh random seed for this chain alone.
        seed = sampling.seed if sampling.seed is not None else llama_cpp.LLAMA_DEFAULT_SEED
        self._add(llama_cpp.llama_sampler_init_top_k(sampling.top_k))
        self._add(llama_cpp.llama_sampler_init_top_p(sampling.top_p, 1))
        self._add(llama_cpp.llama_sampler_init_min_p(sampling.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(sampling.temperature))
        self._add(llama_cpp.llama_sampler_init_dist(seed))

    def _add(self, sampler: llama_cpp.llama_sampler_p | None) -> None:
        if not sampler or self._chain is None:
            raise EngineError("llama.cpp could not set up sampling for this request.")
        llama_cpp.llama_sampler_chain_add(self._chain, sampler)  # the chain owns it now

    def sample(self, ctx: llama_cpp.llama_context_p, output_index: int) -> int:
        """Sample (and accept) a token from the logits at `output_index` of the last decode."""
        if self._grammar_last is not None:
            return self._grammar_last.sample(ctx, output_index)
        assert self._chain is not None
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, output_index))

    def close(self) -> None:
        chain, self._chain = self._chain, None
        if chain:
            llama_cpp.llama_sampler_free(chain)
        grammar_last, self._grammar_last = self._grammar_last, None
        if grammar_last is not None:
            grammar_last.close()


class SequenceRun(Protocol):
    """The bookkeeping of one generation (engine.py's `_GenerationRun`), driven token by token."""

    @property
    def wants_logprobs(self) -> bool:
        """Whether `feed` needs each token's logits."""

    def feed(self, token: int, logits: np.ndarray | None = None) -> bool:
        """Take the next sampled token (with its logits, for logprobs); False once the
        generation is over."""

    def stop(self, reason: str) -> None:
        """End the generation from outside (a cancel between steps)."""

    def outcome(self, speculative: SpeculationStats | None = None) -> GenerationResult:
        """The finished reply with its metrics (flushes held-back text first)."""


# (prompt tokens reused, emit text, emit logprob entries)
RunFactory = Callable[[int, TextCallback, LogprobsCallback], SequenceRun]


@dataclass(frozen=True)
class _LogprobEntries:
    """Logprob entries on their way to the caller's thread, between its text pieces."""

    entries: tuple[TokenLogprob, ...]


class BatchRequest:
    """One generation, waiting for a slot or running in one.

    `start(reused, emit, emit_logprobs)` makes its run once it has a slot: `reused` prompt
    tokens came from the slot's cache, and the emitters send text and logprob entries to the
    caller's thread, in the order they came.
    """

    def __init__(
        self,
        prompt: Sequence[int],
        sampler: SamplerChain,
        cancel: threading.Event,
        start: RunFactory,
        direct: tuple[TextCallback | None, LogprobsCallback | None] | None = None,
    ) -> None:
        self.prompt = list(prompt)
        self.sampler = sampler
        self.cancel = cancel
        self.start = start
        # Quick callbacks (the engine worker's pipe writes) called on the scheduler's thread,
        # between steps: no wake-up of the caller's thread per token.
        self.direct = direct
        self.direct_error: BaseException | None = None  # what a direct callback raised
        self.abandoned = False  # the caller left (its on_text raised)
        self.drafting: _Drafting | None = None  # set when speculation is on for it
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None
        self._pieces: queue.SimpleQueue[object] = queue.SimpleQueue()

    def stopping(self) -> bool:
        return self.cancel.is_set() or self.abandoned

    def emit(self, piece: str) -> None:
        if self.direct is None:
            self._pieces.put(piece)
        elif self.direct[0] is not None:
            self._call_direct(self.direct[0], piece)

    def emit_logprobs(self, entries: tuple[TokenLogprob, ...]) -> None:
        if self.direct is None:
            self._pieces.put(_LogprobEntries(entries))
        elif self.direct[1] is not None:
            self._call_direct(self.direct[1], entries)

    def _call_direct(self, callback: Callable[[Any], None], item: Any) -> None:
        if self.abandoned:
            return
        try:
            callback(item)
        except BaseException as exc:  # the caller's failure, raised on its thread by `wait`
            self.direct_error = exc
            self.abandoned = True  # the loop frees its slot at the next step

    def complete(self, result: GenerationResult) -> None:
        self.result = result
        self._close()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._close()

    def next_piece(self, timeout_s: float) -> object:
        return self._pieces.get(timeout=timeout_s)

    def live_speculation(self) -> SpeculationStats | None:
        drafting = self.drafting
        return drafting.live() if drafting is not None else None

    def _close(self) -> None:
        self.sampler.close()
        self._pieces.put(_DONE)


@dataclass(eq=False)
class _Drafting:
    """One sequence's speculation: the draft that guesses for it and what it achieved."""

    draft: CountingDraft
    counter: SpeculationCounter = field(default_factory=SpeculationCounter)

    def live(self) -> SpeculationStats:
        """The counts so far (the last draft not yet settled), for a status line."""
        return self.draft.stats_of(self.counter)

    def finish(self, final_ids: Sequence[int]) -> SpeculationStats:
        self.counter.finish(np.asarray(final_ids, dtype=np.intc))
        return self.draft.stats_of(self.counter)


@dataclass(eq=False)
class _Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # the tokens its KV cells hold, in order
    last_used: int = 0
    busy: bool = False
    forget: bool = False  # clear_cache() ran while it was busy: drop its cells when freed


@dataclass(eq=False)
class _Sequence:
    request: BatchRequest
    slot: _Slot
    run: SequenceRun
    pending: list[int]  # tokens still to evaluate: the prompt's rest, then the last sample
    decoding: bool = False  # the prompt is in the cache; one token per step from now on
    last_step: int = 0
    sampled: list[int] = field(default_factory=list)  # every token fed to `run`
    # Seconds its sampling took beyond its fair share of the steps (FAIR_SAMPLING_SHARE);
    # while above zero it sits out steps that others need.
    owed_s: float = 0.0


@dataclass(eq=False)
class _Planned:
    sequence: _Sequence
    count: int  # tokens of `pending` in this step
    output: int = -1  # batch index whose logits are sampled (-1: a prompt chunk, no sample)
    prompt: bool = False


class BatchScheduler:
    """Runs every generation on one llama.cpp context with `n_slots` sequences."""

    def __init__(
        self,
        ctx: llama_cpp.llama_context_p,
        *,
        n_slots: int,
        n_batch: int,
        n_vocab: int,
        step_target_s: float = STEP_TARGET_S,
        draft: CountingDraft | None = None,
    ) -> None:
        self._ctx = ctx
        self._n_vocab = n_vocab
        self._n_ctx_per_slot = int(llama_cpp.llama_n_ctx_seq(ctx))
        self._memory = llama_cpp.llama_get_memory(ctx)
        self._n_batch = n_batch
        self._step_target_s = step_target_s
        self._batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._batch_freed = False
        self._slots = [_Slot(seq_id) for seq_id in range(n_slots)]
        self._waiting: deque[BatchRequest] = deque()
        self._running: list[_Sequence] = []
        self._clears: list[threading.Event] = []
        self._wake = threading.Condition()
        self._closing = False
        self._uses = itertools.count(1)
        self._steps = itertools.count(1)
        self._prompt_chunk = FIRST_PROMPT_CHUNK  # prompt tokens a step may carry
        self._plain_step_s: float | None = None  # what a step without prompt tokens takes
        # Held while the loop uses the draft, so a draft being replaced is never in use.
        self._draft_lock = threading.Lock()
        self._draft = draft
        self._can_cut_cells = True  # False once llama.cpp refused to drop a sequence's tail
        self._local = threading.local()  # the request a caller's thread waits for
        self._last_drafted: BatchRequest | None = None
        self._thread = threading.Thread(target=self._loop, name="hearthside-batch", daemon=True)

    # ---- the callers' side -----------------------------------------------------------------

    def start(self) -> BatchScheduler:
        self._thread.start()
        return self

    def close(self) -> None:
        """Fail whatever is still queued or running, end the thread, free the batch."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
        if self._thread.is_alive():
            self._thread.join()
        else:
            self._shutdown()
        if not self._batch_freed:
            self._batch_freed = True
            llama_cpp.llama_batch_free(self._batch)

    @property
    def running(self) -> int:
        """Sequences in a slot now (approximate while requests come and go)."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests queued for a free slot (approximate)."""
        return len(self._waiting)

    def set_draft(self, draft: CountingDraft | None) -> None:
        """Speculate with `draft` from the next step on (None: off); the old one is out of use
        when this returns."""
        with self._draft_lock:
            self._draft = draft

    def live_speculation(self) -> SpeculationStats | None:
        """Drafted/accepted so far: on a caller's thread (inside `wait`), its own request's;
        elsewhere, the request that drafted last (None: speculation is off)."""
        request = getattr(self._local, "request", None) or self._last_drafted
        return request.live_speculation() if request is not None else None

    def submit(self, request: BatchRequest) -> None:
        """Queue `request` for a slot (refused once the scheduler is closing)."""
        with self._wake:
            if self._closing or not self._thread.is_alive():
                request.sampler.close()
                raise EngineError("The model is not loaded any more.", hint="Load it again.")
            self._waiting.append(request)
            self._wake.notify_all()

    def wait(
        self,
        request: BatchRequest,
        on_text: TextCallback | None,
        on_logprobs: LogprobsCallback | None = None,
    ) -> GenerationResult:
        """Block until the submitted `request` is done, calling `on_text` (and `on_logprobs`)
        on this thread."""
        self._local.request = request
        try:
            self._relay(request, on_text, on_logprobs)
            if request.direct_error is not None:
                raise request.direct_error
        except BaseException:
            request.abandoned = True  # the loop frees its slot at the next step
            with self._wake:
                self._wake.notify_all()
            raise
        finally:
            self._local.request = None
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    def _relay(
        self,
        request: BatchRequest,
        on_text: TextCallback | None,
        on_logprobs: LogprobsCallback | None,
    ) -> None:
        while True:
            try:
                item = request.next_piece(_WAIT_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive():
                    raise EngineError("The engine stopped while writing this reply.") from None
                continue
            if item is _DONE:
                return
            if isinstance(item, _LogprobEntries):
                if on_logprobs is not None:
                    on_logprobs(item.entries)
            elif on_text is not None:
                on_text(str(item))

    def clear_cache(self) -> None:
        """Forget every slot's cache (a busy slot's when its sequence ends)."""
        done = threading.Event()
        with self._wake:
            if self._closing or not self._thread.is_alive():
                return
            self._clears.append(done)
            self._wake.notify_all()
        done.wait()

    # ---- the loop ----------------------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while self._prepare_step():
                try:
                    self._step()
                except Exception as exc:  # one bad step must not end the others' service
                    log.exception("batch step failed")
                    for sequence in list(self._running):
                        self._end(sequence, _generation_error(exc))
        finally:
            self._shutdown()

    def _prepare_step(self) -> bool:
        """Wait for work; apply cache clears and admit queued requests. False: closing."""
        with self._wake:
            while not (self._closing or self._waiting or self._running or self._clears):
                self._wake.wait()
            if self._closing:
                return False
            self._apply_clears()
            self._admit()
            return True

    def _step(self) -> None:
        for sequence in list(self._running):
            if sequence.request.stopping():
                sequence.run.stop("cancelled")
                self._end(sequence)
        alone = self._speculation_candidate()
        if alone is not None and self._speculate(alone):
            return
        plan = self._plan_batch()
        if not plan:
            return
        started = time.perf_counter()
        status = llama_cpp.llama_decode(self._ctx, self._batch)
        if status != 0:
            self._fail_step(plan, status)
            return
        decode_s = time.perf_counter() - started
        self._note_step_speed(plan, decode_s)
        sampling_s = {}
        for planned in plan:
            # CPU time: on a busy machine a sampler that was merely descheduled owes nothing.
            sampling_started = time.thread_time()
            self._advance(planned)
            sampling_s[planned.sequence] = time.thread_time() - sampling_started
        self._settle_sampling_costs(sampling_s, decode_s)

    def _plan_batch(self) -> list[_Planned]:
        """Fill the batch: one token for each decoding sequence, then prompt chunks, the
        shortest remaining prompt first (a short question is not kept waiting for its first
        token behind a long document, and starts decoding beside it)."""
        step = next(self._steps)
        room = self._n_batch
        prefilling = sorted(
            (s for s in self._running if not s.decoding), key=lambda s: len(s.pending)
        )
        decoding = sorted(
            self._decoding_this_step(bool(prefilling)), key=lambda s: s.last_step
        )  # least recently stepped first, should n_batch be below the number of sequences
        plan = [_Planned(sequence, 1) for sequence in decoding[:room]]
        room -= len(plan)
        prompt_room = self._prompt_chunk
        for sequence in prefilling:
            take = min(len(sequence.pending), room, prompt_room)
            if take <= 0:
                break
            plan.append(_Planned(sequence, take, prompt=True))
            room -= take
            prompt_room -= take
        # llama.cpp splits a batch over separate KV streams into ubatches of consecutive
        # sequence ids (split_equal), so the batch goes in slot order.
        plan.sort(key=lambda planned: planned.sequence.slot.seq_id)
        self._write_batch(plan)
        for planned in plan:
            planned.sequence.last_step = step
        return plan

    def _decoding_this_step(self, others_prefill: bool) -> list[_Sequence]:
        """The decoding sequences in this step: those whose sampling owes the others time sit
        it out, unless nobody else would be served by that."""
        decoding = [s for s in self._running if s.decoding]
        paid_up = [s for s in decoding if s.owed_s <= 0]
        return paid_up if paid_up or others_prefill else decoding

    def _settle_sampling_costs(self, sampling_s: dict[_Sequence, float], decode_s: float) -> None:
        """Charge each sequence what its sampling took and credit every one its share of the
        step (issue 36: a grammar that makes a token cost ten decode steps must not make
        every reply batched beside it ten times slower). A sequence that owes sits out steps
        until its credit has paid for it; its debt never exceeds its last token's cost, so it
        is never held back longer than about that cost over the share."""
        owing = sum(1 for s in self._running if s.owed_s > 0) or 1
        credit_s = FAIR_SAMPLING_SHARE * decode_s / owing
        for sequence in self._running:
            took_s = sampling_s.get(sequence, 0.0)
            owed_s = sequence.owed_s + took_s - credit_s
            sequence.owed_s = max(0.0, min(owed_s, max(took_s, sequence.owed_s)))

    def _write_batch(self, plan: list[_Planned]) -> None:
        batch = self._batch
        index = 0
        for planned in plan:
            sequence = planned.sequence
            start = len(sequence.slot.cached)
            for offset, token in enumerate(sequence.pending[: planned.count]):
                batch.token[index] = token
                batch.pos[index] = start + offset
                batch.n_seq_id[index] = 1
                batch.seq_id[index][0] = sequence.slot.seq_id
                batch.logits[index] = False
                index += 1
            if planned.count == len(sequence.pending):
                batch.logits[index - 1] = True
                planned.output = index - 1
        batch.n_tokens = index

    def _note_step_speed(self, plan: list[_Planned], elapsed_s: float) -> None:
        """Learn what a step without prompt tokens costs, and size the next prompt chunk by
        what this one added to its step (`next_prompt_chunk`)."""
        if elapsed_s <= 0:
            return
        prompt_tokens = sum(planned.count for planned in plan if planned.prompt)
        if prompt_tokens == 0:
            self._plain_step_s = _averaged(self._plain_step_s, elapsed_s)
            return
        self._prompt_chunk = next_prompt_chunk(
            self._prompt_chunk,
            prompt_tokens,
            added_s=elapsed_s - (self._plain_step_s or 0.0),
            allowed_s=max(self._step_target_s, self._plain_step_s or 0.0),
            n_batch=self._n_batch,
        )

    def _advance(self, planned: _Planned) -> None:
        sequence = planned.sequence
        sequence.slot.cached.extend(sequence.pending[: planned.count])
        del sequence.pending[: planned.count]
        if planned.output < 0:
            return
        sampled = self._sample(sequence, planned.output)
        if sampled is None:
            return
        token, going_on = sampled
        if going_on:
            sequence.pending = [token]
            sequence.decoding = True
        else:
            self._end(sequence)

    def _sample(self, sequence: _Sequence, output: int) -> tuple[int, bool] | None:
        """Sample (and accept) the sequence's next token from the logits at batch index
        `output` and feed it to its run: (token, going on), or None when that failed and the
        sequence has ended."""
        try:
            token = sequence.request.sampler.sample(self._ctx, output)
            logits = None
            if sequence.run.wants_logprobs:
                logits = logits_row(self._ctx, output, self._n_vocab)
            going_on = sequence.run.feed(token, logits)
        except Exception as exc:
            log.exception("sampling a sequence failed")
            self._end(sequence, _generation_error(exc))
            return None
        sequence.sampled.append(token)
        return token, going_on

    # ---- speculation (one sequence generating alone) -------------------------------------

    def _speculation_candidate(self) -> _Sequence | None:
        """The sequence to speculate for: the only one in a slot, decoding, none waiting."""
        if self._draft is None or not self._can_cut_cells or len(self._running) != 1:
            return None
        sequence = self._running[0]
        if not sequence.decoding or self._waiting:
            return None
        return sequence

    def _speculate(self, sequence: _Sequence) -> bool:
        """One verify step for `sequence`: its last sample and a draft in one decode. False
        when there is nothing to verify (the draft found nothing): a plain step follows."""
        guesses = self._draft_for(sequence)
        if not guesses:
            return False
        tokens = [*sequence.pending, *guesses]
        self._write_verify_batch(sequence, tokens)
        status = llama_cpp.llama_decode(self._ctx, self._batch)
        if status != 0:
            self._fail_step([_Planned(sequence, len(tokens))], status)
            return True
        self._accept_drafts(sequence, tokens)
        return True

    def _draft_for(self, sequence: _Sequence) -> list[int]:
        with self._draft_lock:
            draft = self._draft
            if draft is None:
                return []
            request = sequence.request
            if request.drafting is None or request.drafting.draft is not draft:
                request.drafting = _Drafting(draft)  # a draft set while it ran counts anew
            history = np.array([*sequence.slot.cached, *sequence.pending], dtype=np.intc)
            room = self._n_ctx_per_slot - len(history)  # cells after the last sample's
            guesses = draft.draft_for(history, request.drafting.counter, room)
            self._last_drafted = request
            return [int(token) for token in guesses[: self._n_batch - 1]]

    def _write_verify_batch(self, sequence: _Sequence, tokens: list[int]) -> None:
        """The last sample and its drafts at the slot's next positions, logits at each."""
        batch = self._batch
        start = len(sequence.slot.cached)
        for index, token in enumerate(tokens):
            batch.token[index] = token
            batch.pos[index] = start + index
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence.slot.seq_id
            batch.logits[index] = True
        batch.n_tokens = len(tokens)

    def _accept_drafts(self, sequence: _Sequence, tokens: list[int]) -> None:
        """Sample at each position while the samples equal the drafts: every emitted token is
        the target's own sample, so greedy replies are the plain ones. The cells of the
        rejected drafts go, from this sequence only."""
        slot = sequence.slot
        evaluated_to = len(slot.cached) + len(tokens)
        slot.cached.append(tokens[0])
        sequence.pending = []
        for index in range(len(tokens)):
            sampled = self._sample(sequence, index)
            if sampled is None:
                return  # ended with an error: its slot was cleared
            token, going_on = sampled
            guessed = index + 1 < len(tokens) and token == tokens[index + 1]
            if not (going_on and guessed):
                break
            slot.cached.append(token)  # its cells hold the right context: keep them
        self._drop_rejected(sequence, evaluated_to)
        if going_on:
            sequence.pending.append(token)
        else:
            self._end(sequence)

    def _drop_rejected(self, sequence: _Sequence, evaluated_to: int) -> None:
        slot = sequence.slot
        kept = len(slot.cached)
        if kept >= evaluated_to or llama_cpp.llama_memory_seq_rm(
            self._memory, slot.seq_id, kept, -1
        ):
            return
        # A cache that cannot drop a tail (a recurrent model's): evaluate the sequence again
        # from nothing, and speculate no more on this context.
        log.warning("llama.cpp cannot remove rejected drafts from this cache; speculation off")
        self._can_cut_cells = False
        sequence.pending = list(slot.cached)
        sequence.decoding = False
        self._clear_slot(slot)

    def _fail_step(self, plan: list[_Planned], status: int) -> None:
        """llama_decode refused the batch: the sequences in it fail, their slots start empty."""
        error = EngineError(
            f"llama.cpp failed while generating the reply (llama_decode returned {status}).",
            hint="Try again; if it keeps failing, reload the model with a smaller context.",
        )
        for planned in plan:
            planned.sequence.slot.forget = True
            self._end(planned.sequence, error)

    def _end(self, sequence: _Sequence, error: BaseException | None = None) -> None:
        """Free the sequence's slot at once and hand its result (or error) to its caller."""
        if sequence in self._running:
            self._running.remove(sequence)
        slot = sequence.slot
        slot.busy = False
        slot.last_used = next(self._uses)
        if slot.forget or error is not None:
            self._clear_slot(slot)
        if error is not None:
            sequence.request.fail(error)
            return
        try:
            sequence.request.complete(sequence.run.outcome(self._speculation_of(sequence)))
        except Exception as exc:
            sequence.request.fail(_generation_error(exc))

    def _speculation_of(self, sequence: _Sequence) -> SpeculationStats | None:
        drafting = sequence.request.drafting
        if drafting is None:
            return None
        return drafting.finish([*sequence.request.prompt, *sequence.sampled])

    # ---- slots ----------------------------------------------------------------------------

    def _admit(self) -> None:
        """Start queued requests in free slots, oldest first (call with the lock held)."""
        for request in [r for r in self._waiting if r.stopping()]:
            self._waiting.remove(request)
            self._cancel_unadmitted(request)
        while self._waiting:
            slot, shared = self._free_slot_for(self._waiting[0].prompt)
            if slot is None:
                return
            self._start(self._waiting.popleft(), slot, shared)

    def _free_slot_for(self, prompt: list[int]) -> tuple[_Slot | None, int]:
        """The free slot for `prompt` and how many of its cached tokens the prompt shares."""
        free = [slot for slot in self._slots if not slot.busy]
        if not free:
            return None, 0
        shared = {slot.seq_id: _shared_prefix(slot.cached, prompt) for slot in free}
        serving = [s for s in free if _serves(len(s.cached), shared[s.seq_id], len(prompt))]
        if serving:
            best = max(serving, key=lambda slot: (shared[slot.seq_id], -slot.last_used))
        else:
            best = min(free, key=lambda slot: (bool(slot.cached), slot.last_used))
        return best, shared[best.seq_id]

    def _start(self, request: BatchRequest, slot: _Slot, shared: int) -> None:
        if shared < len(slot.cached) and not llama_cpp.llama_memory_seq_rm(
            self._memory, slot.seq_id, shared, -1
        ):
            self._clear_slot(slot)  # this cache cannot be cut back: evaluate everything
            shared = 0
        del slot.cached[shared:]
        slot.busy = True
        slot.last_used = next(self._uses)
        draft = self._draft
        if draft is not None:  # counted from the start, even while it has company
            request.drafting = _Drafting(draft)
        try:
            run = request.start(shared, request.emit, request.emit_logprobs)
        except Exception as exc:
            slot.busy = False
            request.fail(_generation_error(exc))
            return
        self._running.append(_Sequence(request, slot, run, pending=request.prompt[shared:]))

    def _cancel_unadmitted(self, request: BatchRequest) -> None:
        try:
            # nothing was evaluated
            run = request.start(len(request.prompt), request.emit, request.emit_logprobs)
            run.stop("cancelled")
            request.complete(run.outcome())
        except Exception as exc:
            request.fail(_generation_error(exc))

    def _clear_slot(self, slot: _Slot) -> None:
        llama_cpp.llama_memory_seq_rm(self._memory, slot.seq_id, -1, -1)
        slot.cached.clear()
        slot.forget = False

    def _apply_clears(self) -> None:
        if not self._clears:
            return
        for slot in self._slots:
            if slot.busy:
                slot.forget = True
            else:
                self._clear_slot(slot)
        for done in self._clears:
            done.set()
        self._clears.clear()

    def _shutdown(self) -> None:
        with self._wake:
            self._closing = True
            waiting, self._waiting = list(self._waiting), deque()
            clears, self._clears = self._clears, []
        unloaded = EngineError(
            "The model was unloaded before this reply was finished.", hint="Load it again."
        )
        for sequence in list(self._running):
            self._end(sequence, unloaded)
        for request in waiting:
            request.fail(unloaded)
        for done in clears:
            done.set()


def next_prompt_chunk(
    chunk: int, prompt_tokens: int, *, added_s: float, allowed_s: float, n_batch: int
) -> int:
    """The prompt tokens the next step may carry, after a step whose `prompt_tokens` added
    `added_s` to what a step without them takes. `allowed_s` is the step target, or one plain
    step where that takes longer: a decoding neighbour then waits about twice its usual step
    for its token, three times at worst, and a cancel lands within a few steps.

    The chunk doubles while it adds no more than that, and halves once it adds twice as much:
    a bigger chunk costs less per token (a step's fixed cost is shared), so its size is found
    by trying, not computed from a rate, and one slow step only halves it. It was once sized
    from prompt tokens over the *whole* step's time: a step's fixed cost (the decode tokens
    beside the prompt, and whatever a busy machine adds to every step) read as slow prefill,
    the next chunk was smaller, small chunks cost more per token, and on a loaded machine the
    chunks fell to the minimum for good. Four requests that arrived together then got their
    first tokens over 12-25 steps of 8 tokens, 15-30 s on a busy machine (issue 31's stall;
    llama-server starts all four in one step)."""
    if added_s > 2 * allowed_s:
        return max(MIN_PROMPT_CHUNK, chunk // 2)
    if prompt_tokens >= chunk and added_s <= allowed_s:
        return min(n_batch, 2 * chunk)
    return chunk


def _averaged(previous: float | None, latest: float) -> float:
    return latest if previous is None else (previous + latest) / 2


def _shared_prefix(cached: list[int], prompt: list[int]) -> int:
    """Tokens at the start of `prompt` that `cached` holds, leaving at least the last prompt
    token to evaluate (its logits are what the first sample reads)."""
    limit = min(len(cached), len(prompt) - 1)
    shared = 0
    while shared < limit and cached[shared] == prompt[shared]:
        shared += 1
    return shared


def _serves(n_cached: int, shared: int, n_prompt: int) -> bool:
    """Whether a slot holding `n_cached` tokens, `shared` of them this prompt's start, is
    the place for it: the prompt continues what it holds (turn N keeps all of it; at least
    half, say), or it holds the whole prompt (a reply asked for again). Every chat shares
    its template's system prompt, and that alone must not send a new chat into a slot that
    holds another conversation, evicting it, while an empty slot waits."""
    return shared > 0 and (2 * shared >= n_cached or shared >= n_prompt - 1)


def _generation_error(exc: BaseException) -> BaseException:
    if isinstance(exc, EngineError):
        return exc
    error = EngineError(
        "llama.cpp failed while generating the reply.",
        hint="Try again; if it keeps failing, reload the model with a smaller context.",
    )
    error.__cause__ = exc
    return error


__all__ = [
    "BatchRequest",
    "BatchScheduler",
    "ParallelLlama",
    "ParallelLlamaWithOverrides",
    "SamplerChain",
    "SequenceRun",
]
