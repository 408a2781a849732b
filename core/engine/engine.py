"""`Engine`: one loaded model in llama.cpp, streaming chat replies with metrics.

With `n_parallel` 1, only `EngineService`'s worker thread calls an Engine (see service.py);
it generates on the calling thread with llama-cpp-python's `Llama.generate`. With more slots,
any number of threads may call `generate`/`chat` at once: a `BatchScheduler` (batch.py)
decodes their sequences together, and speculates while only one of them is generating.
Either way the engine keeps the KV cache of earlier generations, so the next turn of the same
conversation evaluates only the tokens it adds.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import LlamaGrammar

from hearthside.core.engine import native_log
from hearthside.core.engine.batch import (
    BatchRequest,
    BatchScheduler,
    ParallelLlama,
    ParallelLlamaWithOverrides,
    SamplerChain,
)
from hearthside.core.engine.config import EngineConfig, SamplingParams, SpeculativeConfig
from hearthside.core.engine.grammar_limits import GrammarError, check_grammar_bounds
from hearthside.core.engine.load_report import parse_load_log
from hearthside.core.engine.logprobs import (
    LogprobLedger,
    LogprobsCallback,
    TokenLogprob,
    display_piece,
    logits_row,
    token_logprob,
)
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.engine.speculative import (
    CountingDraft,
    SpeculationStats,
    SpeculativeLlama,
    SpeculativeLlamaWithOverrides,
    make_draft,
)
from hearthside.core.engine.stops import StopMatcher
from hearthside.core.engine.template_free_llama import chat_template_for
from hearthside.core.engine.templates import ChatTemplate
from hearthside.core.engine.tensor_overrides import native_overrides
from hearthside.core.engine.thread_governor import ThreadGovernor
from hearthside.core.errors import (
    ContextOverflowError,
    EngineError,
    EngineLoadError,
    EngineOutOfMemoryError,
)
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.vocab import require_compatible_draft

MIN_ENGINE_VERSION = (0, 3, 36)
TextCallback = Callable[[str], None]
LogitsOf = Callable[[int], np.ndarray]  # the logits that produced the Nth sampled token


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str

    def as_template_input(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class GenerationResult:
    text: str
    metrics: GenerationMetrics
    tokens: tuple[int, ...] = ()  # every token the model sampled, a final end token included
    # With SamplingParams.logprobs set: one entry per token of `text`, in order; else None
    logprobs: tuple[TokenLogprob, ...] | None = None


def engine_version() -> tuple[int, ...]:
    return tuple(int(part) for part in llama_cpp.__version__.split(".")[:3] if part.isdigit())


def check_engine_version() -> None:
    """Refuse an engine older than the one whose GGUF parser fixes we rely on."""
    if engine_version() < MIN_ENGINE_VERSION:
        wanted = ".".join(map(str, MIN_ENGINE_VERSION))
        raise EngineLoadError(
            f"The installed llama-cpp-python {llama_cpp.__version__} is older than {wanted}.",
            hint="Run the setup command from the README again to update it.",
        )


class _AbortSwitch:
    """Lets a cancel event interrupt llama_decode mid-batch (a long prompt takes seconds).

    Armed only while a prompt is evaluated: ggml calls the callback once per graph node, and
    a Python callback per node would cost decode speed.
    """

    def __init__(self, ctx: Any) -> None:
        self._ctx = ctx
        self._event: threading.Event | None = None
        self._callback = llama_cpp.ggml_abort_callback(self._should_abort)
        self._null = llama_cpp.ggml_abort_callback()

    def _should_abort(self, _data: Any) -> bool:
        return self._event is not None and self._event.is_set()

    def arm(self, event: threading.Event) -> None:
        self._event = event
        llama_cpp.llama_set_abort_callback(self._ctx, self._callback, None)

    def disarm(self) -> None:
        llama_cpp.llama_set_abort_callback(self._ctx, self._null, None)
        self._event = None


class Engine:
    """A model loaded with an `EngineConfig`."""

    def __init__(
        self, config: EngineConfig, *, verbose: bool = False, quick_callbacks: bool = False
    ) -> None:
        """`quick_callbacks`: every `on_text`/`on_logprobs` given to this engine returns at
        once and may run on the batch scheduler's thread (the engine worker's pipe writes)."""
        check_engine_version()
        self.config = config
        self._quick_callbacks = quick_callbacks
        self.model_path = Path(config.model_path)
        self.model_info = validate_gguf(self.model_path)
        with native_log.captured_lines() as log_lines:
            self._llama = _load_llama(config, verbose=verbose)
        self.load_report = parse_load_log(log_lines)
        self._vocab = llama_cpp.llama_model_get_vocab(self._llama.model)
        self._abort = _AbortSwitch(self._llama.ctx)
        # a reply's decode threads make way for other programs' busy cores (not the tuner's
        # timed runs, `time_prefill`/`time_decode`: those measure the threads they were given)
        self.threads = ThreadGovernor(
            config.decode_threads, config.batch_threads, self._set_threads
        )
        self.chat_template = self._make_chat_template()
        self._draft: CountingDraft | None = None
        self._scheduler: BatchScheduler | None = None
        # Callers between their first native call and handing the request to the scheduler
        # (tokenizing, building samplers): close() waits for them before freeing the model.
        self._admitting = 0
        self._admission = threading.Condition()
        self._closed = False
        try:
            self.set_speculative(config.speculative)
            if config.n_parallel > 1:
                self._scheduler = BatchScheduler(
                    self._llama.ctx,
                    n_slots=config.n_parallel,
                    n_batch=int(llama_cpp.llama_n_batch(self._llama.ctx)),
                    n_vocab=self.n_vocab,
                    draft=self._draft,
                ).start()
        except BaseException:
            self._llama.close()
            raise

    @property
    def llama(self) -> SpeculativeLlama:
        """The underlying Llama, for diagnostics and benchmarks run as engine jobs.

        Only with `n_parallel` 1: with more slots the batch scheduler's thread owns the
        context, and the benchmarks' raw evaluations (on sequence 0, resetting the whole
        cache) would corrupt the replies it is writing.
        """
        self._require_single_sequence("Raw llama.cpp access (benchmarks, capacity audits)")
        return self._llama

    @property
    def n_ctx(self) -> int:
        """Tokens one conversation may use: with several slots, one slot's share."""
        if self.config.n_parallel > 1:
            return int(llama_cpp.llama_n_ctx_seq(self._llama.ctx))
        return int(self._llama.n_ctx())

    @property
    def n_parallel(self) -> int:
        return self.config.n_parallel

    @property
    def n_vocab(self) -> int:
        return int(self._llama.n_vocab())

    @property
    def draft(self) -> CountingDraft | None:
        """The speculative draft in use (None when speculation is off)."""
        return self._draft

    def set_speculative(self, speculative: SpeculativeConfig) -> None:
        """Switch speculative decoding without reloading the model (a draft model loads).

        With several slots the drafts are used while one request is generating alone."""
        if speculative.mode == "draft_model" and speculative.draft_model_path:
            require_compatible_draft(self.model_path, Path(speculative.draft_model_path))
        draft = make_draft(speculative, self.config)
        old, self._draft = self._draft, draft
        self._attach(draft)
        self.config = self.config.with_changes(speculative=speculative)
        if old is not None:
            old.close()

    @contextlib.contextmanager
    def speculation_paused(self) -> Iterator[None]:
        """Generate without the draft for a while, keeping it (and a draft model's cache)."""
        draft, self._draft = self._draft, None
        self._attach(None)
        try:
            yield
        finally:
            self._draft = draft
            self._attach(draft)

    def _attach(self, draft: CountingDraft | None) -> None:
        self._llama.attach_draft(draft)
        if self._scheduler is not None:
            self._scheduler.set_draft(draft)  # returns once the old draft is out of use

    def live_speculation(self) -> SpeculationStats | None:
        """Drafted/accepted so far in the running generation (read from another thread; with
        several slots, on a thread inside `generate`, that generation's own)."""
        if self._scheduler is not None:
            return self._scheduler.live_speculation() if self._draft is not None else None
        return self._draft.live_stats() if self._draft is not None else None

    def close(self) -> None:
        if self._scheduler is not None:
            with self._admission:
                self._closed = True
                self._admission.wait_for(lambda: self._admitting == 0)
            self._scheduler.close()
            self._scheduler = None
        if self._draft is not None:
            self._draft.close()
            self._draft = None
        self._llama.close()

    def clear_cache(self) -> None:
        """Forget the KV cache, so the next generation evaluates its whole prompt."""
        if self._scheduler is not None:
            self._scheduler.clear_cache()
            return
        self._llama.reset()

    def _require_single_sequence(self, what: str) -> None:
        if self.config.n_parallel > 1:
            raise EngineError(
                f"{what} needs the model loaded with n_parallel 1; it is loaded with "
                f"{self.config.n_parallel} parallel slots.",
                hint="Load the model again with n_parallel 1 for this.",
            )

    # ---- prompts ---------------------------------------------------------------------------

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        return self.chat_template.render([m.as_template_input() for m in messages])

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        """Tokens for `text`; special tokens written in it (e.g. `<start_of_turn>`) count."""
        return list(self._llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def tokenize_prompt(self, prompt: str) -> list[int]:
        """Tokens for a rendered chat prompt, adding BOS only when the template did not."""
        bos_text = self.chat_template.bos_token
        wants_bos = self._llama._model.add_bos_token()
        add_bos = wants_bos and not (bos_text and prompt.startswith(bos_text))
        return self.tokenize(prompt, add_bos=add_bos)

    def token_text(self, token: int) -> bytes:
        """The bytes one token stands for (control tokens give b"")."""
        buffer = ctypes.create_string_buffer(64)
        length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
        if length < 0:  # the piece is longer than the buffer: -length is the size needed
            buffer = ctypes.create_string_buffer(-length)
            length = llama_cpp.llama_token_to_piece(self._vocab, token, buffer, -length, 0, False)
        return buffer.raw[:length]

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))

    def display_piece(self, token: int) -> bytes:
        """A token's bytes with control tokens written out (for top-logprob alternatives)."""
        return display_piece(self._vocab, token)

    # ---- generation ------------------------------------------------------------------------

    def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        on_logprobs: LogprobsCallback | None = None,
    ) -> GenerationResult:
        """Stream the assistant's reply to `messages`; `on_text` gets each new piece of text.

        With `sampling.logprobs` set, `on_logprobs` gets the entries of the tokens whose text
        is now shown, just before the piece that completes them (and once more at the end).
        """
        started = time.perf_counter()
        with self._admitted():
            prompt_tokens = self.tokenize_prompt(self.render_chat(messages))
        format_stops = self.chat_template.stop_sequences
        if format_stops:
            sampling = dataclasses.replace(sampling, stop=sampling.stop + format_stops)
        return self.generate(
            prompt_tokens,
            sampling,
            on_text=on_text,
            cancel=cancel,
            started=started,
            reply=True,
            on_logprobs=on_logprobs,
        )

    def generate(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        started: float | None = None,
        reply: bool = False,
        on_logprobs: LogprobsCallback | None = None,
    ) -> GenerationResult:
        """Continue `prompt_tokens`, reusing whatever prefix of them the KV cache holds.

        A `reply` (a chat answer) starts at its first visible character; a raw continuation
        keeps its leading space. With several slots this blocks until the reply is done,
        while other threads' replies are decoded in the same batches.
        """
        started = time.perf_counter() if started is None else started
        self._check_prompt_fits(len(prompt_tokens), sampling)
        cancel = cancel or threading.Event()
        if self.config.n_parallel > 1:
            return self._generate_in_batch(
                prompt_tokens, sampling, (on_text, on_logprobs), cancel, started, reply
            )
        reused = self._reuse_cached_prefix(prompt_tokens)
        run = _GenerationRun(
            self,
            sampling,
            started,
            len(prompt_tokens),
            reused,
            reply,
            on_text=on_text,
            cancel=cancel,
            on_first_token=self.prompt_evaluated,
            on_logprobs=on_logprobs,
        )
        if self._draft is not None:
            self._draft.begin_generation()
        logits_of = partial(self._sampled_logits, len(prompt_tokens))
        with self._armed_abort(cancel):
            run.stream(self._token_stream(prompt_tokens, sampling), logits_of)
        return run.outcome(self._settle_draft(prompt_tokens, run))

    def _generate_in_batch(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        callbacks: tuple[TextCallback | None, LogprobsCallback | None],
        cancel: threading.Event,
        started: float,
        reply: bool,
    ) -> GenerationResult:
        n_prompt = len(prompt_tokens)

        def start(
            reused: int, emit: TextCallback, emit_logprobs: LogprobsCallback
        ) -> _GenerationRun:
            return _GenerationRun(
                self,
                sampling,
                started,
                n_prompt,
                reused,
                reply,
                on_text=emit,
                cancel=cancel,
                on_logprobs=emit_logprobs,
            )

        with self._admitted():
            scheduler = self._scheduler
            assert scheduler is not None  # set until close(), which waits for admissions
            grammar = self._grammar_sampler(sampling.grammar) if sampling.grammar else None
            sampler = SamplerChain(sampling, self.n_vocab, grammar)
            direct = callbacks if self._quick_callbacks else None
            request = BatchRequest(prompt_tokens, sampler, cancel, start, direct)
            scheduler.submit(request)
        return scheduler.wait(request, *callbacks)

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Native calls on a caller's thread (several slots only): never on a closed model."""
        if self.config.n_parallel == 1:
            yield
            return
        with self._admission:
            if self._closed:
                raise EngineError("The model is not loaded any more.", hint="Load it again.")
            self._admitting += 1
        try:
            yield
        finally:
            with self._admission:
                self._admitting -= 1
                self._admission.notify_all()

    def _settle_draft(
        self, prompt_tokens: Sequence[int], run: _GenerationRun
    ) -> SpeculationStats | None:
        if self._draft is None:
            return None
        produced = np.array([*prompt_tokens, *run.sampled], dtype=np.intc)
        return self._draft.finish_generation(produced)

    def _sampled_logits(self, n_prompt: int, index: int) -> np.ndarray:
        """The logits that produced the `index`-th sampled token on the single-sequence path,
        read while `Llama.generate` has just yielded it: it sampled position
        n_prompt - 1 + index from the outputs of its last evaluation, which end at
        `n_tokens` (one output without a draft, the last few with one)."""
        position = n_prompt - 1 + index
        return logits_row(self._llama.ctx, position - self._llama.n_tokens, self.n_vocab)

    def _check_prompt_fits(self, n_prompt: int, sampling: SamplingParams) -> None:
        if n_prompt == 0:
            raise EngineError("The prompt is empty.")
        wanted = sampling.max_tokens or 0
        if wanted and n_prompt + wanted > self.n_ctx:
            raise ContextOverflowError(
                f"The prompt is {n_prompt} tokens and {wanted} more were asked for, but this "
                f"model is loaded with a context of {self.n_ctx} tokens.",
                hint="Ask for fewer tokens, shorten the conversation, or load the model with a "
                "larger context.",
                context_tokens=self.n_ctx,
                prompt_tokens=n_prompt,
                completion_tokens=wanted,
            )
        if n_prompt >= self.n_ctx:
            raise ContextOverflowError(
                f"The conversation is {n_prompt} tokens long, but this model is loaded with a "
                f"context of {self.n_ctx} tokens.",
                hint="Start a new chat, shorten the message, or load the model with a larger "
                "context.",
                context_tokens=self.n_ctx,
                prompt_tokens=n_prompt,
            )

    def _reuse_cached_prefix(self, prompt_tokens: Sequence[int]) -> int:
        """Drop the cache past the longest prefix shared with `prompt_tokens`; keep the rest.

        At least the last prompt token is always evaluated, so there are logits to sample from.
        """
        llama = self._llama
        cached = llama.input_ids[: llama.n_tokens]
        shared = 0
        limit = min(len(cached), len(prompt_tokens) - 1)
        while shared < limit and cached[shared] == prompt_tokens[shared]:
            shared += 1
        memory = llama_cpp.llama_get_memory(llama.ctx)
        if shared == 0 or not llama_cpp.llama_memory_seq_rm(memory, 0, shared, -1):
            llama.reset()
            return 0
        llama.n_tokens = shared
        return shared

    def _token_stream(
        self, prompt_tokens: Sequence[int], sampling: SamplingParams
    ) -> Iterator[int]:
        # Every generation sets its seed: llama-cpp-python keeps the last one set, so without
        # this one seeded request would make every later unseeded reply repeat it.
        unseeded = llama_cpp.LLAMA_DEFAULT_SEED  # llama.cpp draws a fresh random seed
        self._llama.set_seed(sampling.seed if sampling.seed is not None else unseeded)
        return self.threads.governed(
            self._llama.generate(
                list(prompt_tokens),
                temp=sampling.temperature,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                min_p=sampling.min_p,
                repeat_penalty=sampling.repeat_penalty,
                presence_penalty=sampling.presence_penalty,
                frequency_penalty=sampling.frequency_penalty,
                grammar=self._checked_grammar(sampling.grammar),
                reset=True,
            )
        )

    def _set_threads(self, decode_threads: int, batch_threads: int) -> None:
        llama_cpp.llama_set_n_threads(self._llama.ctx, decode_threads, batch_threads)

    def _checked_grammar(self, gbnf: str | None) -> LlamaGrammar | None:
        """A grammar llama.cpp has parsed once: llama-cpp-python would add a failed (NULL)
        grammar sampler to its chain and crash the process on the first token.

        llama.cpp's parser recurses once per nested group and per leading rule reference, so
        a grammar of unbounded depth overflows this thread's stack and kills the process
        (SIGSEGV). `check_grammar_bounds` runs first and keeps every grammar far below the
        depths measured to crash (grammar_limits.py), so parsing it here is safe.
        """
        if gbnf is None:
            return None
        llama_cpp.llama_sampler_free(self._grammar_sampler(gbnf))  # the probe
        return LlamaGrammar.from_string(gbnf, verbose=False)

    def _grammar_sampler(self, gbnf: str) -> llama_cpp.llama_sampler_p:
        """llama.cpp's grammar sampler for `gbnf`, after the bounds check; the caller owns it.
        A grammar llama.cpp refuses is a `GrammarError`, never a NULL sampler."""
        check_grammar_bounds(gbnf)
        try:
            native = gbnf.encode()
        except UnicodeEncodeError:
            raise GrammarError(
                "The grammar for the requested output format is not valid Unicode."
            ) from None
        sampler = llama_cpp.llama_sampler_init_grammar(self._vocab, native, b"root")
        if not sampler:
            raise GrammarError(
                "The requested output format could not be turned into a grammar: llama.cpp "
                "refused it (for example a `$ref` that leads back to itself before any text, "
                "which is left recursion, or a `pattern` it cannot read).",
                hint="Fix or simplify the JSON schema (or tool parameters) and try again.",
            )
        return sampler

    @contextlib.contextmanager
    def _armed_abort(self, cancel: threading.Event) -> Iterator[None]:
        self._abort.arm(cancel)
        try:
            yield
        finally:
            self._abort.disarm()

    def prompt_evaluated(self) -> None:
        """Called once the prompt is in the cache: stop paying for the abort callback."""
        self._abort.disarm()

    # ---- raw measurements (for `hearthside bench`) ---------------------------------------

    def time_prefill(self, tokens: Sequence[int]) -> float:
        """Seconds to evaluate `tokens` into an empty cache (n_parallel 1 only)."""
        self._require_single_sequence("Benchmarking")
        self.threads.restore()  # a benchmark measures the threads it was loaded with
        self._llama.reset()
        start = time.perf_counter()
        self._llama.eval(list(tokens))
        return time.perf_counter() - start

    def time_decode(self, tokens: Sequence[int]) -> float:
        """Seconds to evaluate `tokens` one at a time after a single start token (n_parallel 1
        only)."""
        self._require_single_sequence("Benchmarking")
        self.threads.restore()
        self._llama.reset()
        self._llama.eval(list(tokens[:1]))
        start = time.perf_counter()
        for token in tokens[1:]:
            self._llama.eval([token])
        return time.perf_counter() - start

    def _make_chat_template(self) -> ChatTemplate:
        return chat_template_for(self._llama, self.model_info.chat_template)


