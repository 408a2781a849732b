"""Typed settings for the engine (how a model is loaded) and for one generation (how it samples).

`EngineConfig` covers every llama.cpp knob the planner sets; it round-trips through JSON so
plans, benchmarks and the autotune database can record exactly what ran.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil

from hearthside.core.errors import EngineError

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat `top_logprobs`

SplitMode = Literal["none", "layer", "row"]
NumaMode = Literal["off", "distribute", "isolate", "numactl"]
SpeculativeMode = Literal["off", "prompt_lookup", "draft_model"]
SPECULATIVE_MODES: tuple[str, ...] = ("off", "prompt_lookup", "draft_model")

# ggml type ids (ggml.h enum ggml_type) of the KV-cache types llama.cpp accepts.
KV_CACHE_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
}
SPLIT_MODES: dict[str, int] = {"none": 0, "layer": 1, "row": 2}
# llama-cpp-python passes `numa` straight to ggml_numa_strategy.
NUMA_STRATEGIES: dict[str, int] = {"off": 0, "distribute": 1, "isolate": 2, "numactl": 3}
SCHEMA_VERSION = 1
MAX_PARALLEL = 64  # llama.cpp's LLAMA_MAX_SEQ


class EngineConfigError(EngineError):
    """An engine setting is out of range or contradicts another."""


def physical_core_count() -> int:
    """Cores that decode well: SMT siblings rarely add decode speed (see FIELD_NOTES)."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def logical_core_count() -> int:
    return os.cpu_count() or 1


# The context a conversation gets unless the user sets another: the chat, `plan`, the tuner
# and Apply all use this one figure, so what a plan promises is what a chat runs.
CHAT_CONTEXT = 4096


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding: cheap guesses that the model verifies in one batch.

    `prompt_lookup` drafts the tokens that followed an earlier occurrence of the last
    n-gram (up to `ngram_size` tokens) of the text; `draft_model` runs a second, small model
    with the same vocabulary (`draft_model_path`) greedily. Either drafts at most
    `draft_tokens` tokens per step. The draft model loads with the target's context, threads
    and GPU layers unless `draft_n_ctx`, `draft_threads` or `draft_gpu_layers` say otherwise.
    """

    mode: SpeculativeMode = "off"
    draft_tokens: int = 10
    ngram_size: int = 2
    draft_model_path: str | None = None
    draft_n_ctx: int | None = None
    draft_threads: int | None = None
    draft_gpu_layers: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in SPECULATIVE_MODES:
            raise EngineConfigError(f"Unknown speculative mode {self.mode!r}.")
        if not 1 <= self.draft_tokens <= 64:
            raise EngineConfigError("Speculative draft_tokens must be between 1 and 64.")
        if not 1 <= self.ngram_size <= 16:
            raise EngineConfigError("Speculative ngram_size must be between 1 and 16.")
        self._check_draft_model()

    def _check_draft_model(self) -> None:
        if self.mode == "draft_model" and not self.draft_model_path:
            raise EngineConfigError(
                "Draft-model speculation needs a draft model file.",
                hint="Pick a smaller model with the same vocabulary as the draft.",
            )
        draft_settings = (
            self.draft_model_path,
            self.draft_n_ctx,
            self.draft_threads,
            self.draft_gpu_layers,
        )
        if self.mode != "draft_model" and any(value is not None for value in draft_settings):
            # One setting, one spelling: the autotune DB keys configurations by their fields.
            raise EngineConfigError("Draft-model settings only apply to mode 'draft_model'.")
        if self.draft_n_ctx is not None and self.draft_n_ctx < 16:
            raise EngineConfigError("The draft model's context must be at least 16 tokens.")
        if self.draft_threads is not None and self.draft_threads < 1:
            raise EngineConfigError("draft_threads must be at least 1.")
        if self.draft_gpu_layers is not None and self.draft_gpu_layers < -1:
            raise EngineConfigError("draft_gpu_layers must be -1 (all) or a layer count.")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True)
class TensorOverride:
    """Tensors whose names match `pattern` (a regex, searched) live on `device` ("CPU", "CUDA0")."""

    pattern: str
    device: str

    def to_flag(self) -> str:
        """The same override as llama.cpp's command-line tools spell it (`-ot`)."""
        return f"{self.pattern}={self.device}"