class _GenerationRun:
    """The bookkeeping of one generation: text assembly, stops, limits and timings.

    Push style: `feed` takes each sampled token and says whether to go on, so the
    single-sequence pull loop (`stream`) and the batch scheduler (batch.py) both drive it.
    """

    def __init__(
        self,
        engine: Engine,
        sampling: SamplingParams,
        started: float,
        n_prompt: int,
        reused: int,
        trim_start: bool,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        on_first_token: Callable[[], None] | None = None,
        on_logprobs: LogprobsCallback | None = None,
    ) -> None:
        self.engine = engine
        self.trim_start = trim_start
        self.sampling = sampling
        self.started = started
        self.n_prompt = n_prompt
        self.reused = reused
        self.cancel = cancel or threading.Event()
        self.prefill_started = time.perf_counter()
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.completion_tokens = 0
        self.sampled: list[int] = []  # every token the model sampled, the final EOS included
        self.stop_reason = "eos"
        self._on_text = on_text
        self._on_first_token = on_first_token
        self._max_tokens = sampling.max_tokens or sampling.default_max_tokens
        self._n_ctx = engine.n_ctx
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._stops = StopMatcher(sampling.stop)
        self._emitted: list[str] = []
        # Logprobs, when asked for: offsets in characters of the decoded stream (logprobs.py)
        self._ledger = LogprobLedger() if sampling.logprobs is not None else None
        self._on_logprobs = on_logprobs
        self._decoded_chars = 0
        self._shown_chars = 0  # decoded characters past the stop matcher, stripped ones too
        self._lead_chars = 0  # leading whitespace stripped from a reply

    @property
    def wants_logprobs(self) -> bool:
        """Whether `feed` needs the logits of each token (the request asked for logprobs)."""
        return self._ledger is not None

    def stream(self, tokens: Iterator[int], logits_of: LogitsOf | None = None) -> str:
        """Feed every token of `tokens` until the generation is over; the reply's text.
        `logits_of(n)` gives the logits behind the nth token (needed for logprobs)."""
        try:
            for token in self._guarded(tokens):
                logits = None
                if self._ledger is not None and logits_of is not None:
                    logits = logits_of(len(self.sampled))
                if not self.feed(token, logits):
                    break
        finally:
            if hasattr(tokens, "close"):
                tokens.close()
        return self.finish()

    def _guarded(self, tokens: Iterator[int]) -> Iterator[int]:
        try:
            yield from tokens
        except RuntimeError as exc:  # llama_decode failed; an abort shows up the same way
            if self.cancel.is_set():
                self.stop_reason = "cancelled"
                return
            raise EngineError(
                "llama.cpp failed while generating the reply.",
                hint="Try again; if it keeps failing, reload the model with a smaller context.",
            ) from exc

    def feed(self, token: int, logits: np.ndarray | None = None) -> bool:
        """Take the next sampled token (and, for logprobs, the logits it was sampled from);
        False once the generation is over (EOS, a stop sequence, max_tokens, a full context
        or cancellation: see `stop_reason`)."""
        self._note_token()
        self.sampled.append(token)
        if self.engine.is_end_of_generation(token):
            self.stop_reason = "eos"
            return False
        self.completion_tokens += 1
        piece_bytes = self.engine.token_text(token)
        decoded = self._decoder.decode(piece_bytes)
        if self._ledger is not None:
            self._record_logprob(token, piece_bytes, len(decoded), logits)
        piece, stopped = self._stops.feed(decoded)
        self._emit(piece)
        if stopped:
            self.stop_reason = "stop"
        elif self.cancel.is_set():
            self.stop_reason = "cancelled"
        elif self._max_tokens is not None and self.completion_tokens >= self._max_tokens:
            self.stop_reason = "length"
        elif self.n_prompt + self.completion_tokens >= self._n_ctx:
            self.stop_reason = "context_full"
        else:
            return True
        return False

    def stop(self, reason: str) -> None:
        """End the generation from outside (a cancel seen between batch steps)."""
        self.stop_reason = reason

    def finish(self) -> str:
        """The reply's text, with whatever was held back for a stop sequence that never came."""
        stopped = self.stop_reason == "stop"
        if not stopped:
            self._emit(self._stops.flush(self._decoder.decode(b"", final=True)))
        if self._ledger is not None:
            self._hand_out(
                self._ledger.finish(self._shown_chars, self._lead_chars, stopped=stopped)
            )
        return "".join(self._emitted)

    def outcome(self, speculative: SpeculationStats | None = None) -> GenerationResult:
        text = self.finish()
        return GenerationResult(
            text=text,
            metrics=self.metrics(speculative),
            tokens=tuple(self.sampled),
            logprobs=self._ledger.kept if self._ledger is not None else None,
        )

    def _record_logprob(
        self, token: int, piece: bytes, n_chars: int, logits: np.ndarray | None
    ) -> None:
        assert self._ledger is not None
        if logits is None:
            raise EngineError("Logprobs were asked for, but no logits came with the token.")
        start = self._decoded_chars
        self._decoded_chars += n_chars
        # A token that ends inside a UTF-8 character shows with the character's last byte.
        incomplete = bool(self._decoder.getstate()[0])
        n_top = self.sampling.logprobs or 0
        entry = token_logprob(logits, token, piece, n_top, self.engine.display_piece)
        self._ledger.add(entry, start, self._decoded_chars + int(incomplete))

    def _hand_out(self, entries: tuple[TokenLogprob, ...]) -> None:
        if entries and self._on_logprobs is not None:
            self._on_logprobs(entries)

    def _emit(self, piece: str) -> None:
        passed = len(piece)
        if self.trim_start and not self._emitted:
            piece = piece.lstrip()
            self._lead_chars += passed - len(piece)
        self._shown_chars += passed
        if self._ledger is not None:
            self._hand_out(self._ledger.release(self._shown_chars, self._lead_chars))
        if piece:
            self._emitted.append(piece)
            if self._on_text is not None:
                self._on_text(piece)

    def _note_token(self) -> None:
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
            if self._on_first_token is not None:
                self._on_first_token()
        self.last_token_at = now

    def metrics(self, speculative: SpeculationStats | None = None) -> GenerationMetrics:
        ended = time.perf_counter()
        evaluated = self.n_prompt - self.reused
        ttft = prompt_rate = decode_rate = None
        if self.first_token_at is not None:
            ttft = self.first_token_at - self.started
            prefill_s = self.first_token_at - self.prefill_started
            prompt_rate = evaluated / prefill_s if prefill_s > 0 else None
        if self.first_token_at is not None and self.last_token_at is not None:
            decode_s = self.last_token_at - self.first_token_at
            steps = self._decode_steps()
            decode_rate = steps / decode_s if decode_s > 0 and steps > 0 else None
        return GenerationMetrics(
            prompt_tokens=self.n_prompt,
            prompt_tokens_evaluated=evaluated,
            completion_tokens=self.completion_tokens,
            ttft_s=ttft,
            prompt_tok_s=prompt_rate,
            decode_tok_s=decode_rate,
            total_s=ended - self.started,
            stop_reason=self.stop_reason,
            speculative=speculative,
        )

    def _decode_steps(self) -> int:
        """Tokens sampled after the first one (the EOS token, when seen, was one of them)."""
        sampled = self.completion_tokens + (1 if self.stop_reason == "eos" else 0)
        return sampled - 1


def _load_llama(config: EngineConfig, *, verbose: bool) -> SpeculativeLlama:
    """The target model; its speculative draft is attached afterwards (`set_speculative`)."""
    kwargs = config.llama_kwargs()
    native_log.install()
    native_log.forget()
    try:
        if config.n_parallel > 1:
            return _load_parallel_llama(config, kwargs, verbose=verbose)
        if config.tensor_overrides:
            return SpeculativeLlamaWithOverrides(
                **kwargs,
                verbose=verbose,
                tensor_overrides=native_overrides(config.tensor_overrides),
            )
        return SpeculativeLlama(**kwargs, verbose=verbose)
    except (ValueError, RuntimeError, MemoryError) as exc:
        reason = native_log.last_failure_line()
        if not reason and isinstance(exc, MemoryError):
            reason = str(exc)  # llama-cpp-python's numpy logits array: no llama.cpp log line
        slots = f" in each of {config.n_parallel} slots" if config.n_parallel > 1 else ""
        out_of_memory = isinstance(exc, MemoryError) or native_log.is_allocation_message(reason)
        raise (EngineOutOfMemoryError if out_of_memory else EngineLoadError)(
            f"llama.cpp could not load {Path(config.model_path).name} with a context of "
            f"{config.n_ctx} tokens{slots} and {config.n_gpu_layers} GPU layers"
            + (f" ({reason})." if reason else "."),
            hint="If memory is short, try a smaller context or fewer GPU layers; if the file "
            "is damaged, download or copy it again.",
        ) from exc


def _load_parallel_llama(
    config: EngineConfig, kwargs: dict[str, Any], *, verbose: bool
) -> SpeculativeLlama:
    """A Llama whose context has `n_parallel` sequence slots of `n_ctx` cells each."""
    if config.tensor_overrides:
        return ParallelLlamaWithOverrides(
            **kwargs,
            verbose=verbose,
            n_seq_max=config.n_parallel,
            tensor_overrides=native_overrides(config.tensor_overrides),
        )
    return ParallelLlama(**kwargs, verbose=verbose, n_seq_max=config.n_parallel)