@dataclass(frozen=True)
class EngineConfig:
    """How to load one model. Defaults suit a CPU-only machine."""

    model_path: str
    n_ctx: int = (
        CHAT_CONTEXT  # per conversation: each of the n_parallel slots gets this many tokens
    )
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int | None = None  # None: physical cores
    n_threads_batch: int | None = None  # None: logical cores (prefill likes them all)
    n_gpu_layers: int = 0  # -1: every layer
    split_mode: SplitMode = "layer"
    tensor_split: tuple[float, ...] | None = None
    main_gpu: int = 0
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = False
    use_mmap: bool = True
    use_mlock: bool = False
    numa: NumaMode = "off"
    # A full-size sliding-window cache lets turn N reuse the KV of turn N-1 on models such as
    # Gemma 3; without it llama.cpp cannot cut the cache back and re-evaluates everything.
    swa_full: bool = True
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # e.g. MoE expert tensors kept in RAM while the rest is offloaded (llama.cpp's -ot)
    tensor_overrides: tuple[TensorOverride, ...] = ()
    # Sequences decoded together in one batch (llama.cpp's n_seq_max): requests that arrive
    # together are served together instead of queueing; each slot has its own n_ctx tokens.
    n_parallel: int = 1
    schema: int = SCHEMA_VERSION

    def __post_init__(self) -> None:
        self._check_ranges()
        self._check_kv_types()

    def _check_ranges(self) -> None:
        if self.n_ctx < 16:
            raise EngineConfigError("The context size must be at least 16 tokens.")
        if not 1 <= self.n_parallel <= MAX_PARALLEL:
            raise EngineConfigError(f"n_parallel must be between 1 and {MAX_PARALLEL}.")
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise EngineConfigError("n_ubatch must be between 1 and n_batch.")
        for name in ("n_threads", "n_threads_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EngineConfigError(f"{name} must be at least 1.")
        if self.n_gpu_layers < -1:
            raise EngineConfigError("n_gpu_layers must be -1 (all) or a layer count.")
        if self.split_mode not in SPLIT_MODES:
            raise EngineConfigError(f"Unknown split mode {self.split_mode!r}.")
        if self.numa not in NUMA_STRATEGIES:
            raise EngineConfigError(f"Unknown NUMA mode {self.numa!r}.")

    def _check_kv_types(self) -> None:
        for name in ("type_k", "type_v"):
            if getattr(self, name) not in KV_CACHE_TYPES:
                known = ", ".join(KV_CACHE_TYPES)
                raise EngineConfigError(f"Unknown KV cache type for {name}; use one of {known}.")
        if self.type_v not in ("f16", "f32", "bf16") and not self.flash_attn:
            raise EngineConfigError(
                "A quantized V cache needs flash attention.",
                hint="Turn flash attention on, or keep type_v at f16.",
            )

    @property
    def decode_threads(self) -> int:
        return self.n_threads or physical_core_count()

    @property
    def total_context(self) -> int:
        """KV-cache cells for all slots together (what llama.cpp is asked for)."""
        return self.n_ctx * self.n_parallel

    @property
    def batch_threads(self) -> int:
        return self.n_threads_batch or logical_core_count()

    def llama_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `llama_cpp.Llama` that realise this config."""
        return {
            "model_path": self.model_path,
            "n_ctx": self.total_context,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "n_threads": self.decode_threads,
            "n_threads_batch": self.batch_threads,
            "n_gpu_layers": self.n_gpu_layers,
            "split_mode": SPLIT_MODES[self.split_mode],
            "tensor_split": list(self.tensor_split) if self.tensor_split else None,
            "main_gpu": self.main_gpu,
            "type_k": KV_CACHE_TYPES[self.type_k],
            "type_v": KV_CACHE_TYPES[self.type_v],
            "flash_attn": self.flash_attn,
            "use_mmap": self.use_mmap,
            "use_mlock": self.use_mlock,
            "numa": NUMA_STRATEGIES[self.numa],
            "swa_full": self.swa_full,
        }

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if self.tensor_split is not None:
            data["tensor_split"] = list(self.tensor_split)
        data["tensor_overrides"] = [dataclasses.asdict(item) for item in self.tensor_overrides]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        values = dict(data)
        if values.get("schema", SCHEMA_VERSION) > SCHEMA_VERSION:
            raise EngineConfigError("These engine settings come from a newer Hearthside.")
        values["speculative"] = SpeculativeConfig(**values.get("speculative", {}))
        values["tensor_overrides"] = tuple(
            TensorOverride(**item) for item in values.get("tensor_overrides", ())
        )
        if values.get("tensor_split") is not None:
            values["tensor_split"] = tuple(values["tensor_split"])
        return cls(**values)

    def with_changes(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def safest(self) -> EngineConfig:
        """The same model, context and GPU placement with every setting that has ever crashed
        llama.cpp at its plainest: no flash attention, an f16 KV cache, default batches and
        threads, no NUMA policy, no speculation, one slot."""
        plain = EngineConfig(self.model_path)
        return self.with_changes(
            n_batch=plain.n_batch,
            n_ubatch=plain.n_ubatch,
            n_threads=None,
            n_threads_batch=None,
            type_k="f16",
            type_v="f16",
            flash_attn=False,
            use_mlock=False,
            numa="off",
            speculative=SpeculativeConfig(),
            n_parallel=1,
        )

    def describe_safety(self) -> str:
        """The safest settings in words, for the message that announces them."""
        return (
            "flash attention off, an f16 KV cache, default batches and threads, "
            "no speculative decoding, one request at a time"
        )


@dataclass(frozen=True)
class SamplingParams:
    """How one reply is sampled. temperature 0 means greedy (deterministic)."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int | None = None  # None: until the model stops or the context is full
    # With max_tokens None: stop after this many all the same. A bound nobody asked for, so it
    # is not checked against the context up front (the API's cap for clients that send none).
    default_max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    grammar: str | None = None  # GBNF the reply must follow (JSON output, tool calls)
    # None: no logprobs (and no cost); N: each token's logprob and the N most likely there
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise EngineConfigError("temperature must be 0 or more.")
        if not 0 < self.top_p <= 1:
            raise EngineConfigError("top_p must be in (0, 1].")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise EngineConfigError("max_tokens must be at least 1.")
        if any(not stop for stop in self.stop):
            raise EngineConfigError("Stop sequences must not be empty.")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise EngineConfigError(f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}.")

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stop"] = list(self.stop)
        return data
