"""Serving recipes: how to run a model across several GPUs or nodes with vLLM, or across the GPUs
of one machine with llama.cpp's `llama-server`, and why each setting is what it is.

`plan_vllm(spec, cluster)` is a pure function of the model spec and a (what-if) cluster: it
picks the checkpoint format (bf16, fp8, AWQ/GPTQ int4, the model's native MXFP4/FP8), the tensor-
and pipeline-parallel sizes, the KV-cache dtype, the longest context that leaves room for two
full-length requests, expert parallelism and speculative decoding, and returns a `ServingPlan`
with a memory breakdown per GPU (weights / KV / activations and CUDA graphs / free), a reason per
choice, and the Ray commands when it spans nodes. `vllm_command(plan)` emits `vllm serve ...`.

`llama_server_recipe(spec, profile)` wraps the LOCAL planner's `Plan` for one machine and
`llama_server_command(plan)` spells it as `llama-server -ngl -ts -sm -ot -c -fa ...`.

Every emitted command is checked against the option lists recorded from the tools' sources
(assets/vllm_cli_options.json, assets/llama_server_cli_options.json): an unknown flag or a value
outside a flag's choices raises `RecipeFlagError`, so a typo cannot ship.

Memory model (vLLM): weights are split over tensor-parallel ranks and pipeline stages (the first
stage also holds the embeddings, the last the output layer); vLLM gives the KV cache whatever is
left of `gpu_memory_utilization` x memory after the weights and its profiled activation peak
(max_num_batched_tokens through one layer, plus sampler logits), CUDA graphs and the NCCL/CUDA
runtime. KV per token follows vLLM's layout: per layer K and V of the KV heads a rank holds
(heads are replicated when there are fewer than ranks), MLA models keep one compressed latent row
(replicated on every rank), sliding-window layers hold at most the window.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

from hearthside.autotune.planner import Plan, Reason, plan
from hearthside.core.errors import HearthsideError
from hearthside.core.models.catalog import catalog_ids, catalog_spec
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import GpuInfo, HardwareProfile
from hearthside.core.probe.spec import ClusterSpec
from hearthside.core.units import GIB, format_bytes

SERVING_SCHEMA = 1
DEDICATED_GPU_MEMORY_UTILIZATION = 0.90  # vLLM's default
# A unified-memory GPU shares its memory with the OS, the page cache and Ray's CPU processes.
UNIFIED_GPU_MEMORY_UTILIZATION = 0.80
MIN_MODEL_LEN = 4096
FULL_LENGTH_REQUESTS = 2  # room for this many max-length requests at once
MODEL_LEN_STEP = 1024
CUDA_GRAPH_BYTES = GIB // 2
RUNTIME_BYTES = 3 * GIB // 4  # CUDA context, NCCL and custom all-reduce buffers per GPU
BIG_GPU_BYTES = 70 * GIB  # vLLM picks larger default batches on GPUs with at least this much
RAY_PORT = 6379
DRAFT_TOKENS = 4
MAX_DRAFT_SHARE = 0.1  # a draft model is worth it when it is at most this share of the target
EXPERT_SLICE_LIMIT = 1024  # experts narrower than this per TP rank are better placed whole (EP)
INT4_BYTES_PER_PARAM = 0.5 + 2.5 / 128  # 4-bit weights, fp16 scale + packed zero per 128 weights
MXFP4_BYTES_PER_PARAM = 4.25 / 8  # 4-bit values + one 8-bit scale per 32


class RecipeError(HearthsideError):
    """A serving recipe cannot be made as asked."""


class RecipeFlagError(RecipeError):
    """An emitted command uses a flag (or a value) the tool does not accept."""


# --- checkpoints ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WeightFormat:
    name: str  # "bf16" | "fp8" | "awq-int4" | "gptq-int4" | "mxfp4"
    description: str
    quantization: str | None  # vLLM's --quantization value
    bits: int  # of the big matmul weights; sets the preference (more is better)


FORMATS: Mapping[str, WeightFormat] = {
    "bf16": WeightFormat("bf16", "bf16 (unquantized)", None, 16),
    "fp8": WeightFormat("fp8", "FP8", "fp8", 8),
    "awq-int4": WeightFormat("awq-int4", "AWQ int4", "awq_marlin", 4),
    "gptq-int4": WeightFormat("gptq-int4", "GPTQ int4", "gptq_marlin", 4),
    "mxfp4": WeightFormat("mxfp4", "MXFP4 (native)", "mxfp4", 4),
}

# Hugging Face checkpoints vLLM loads, per catalog id and format. "fp8" of a bf16 model is the bf16
# checkpoint quantized at load (--quantization fp8), so it is not listed.
CHECKPOINTS: Mapping[str, Mapping[str, str]] = {
    "llama-3.2-1b": {"bf16": "meta-llama/Llama-3.2-1B-Instruct"},
    "llama-3.2-3b": {"bf16": "meta-llama/Llama-3.2-3B-Instruct"},
    "llama-3.1-8b": {
        "bf16": "meta-llama/Llama-3.1-8B-Instruct",
        "awq-int4": "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    },
    "llama-3.1-70b": {
        "bf16": "meta-llama/Llama-3.1-70B-Instruct",
        "awq-int4": "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    },
    "llama-3.1-405b": {
        "bf16": "meta-llama/Llama-3.1-405B-Instruct",
        "awq-int4": "hugging-quants/Meta-Llama-3.1-405B-Instruct-AWQ-INT4",
    },
    "qwen2.5-7b": {"bf16": "Qwen/Qwen2.5-7B-Instruct", "awq-int4": "Qwen/Qwen2.5-7B-Instruct-AWQ"},
    "qwen2.5-14b": {
        "bf16": "Qwen/Qwen2.5-14B-Instruct",
        "awq-int4": "Qwen/Qwen2.5-14B-Instruct-AWQ",
    },
    "qwen2.5-32b": {
        "bf16": "Qwen/Qwen2.5-32B-Instruct",
        "awq-int4": "Qwen/Qwen2.5-32B-Instruct-AWQ",
    },
    "qwen2.5-72b": {
        "bf16": "Qwen/Qwen2.5-72B-Instruct",
        "awq-int4": "Qwen/Qwen2.5-72B-Instruct-AWQ",
    },
    "qwen3-8b": {"bf16": "Qwen/Qwen3-8B", "awq-int4": "Qwen/Qwen3-8B-AWQ"},
    "qwen3-14b": {"bf16": "Qwen/Qwen3-14B", "awq-int4": "Qwen/Qwen3-14B-AWQ"},
    "qwen3-32b": {"bf16": "Qwen/Qwen3-32B", "awq-int4": "Qwen/Qwen3-32B-AWQ"},
    "qwen3-30b-a3b": {"bf16": "Qwen/Qwen3-30B-A3B", "gptq-int4": "Qwen/Qwen3-30B-A3B-GPTQ-Int4"},
    "qwen3-235b-a22b": {
        "bf16": "Qwen/Qwen3-235B-A22B",
        "gptq-int4": "Qwen/Qwen3-235B-A22B-GPTQ-Int4",
    },
    "gemma-3-1b": {"bf16": "google/gemma-3-1b-it"},
    "gemma-3-4b": {"bf16": "google/gemma-3-4b-it"},
    "gemma-3-12b": {"bf16": "google/gemma-3-12b-it"},
    "gemma-3-27b": {"bf16": "google/gemma-3-27b-it"},
    "mistral-7b": {"bf16": "mistralai/Mistral-7B-Instruct-v0.3"},
    "mixtral-8x7b": {"bf16": "mistralai/Mixtral-8x7B-Instruct-v0.1"},
    "deepseek-v3": {
        "fp8": "deepseek-ai/DeepSeek-V3",
        "awq-int4": "cognitivecomputations/DeepSeek-V3-AWQ",
    },
    "gpt-oss-20b": {"mxfp4": "openai/gpt-oss-20b"},
    "gpt-oss-120b": {"mxfp4": "openai/gpt-oss-120b"},
}
# Multi-token-prediction heads that ship in the original checkpoint (vLLM's method name).
MTP_METHODS: Mapping[str, str] = {"deepseek-v3": "deepseek_mtp"}


# --- the plan ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuMemory:
    """One GPU of the plan; the four parts add up to `total_bytes`."""

    device: str  # "node0 GPU1"
    total_bytes: int
    weights_bytes: int
    kv_bytes: int  # all vLLM gives the KV cache: the rest of gpu_memory_utilization
    overhead_bytes: int  # activation peak, sampler logits, CUDA graphs, CUDA/NCCL runtime
    free_bytes: int  # outside gpu_memory_utilization
    kv_tokens: int  # tokens of context that KV cache holds (all requests together)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    why: str


@dataclass(frozen=True)
class ClusterSetup:
    """What to run on each node before `vllm serve` (Ray)."""

    nodes: int
    environment: tuple[EnvVar, ...]
    head_commands: tuple[tuple[str, ...], ...]
    worker_commands: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class ServingPlan:
    model: str
    model_id: str | None  # catalog id, when the model comes from the catalog
    hardware: str
    fits: bool
    checkpoint: str  # a Hugging Face repo, or a placeholder to fill in
    checkpoint_known: bool
    checkpoint_format: str  # a FORMATS key
    quantization: str | None  # --quantization
    tensor_parallel_size: int
    pipeline_parallel_size: int
    nodes: int
    gpus_per_node: int
    kv_cache_dtype: str  # "auto" | "fp8"
    max_model_len: int
    gpu_memory_utilization: float
    enable_expert_parallel: bool
    speculative_config: dict[str, Any] | None
    gpus: tuple[GpuMemory, ...]
    reasons: tuple[Reason, ...]
    advice: tuple[str, ...] = ()
    cluster: ClusterSetup | None = None
    schema: int = SERVING_SCHEMA

    @property
    def distributed_executor_backend(self) -> str | None:
        return "ray" if self.nodes > 1 else None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["distributed_executor_backend"] = self.distributed_executor_backend
        return data


# --- the planner ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    format: WeightFormat
    checkpoint: str
    checkpoint_known: bool
    nodes: int
    tp: int
    pp: int


@dataclass(frozen=True)
class _Sizing:
    """Per pipeline stage: weights, overhead and KV bytes per token per GPU."""

    weights: tuple[int, ...]
    overhead: tuple[int, ...]
    kv_full_per_token: tuple[int, ...]  # full-attention layers
    kv_window_per_token: tuple[int, ...]  # sliding-window layers (hold at most the window)


def plan_vllm(
    spec: ModelSpec,
    cluster: ClusterSpec,
    *,
    checkpoint: str | None = None,
    max_model_len: int | None = None,
) -> ServingPlan:
    """The vLLM serving plan for `spec` on `cluster`. `checkpoint` overrides the Hugging Face
    repo (its format is still the one planned); `max_model_len` asks for a context length."""
    problem = _unsupported_hardware(cluster.node.gpus)
    if problem:
        return _no_plan(spec, cluster, [problem])
    _require_shape(spec)
    gpu = reference_gpu(cluster)
    kv_dtype = _kv_dtype(spec, gpu)
    for layout in _layouts(spec, cluster):
        fitted = _fit(spec, layout, gpu, kv_dtype, max_model_len)
        if fitted is not None:
            sizing, length, speculative = fitted
            return _plan(spec, cluster, layout, sizing, length, kv_dtype, speculative, checkpoint)
    return _no_plan(spec, cluster, _nothing_fits_advice(spec, cluster, _utilization(gpu)))


def reference_gpu(cluster: ClusterSpec) -> GpuInfo:
    """vLLM sizes every rank like the smallest GPU and can use only what the oldest supports."""
    gpus = cluster.node.gpus
    smallest = min(gpus, key=lambda gpu: gpu.vram_total_bytes or 0)
    return dataclasses.replace(smallest, arch=min(gpus, key=_sm).arch)


def _fit(
    spec: ModelSpec, layout: _Layout, gpu: GpuInfo, kv_dtype: str, wanted: int | None
) -> tuple[_Sizing, int, dict[str, Any] | None] | None:
    """(sizing, context length, speculative config) when the layout fits; speculation is
    dropped before the layout is."""
    budget = _budget(gpu, _utilization(gpu))
    speculative = _speculation(spec, layout)
    for config in (speculative, None) if speculative else (None,):
        sizing = _size(spec, layout, config, kv_dtype, gpu)
        length = _model_len(spec, sizing, budget, wanted)
        if length is not None:
            return sizing, length, config
    return None


def _require_shape(spec: ModelSpec) -> None:
    missing = [
        name
        for name in ("n_layers", "n_head", "n_head_kv", "head_dim_k", "head_dim_v", "total_params")
        if getattr(spec, name) is None
    ]
    if missing:
        raise RecipeError(
            f"{spec.name} lacks {', '.join(missing)}, so its memory across GPUs cannot be sized.",
            hint="Describe the model with a descriptor JSON that gives them.",
        )


def _unsupported_hardware(gpus: Sequence[GpuInfo]) -> str | None:
    if not gpus:
        return "This hardware has no GPU; vLLM serving recipes need NVIDIA GPUs."
    if any(gpu.vendor != "nvidia" for gpu in gpus):
        return (
            "These recipes cover NVIDIA GPUs. For AMD Instinct GPUs use vLLM's ROCm build; "
            "for other GPUs use the llama-server recipe."
        )
    oldest = min(gpus, key=_sm)
    if _sm(oldest) < 70:
        return f"{oldest.name} is older than Volta (sm_70), which vLLM does not support."
    return None


def _sm(gpu: GpuInfo) -> int:
    arch = gpu.arch or ""
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0


def _fp8_hardware(gpu: GpuInfo) -> bool:
    return _sm(gpu) >= 89  # Ada, Hopper, Blackwell have FP8 tensor cores


def _utilization(gpu: GpuInfo) -> float:
    return (
        UNIFIED_GPU_MEMORY_UTILIZATION if gpu.unified_memory else DEDICATED_GPU_MEMORY_UTILIZATION
    )


def _budget(gpu: GpuInfo, utilization: float) -> int:
    return int((gpu.vram_total_bytes or 0) * utilization)


# -- checkpoint formats and layouts --


def _formats(spec: ModelSpec, gpu: GpuInfo) -> list[tuple[WeightFormat, str, bool]]:
    """(format, checkpoint, known) in order of preference, for what this GPU can run."""
    known = CHECKPOINTS.get(spec.ref or "", {})
    native = next((name for name in ("mxfp4", "fp8") if name in known), None)
    names = [native] if native else ["bf16"]
    if native is None and _fp8_hardware(gpu):
        names.append("fp8")
    if _sm(gpu) >= 80 and native != "mxfp4":
        int4 = next((name for name in ("awq-int4", "gptq-int4") if name in known), "awq-int4")
        names.append(int4)
    formats = []
    for name in names:
        repo = known.get(name) or (known.get("bf16") if name == "fp8" else None)
        formats.append((FORMATS[name], repo or _placeholder(spec, name), repo is not None))
    return formats


def _placeholder(spec: ModelSpec, format_name: str) -> str:
    return f"<Hugging Face repo of {spec.name} as {FORMATS[format_name].description}>"


def _layouts(spec: ModelSpec, cluster: ClusterSpec) -> list[_Layout]:
    """8-bit or better on one node, then across nodes, then 4-bit: few nodes, high quality."""
    tp = _tensor_parallel_size(spec, cluster.gpus_per_node)
    per_node = cluster.gpus_per_node // tp
    formats = _formats(spec, reference_gpu(cluster))
    fine = [item for item in formats if item[0].bits >= 8]
    coarse = [item for item in formats if item[0].bits < 8]
    layouts = []
    for group in (fine, coarse):
        for nodes in range(1, cluster.nodes + 1):
            for fmt, repo, known in group:
                layouts.append(_Layout(fmt, repo, known, nodes, tp, nodes * per_node))
    return layouts


def _tensor_parallel_size(spec: ModelSpec, gpus_per_node: int) -> int:
    """The most GPUs of one node that split the attention heads evenly (vLLM's rule)."""
    for size in range(gpus_per_node, 0, -1):
        if gpus_per_node % size == 0 and _divides_heads(spec, size):
            return size
    return 1


def _divides_heads(spec: ModelSpec, tp: int) -> bool:
    heads, kv_heads = spec.n_head or 1, spec.n_head_kv or 1
    if heads % tp:
        return False
    return spec.mla or kv_heads % tp == 0 or tp % kv_heads == 0


# -- memory --


def _size(
    spec: ModelSpec,
    layout: _Layout,
    speculative: dict[str, Any] | None,
    kv_dtype: str,
    gpu: GpuInfo,
) -> _Sizing:
    stages = _stage_layers(spec.n_layers or len(spec.layers), layout.pp)
    kv_value_bytes = 1 if kv_dtype == "fp8" else 2
    weights, overhead, full, window = [], [], [], []
    for index, layers in enumerate(stages):
        first, last = index == 0, index == len(stages) - 1
        stage_weights = _stage_weights(spec, layout, layers, first, last)
        stage_weights += _speculative_weights(spec, layout, speculative) if last else 0
        weights.append(stage_weights)
        overhead.append(_overhead(spec, layout.tp, gpu, last))
        full_kv, window_kv = _kv_per_token(spec, layout.tp, layers, kv_value_bytes)
        full.append(full_kv + (_speculative_kv(spec, layout, speculative) if last else 0))
        window.append(window_kv)
    return _Sizing(tuple(weights), tuple(overhead), tuple(full), tuple(window))


def _stage_layers(n_layers: int, pp: int) -> list[range]:
    """vLLM's even split; leftover layers go to the stages before the last (it holds the head)."""
    counts = [n_layers // pp] * pp
    for extra in range(n_layers % pp):  # fewer than pp leftovers: stages pp-2, pp-3, ..., 0
        counts[pp - 2 - extra] += 1
    bounds, start = [], 0
    for count in counts:
        bounds.append(range(start, start + count))
        start += count
    return bounds


def _param_bytes(params: float, expert_params: float, fmt: WeightFormat) -> float:
    dense = params - expert_params
    if fmt.name == "bf16":
        return params * 2
    if fmt.name == "fp8":
        return params * 1.0
    if fmt.name == "mxfp4":  # only the experts are MXFP4; attention stays bf16
        return expert_params * MXFP4_BYTES_PER_PARAM + dense * 2
    return params * INT4_BYTES_PER_PARAM


def _stage_weights(spec: ModelSpec, layout: _Layout, layers: range, first: bool, last: bool) -> int:
    """Weight bytes on one GPU of a pipeline stage."""
    held = sum(
        _param_bytes(layer.total.params, layer.experts.params, layout.format)
        for layer in spec.layers
        if layer.index in layers
    )
    # embeddings and the output layer stay 16-bit in quantized checkpoints; a tied output layer
    # shares the embeddings' memory unless it sits on another pipeline stage
    output = spec.output.params or (spec.embeddings.params if spec.tied_embeddings else 0)
    if first:
        held += spec.embeddings.params * 2
    if last:
        shared = first and not spec.output.params
        held += (0 if shared else output * 2) + spec.output_norm.params * 2
    return int(held / layout.tp)


def _overhead(spec: ModelSpec, tp: int, gpu: GpuInfo, last: bool) -> int:
    """vLLM's profiled peak: a batch of max_num_batched_tokens through one layer, the sampler's
    fp32 logits for max_num_seqs requests, then CUDA graphs and the runtime."""
    big = (gpu.vram_total_bytes or 0) >= BIG_GPU_BYTES
    tokens, seqs = (8192, 1024) if big else (2048, 256)
    width = spec.n_embd or 0
    inner = max(spec.n_ff or 0, (spec.n_ff_expert or 0) * max(spec.n_expert_used, 1))
    activations = tokens * (4 * width + 3 * inner // tp) * 2
    logits = seqs * (spec.vocab_size or 0) * 4 if last else 0
    return activations + logits + CUDA_GRAPH_BYTES + RUNTIME_BYTES


def _kv_per_token(spec: ModelSpec, tp: int, layers: range, value_bytes: int) -> tuple[int, int]:
    """(full-attention, sliding-window) KV bytes per token on one GPU of a stage."""
    full = window = 0
    for layer in spec.layers:
        if layer.index not in layers or layer.index >= (spec.n_layers or 0) - spec.n_layer_nextn:
            continue
        row = _kv_row_values(spec, layer.n_head_kv or spec.n_head_kv or 1, tp) * value_bytes
        if layer.sliding_window and spec.sliding_window:
            window += row
        else:
            full += row
    return full, window


def _kv_row_values(spec: ModelSpec, kv_heads: int, tp: int) -> int:
    if spec.mla:  # the compressed latent, whole on every rank
        return spec.head_dim_k or 0
    heads_per_rank = max(1, kv_heads // tp)
    return heads_per_rank * ((spec.head_dim_k or 0) + (spec.head_dim_v or 0))


def _kv_bytes(sizing: _Sizing, stage: int, tokens: int, window: int | None) -> int:
    held = min(tokens, window) if window else tokens
    return sizing.kv_full_per_token[stage] * tokens + sizing.kv_window_per_token[stage] * held


def _kv_budget(sizing: _Sizing, stage: int, budget: int) -> int:
    return budget - sizing.weights[stage] - sizing.overhead[stage]


def _model_len(spec: ModelSpec, sizing: _Sizing, budget: int, wanted: int | None) -> int | None:
    """The context length to serve: the trained context (or `wanted`) if FULL_LENGTH_REQUESTS of
    it fit, else the longest multiple of 1024 that does; None when not even MIN_MODEL_LEN fits."""
    trained = spec.context_length or MIN_MODEL_LEN
    ceiling = min(wanted, trained) if wanted else trained
    floor = min(MIN_MODEL_LEN, ceiling)

    def fits(tokens: int) -> bool:
        return all(
            FULL_LENGTH_REQUESTS * _kv_bytes(sizing, stage, tokens, spec.sliding_window)
            <= _kv_budget(sizing, stage, budget)
            for stage in range(len(sizing.weights))
        )

    if fits(ceiling):
        return ceiling
    if not fits(floor):
        return None
    low, high = floor // MODEL_LEN_STEP, ceiling // MODEL_LEN_STEP
    while low < high:  # the largest step count that fits
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle * MODEL_LEN_STEP) else (low, middle - 1)
    return max(floor, low * MODEL_LEN_STEP)


# -- features --


def _kv_dtype(spec: ModelSpec, gpu: GpuInfo) -> str:
    return "fp8" if _fp8_hardware(gpu) and not spec.mla else "auto"


def _expert_parallel(spec: ModelSpec, tp: int) -> bool:
    if not spec.n_expert or tp < 2 or spec.n_expert % tp:
        return False
    return (spec.n_ff_expert or 0) // tp < EXPERT_SLICE_LIMIT


def _speculation(spec: ModelSpec, layout: _Layout) -> dict[str, Any] | None:
    if layout.pp > 1:  # vLLM's speculative decoding does not run with pipeline parallelism
        return None
    method = MTP_METHODS.get(spec.ref or "")
    if method and layout.format.name == "fp8":  # the MTP head ships in the original checkpoint
        return {"method": method, "num_speculative_tokens": 1}
    draft = _draft_model(spec)
    if draft is None:
        return None
    return {"model": CHECKPOINTS[draft]["bf16"], "num_speculative_tokens": DRAFT_TOKENS}


def _draft_model(spec: ModelSpec) -> str | None:
    """The smallest catalog model of the same family and vocabulary, if it is small enough."""
    target = spec.active_params or spec.total_params or 0
    candidates = []
    for model_id in catalog_ids():
        if model_id == spec.ref or "bf16" not in CHECKPOINTS.get(model_id, {}):
            continue
        draft = catalog_spec(model_id)
        same_family = (draft.architecture, draft.vocab_size) == (spec.architecture, spec.vocab_size)
        small = (draft.total_params or 0) <= target * MAX_DRAFT_SHARE
        if same_family and small and not draft.n_expert:
            candidates.append((draft.total_params or 0, model_id))
    return min(candidates)[1] if candidates else None


def _speculative_weights(
    spec: ModelSpec, layout: _Layout, speculative: dict[str, Any] | None
) -> int:
    if speculative is None:
        return 0
    if "method" in speculative:  # an MTP block is about one more transformer layer
        return int(_mean_layer_bytes(spec, layout.format) / layout.tp)
    draft = catalog_spec(_draft_id(speculative))
    return int((draft.total_params or 0) * 2 / layout.tp)


def _speculative_kv(spec: ModelSpec, layout: _Layout, speculative: dict[str, Any] | None) -> int:
    if speculative is None:
        return 0
    if "method" in speculative:
        return _kv_row_values(spec, spec.n_head_kv or 1, layout.tp) * 2
    draft = catalog_spec(_draft_id(speculative))
    per_layer = _kv_row_values(draft, draft.n_head_kv or 1, layout.tp) * 2
    return per_layer * (draft.n_layers or 0)


def _draft_id(speculative: Mapping[str, Any]) -> str:
    repo = speculative["model"]
    return next(key for key, repos in CHECKPOINTS.items() if repos.get("bf16") == repo)


def _mean_layer_bytes(spec: ModelSpec, fmt: WeightFormat) -> float:
    sizes = [_param_bytes(layer.total.params, layer.experts.params, fmt) for layer in spec.layers]
    return sum(sizes) / max(1, len(sizes))


# -- assembling the plan --


def _plan(
    spec: ModelSpec,
    cluster: ClusterSpec,
    layout: _Layout,
    sizing: _Sizing,
    length: int,
    kv_dtype: str,
    speculative: dict[str, Any] | None,
    checkpoint: str | None,
) -> ServingPlan:
    gpu = reference_gpu(cluster)
    utilization = _utilization(gpu)
    memory = _gpu_memory(cluster, layout, sizing, utilization, spec.sliding_window, length)
    expert_parallel = _expert_parallel(spec, layout.tp)
    facts = _Facts(
        spec, cluster, layout, sizing, length, kv_dtype, speculative, expert_parallel, memory
    )
    return ServingPlan(
        model=spec.name,
        model_id=spec.ref if spec.ref in CHECKPOINTS else None,
        hardware=describe_cluster(cluster),
        fits=True,
        checkpoint=checkpoint or layout.checkpoint,
        checkpoint_known=checkpoint is not None or layout.checkpoint_known,
        checkpoint_format=layout.format.name,
        quantization=layout.format.quantization,
        tensor_parallel_size=layout.tp,
        pipeline_parallel_size=layout.pp,
        nodes=layout.nodes,
        gpus_per_node=cluster.gpus_per_node,
        kv_cache_dtype=kv_dtype,
        max_model_len=length,
        gpu_memory_utilization=utilization,
        enable_expert_parallel=expert_parallel,
        speculative_config=speculative,
        gpus=memory,
        reasons=tuple(_reasons(facts)),
        advice=tuple(_advice(facts)),
        cluster=_cluster_setup(cluster, layout.nodes) if layout.nodes > 1 else None,
    )


def _gpu_memory(
    cluster: ClusterSpec,
    layout: _Layout,
    sizing: _Sizing,
    utilization: float,
    window: int | None,
    length: int,
) -> tuple[GpuMemory, ...]:
    gpu = reference_gpu(cluster)
    total = gpu.vram_total_bytes or 0
    budget = _budget(gpu, utilization)
    per_stage_node = cluster.gpus_per_node // layout.tp
    rows = []
    for stage in range(layout.pp):
        kv = _kv_budget(sizing, stage, budget)
        tokens = _kv_tokens(sizing, stage, kv, window, length)
        for rank in range(layout.tp):
            node, slot = divmod(stage, per_stage_node)
            rows.append(
                GpuMemory(
                    device=f"node{node} GPU{slot * layout.tp + rank}",
                    total_bytes=total,
                    weights_bytes=sizing.weights[stage],
                    kv_bytes=kv,
                    overhead_bytes=sizing.overhead[stage],
                    free_bytes=total - budget,
                    kv_tokens=tokens,
                )
            )
    return tuple(rows)


def _kv_tokens(sizing: _Sizing, stage: int, kv: int, window: int | None, length: int) -> int:
    """Tokens of full-attention context the KV cache holds, once the sliding-window layers have
    their windows for the planned full-length requests."""
    full, windowed = sizing.kv_full_per_token[stage], sizing.kv_window_per_token[stage]
    if not full:
        return kv // max(1, windowed)
    held = min(length, window) if window else length
    return max(0, kv - FULL_LENGTH_REQUESTS * windowed * held) // full


def _cluster_setup(cluster: ClusterSpec, nodes: int) -> ClusterSetup:
    environment = (
        EnvVar(
            "NCCL_SOCKET_IFNAME",
            "IFNAME",
            "The network interface that carries the link between the nodes (e.g. the "
            "ConnectX-7 port; list them with `ip -br addr`). Without it NCCL may pick a slow "
            "or unreachable interface and hang at start-up.",
        ),
        EnvVar(
            "GLOO_SOCKET_IFNAME",
            "IFNAME",
            "The same interface for Gloo, which vLLM and PyTorch use for CPU-side setup.",
        ),
        EnvVar(
            "VLLM_HOST_IP",
            "THIS_NODE_IP",
            "This node's address on that interface, so Ray and vLLM advertise the right one.",
        ),
    )
    return ClusterSetup(
        nodes=nodes,
        environment=environment,
        head_commands=(("ray", "start", "--head", f"--port={RAY_PORT}"),),
        worker_commands=(("ray", "start", f"--address=HEAD_IP:{RAY_PORT}"),),
        notes=(
            "Set the variables above on every node, in the shell that starts Ray.",
            "Install the same vLLM (and Ray) version on every node and put the checkpoint at "
            "the same path, or the same Hugging Face cache, on each of them before serving.",
            f"Start Ray on the head node, then on each worker; `ray status` should list "
            f"{nodes * cluster.gpus_per_node} GPUs before you run `vllm serve` on the head node.",
            "vLLM listens on port 8000 of every interface: set VLLM_API_KEY (or --api-key) "
            "before anyone else can reach it.",
        ),
    )


def describe_cluster(cluster: ClusterSpec) -> str:
    if cluster.name:
        return cluster.name
    gpus = cluster.node.gpus
    name = gpus[0].name if gpus else "no GPU"
    per_node = f"{len(gpus)}x {name}" if gpus else name
    return per_node if cluster.nodes == 1 else f"{cluster.nodes} nodes of {per_node}"


@dataclass(frozen=True)
class _Facts:
    spec: ModelSpec
    cluster: ClusterSpec
    layout: _Layout
    sizing: _Sizing
    length: int
    kv_dtype: str
    speculative: dict[str, Any] | None
    expert_parallel: bool
    memory: tuple[GpuMemory, ...]


def _reasons(facts: _Facts) -> list[Reason]:
    return [
        _checkpoint_reason(facts),
        _tp_reason(facts),
        _pp_reason(facts),
        _kv_dtype_reason(facts),
        _model_len_reason(facts),
        _utilization_reason(facts),
        _expert_reason(facts),
        _speculative_reason(facts),
    ]


def _checkpoint_reason(facts: _Facts) -> Reason:
    fmt, spec = facts.layout.format, facts.spec
    gpu = reference_gpu(facts.cluster)
    total = sum(facts.sizing.weights) * facts.layout.tp
    short = (
        "Neither bf16 nor FP8 weights fit"
        if _fp8_hardware(gpu)
        else f"bf16 weights do not fit and {gpu.name} ({gpu.arch}) has no FP8 units"
    )
    why = {
        "bf16": "The unquantized weights fit, so nothing is lost to quantization.",
        "fp8": (
            "The model's native FP8 checkpoint fits."
            if "fp8" in CHECKPOINTS.get(spec.ref or "", {})
            else "bf16 weights do not fit; this GPU has FP8 tensor cores, so vLLM quantizes the "
            "bf16 checkpoint to FP8 as it loads (--quantization fp8), near-lossless and faster."
        ),
        "awq-int4": f"{short}, so it needs a 4-bit AWQ checkpoint; vLLM runs it with its Marlin "
        "kernels (--quantization awq_marlin).",
        "gptq-int4": f"{short}, so it needs a 4-bit GPTQ checkpoint; vLLM runs it with its Marlin "
        "kernels (--quantization gptq_marlin).",
        "mxfp4": "The model ships its experts in MXFP4; that checkpoint is the one to serve.",
    }[fmt.name]
    where = "" if facts.layout.checkpoint_known else " Fill in the repo of such a checkpoint."
    return Reason(
        "checkpoint",
        f"{fmt.description}: {facts.layout.checkpoint}",
        f"{why} Weights: {format_bytes(total)} in all.{where}",
    )


def _tp_reason(facts: _Facts) -> Reason:
    spec, tp = facts.spec, facts.layout.tp
    link = {
        "nvlink": "over NVLink",
        "pcie": "over PCIe",
        "unified": "(one GPU per node)",
    }.get(facts.cluster.gpu_link, "")
    heads = f"{spec.n_head} attention heads" + (
        "" if spec.mla else f" and {spec.n_head_kv} KV heads"
    )
    if tp == 1:
        why = "One GPU per stage: nothing to split inside a node."
    else:
        why = (
            f"Tensor parallelism splits every layer across the {tp} GPUs of a node {link}; "
            f"{heads} divide evenly over {tp}."
        )
        if spec.n_head_kv and not spec.mla and spec.n_head_kv < tp:
            why += " With fewer KV heads than GPUs, each GPU keeps a copy of one KV head."
    return Reason("tensor_parallel_size", str(tp), why)


def _pp_reason(facts: _Facts) -> Reason:
    layout, cluster = facts.layout, facts.cluster
    if layout.pp == 1:
        spare = cluster.nodes - 1
        why = "The model fits on one node, so no pipeline stages."
        if spare:
            why += f" The other {spare} node(s) can serve another copy behind a load balancer."
        return Reason("pipeline_parallel_size", "1", why)
    if layout.nodes > 1:
        network = cluster.network or "the network"
        why = (
            f"It does not fit on one node: {layout.nodes} nodes run {layout.pp} pipeline stages "
            f"(about {(facts.spec.n_layers or 0) // layout.pp} layers each). Across nodes over "
            f"{network}, pipeline parallelism sends one activation per token between stages, "
            "where tensor parallelism would all-reduce twice per layer over the slow link; "
            "vLLM runs it on a Ray cluster (--distributed-executor-backend ray)."
        )
    else:
        why = (
            f"The attention heads do not split over all {cluster.gpus_per_node} GPUs, so "
            f"{layout.pp} pipeline stages of {layout.tp} GPUs each use them all."
        )
    return Reason("pipeline_parallel_size", str(layout.pp), why)


def _kv_dtype_reason(facts: _Facts) -> Reason:
    gpu = reference_gpu(facts.cluster)
    if facts.kv_dtype == "fp8":
        why = (
            f"{gpu.name} ({gpu.arch}) has FP8: an FP8 KV cache holds twice the tokens; the "
            "quality loss is small for most families (scales default to 1.0 unless the "
            "checkpoint ships calibrated ones)."
        )
    elif facts.spec.mla:
        why = (
            "Latent attention already caches one compressed row per token; its FP8 cache "
            "depends on the attention backend, so the model's dtype stays."
        )
    else:
        why = f"{gpu.name} ({gpu.arch}) has no FP8 units; the KV cache stays in the model's dtype."
    return Reason("kv_cache_dtype", facts.kv_dtype, why)


def _model_len_reason(facts: _Facts) -> Reason:
    trained = facts.spec.context_length
    tokens = min(row.kv_tokens for row in facts.memory)
    if facts.length == trained:
        why = f"The model's full trained context; the KV cache holds ~{tokens:,} tokens in all."
    else:
        why = (
            f"The KV cache holds ~{tokens:,} tokens, so {facts.length:,} leaves room for "
            f"{FULL_LENGTH_REQUESTS} full-length requests at once (the model was trained for "
            f"{trained or '?'}); shorter requests share the cache page by page."
        )
    return Reason("max_model_len", str(facts.length), why)


def _utilization_reason(facts: _Facts) -> Reason:
    gpu = reference_gpu(facts.cluster)
    utilization = _utilization(gpu)
    if gpu.unified_memory:
        why = (
            f"{gpu.name} shares its memory with the CPU: leaving {1 - utilization:.0%} for the "
            "OS, the page cache and Ray's processes avoids the out-of-memory killer."
        )
    else:
        why = "vLLM's default: the rest stays free for the CUDA context and fragmentation."
    return Reason("gpu_memory_utilization", f"{utilization:.2f}", why)


def _expert_reason(facts: _Facts) -> Reason:
    spec, tp = facts.spec, facts.layout.tp
    if not spec.n_expert:
        return Reason("enable_expert_parallel", "off", "A dense model has no experts.")
    if facts.expert_parallel:
        width = (spec.n_ff_expert or 0) // tp
        why = (
            f"Slicing each of the {spec.n_expert} experts over {tp} GPUs would leave {width}-wide "
            "matrices that waste the GPU; whole experts per GPU (with an all-to-all) run better."
        )
        return Reason("enable_expert_parallel", "on", why)
    why = (
        "One GPU per stage holds its layers' experts whole."
        if tp == 1
        else f"The experts are wide enough ({spec.n_ff_expert}) to split over {tp} GPUs."
    )
    return Reason("enable_expert_parallel", "off", why)


def _speculative_reason(facts: _Facts) -> Reason:
    speculative = facts.speculative
    if speculative is None:
        return Reason("speculative_config", "off", _why_no_speculation(facts))
    if "method" in speculative:
        why = (
            "The checkpoint ships a multi-token-prediction head; it drafts one token per step "
            "that the model verifies, a cheap speed-up for single requests."
        )
        return Reason("speculative_config", speculative["method"], why)
    why = (
        f"{speculative['model']} shares the vocabulary and drafts {DRAFT_TOKENS} tokens per step "
        "for the model to verify: faster single requests, less gain under heavy load. Needs a "
        "vLLM whose V1 engine supports draft models; drop --speculative-config on older ones."
    )
    return Reason("speculative_config", "draft model", why)


def _why_no_speculation(facts: _Facts) -> str:
    spec, layout = facts.spec, facts.layout
    if layout.pp > 1:
        return "vLLM does not combine speculative decoding with pipeline parallelism."
    wanted = _speculation(spec, layout)
    if wanted is not None:
        drafter = wanted.get("model") or wanted.get("method")
        return (
            f"{drafter} could draft tokens, but its memory would leave too little KV cache for "
            f"{MIN_MODEL_LEN}-token requests."
        )
    if spec.ref in MTP_METHODS:
        return (
            "The multi-token-prediction head ships only in the original FP8 checkpoint, which "
            "does not fit here."
        )
    return "No smaller model of the same family and vocabulary in the catalog, and no MTP head."


def _advice(facts: _Facts) -> list[str]:
    advice = []
    if not facts.layout.checkpoint_known:
        advice.append(
            f"Replace {facts.layout.checkpoint} with a real checkpoint (or pass --checkpoint)."
        )
    if facts.length < (facts.spec.context_length or 0) and facts.length <= MIN_MODEL_LEN:
        advice.append(
            "The context is short for this hardware; a smaller model or more GPUs would allow "
            "longer requests."
        )
    return advice


def _no_plan(spec: ModelSpec, cluster: ClusterSpec, advice: Sequence[str]) -> ServingPlan:
    return ServingPlan(
        model=spec.name,
        model_id=spec.ref if spec.ref in CHECKPOINTS else None,
        hardware=describe_cluster(cluster),
        fits=False,
        checkpoint="",
        checkpoint_known=False,
        checkpoint_format="",
        quantization=None,
        tensor_parallel_size=0,
        pipeline_parallel_size=0,
        nodes=cluster.nodes,
        gpus_per_node=cluster.gpus_per_node,
        kv_cache_dtype="auto",
        max_model_len=0,
        gpu_memory_utilization=0.0,
        enable_expert_parallel=False,
        speculative_config=None,
        gpus=(),
        reasons=(),
        advice=tuple(advice),
    )


def _nothing_fits_advice(spec: ModelSpec, cluster: ClusterSpec, utilization: float) -> list[str]:
    gpu = reference_gpu(cluster)
    usable = _budget(gpu, utilization) * cluster.gpus_per_node * cluster.nodes
    smallest = min(
        _param_bytes(spec.total_params or 0, spec.routed_expert_params, fmt)
        for fmt, _, _ in _formats(spec, gpu)
    )
    return [
        f"{spec.name} does not fit on {describe_cluster(cluster)}: even its smallest checkpoint "
        f"needs ~{format_bytes(smallest)} of weights plus {MIN_MODEL_LEN} tokens of KV cache, "
        "and vLLM "
        f"can use {format_bytes(usable)} of GPU memory in all.",
        f"Add nodes (about {math.ceil(smallest * 1.25 / max(usable, 1) * cluster.nodes)} of "
        "these), pick a smaller model, or run a GGUF quant with llama.cpp, which can keep "
        "part of the model in system RAM.",
    ]


# --- llama-server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LlamaServerRecipe:
    plan: Plan  # the local planner's plan for one machine
    model_args: tuple[str, ...]  # ("-m", path) or ("-hf", "repo:QUANT")
    hardware: str
    reasons: tuple[Reason, ...]  # what the command adds to the plan's reasons
    advice: tuple[str, ...] = ()
    schema: int = SERVING_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "hardware": self.hardware,
            "model_args": list(self.model_args),
            "plan": self.plan.to_dict(),
            "reasons": [asdict(reason) for reason in self.reasons],
            "advice": list(self.advice),
        }


def llama_server_recipe(
    spec: ModelSpec,
    hardware: HardwareProfile | ClusterSpec,
    *,
    n_ctx: int | None = None,
    calibration: dict[str, float] | None = None,
) -> LlamaServerRecipe:
    """The local planner's plan for one machine (one node of a cluster), ready for llama-server."""
    cluster = hardware if isinstance(hardware, ClusterSpec) else None
    profile = cluster.node if cluster else hardware
    assert isinstance(profile, HardwareProfile)
    local = plan(spec, profile, n_ctx=n_ctx, calibration=calibration)
    model_args, model_reason = _model_args(spec)
    reasons = [model_reason, *_split_reasons(local, cluster)]
    advice = list(local.advice)
    if cluster and cluster.nodes > 1:
        advice.append(
            "llama-server runs on one node. llama.cpp's RPC backend can span machines but has "
            "had remote memory-corruption bugs; never expose it. Use the vLLM recipe across nodes."
        )
    name = describe_cluster(cluster) if cluster else _profile_name(profile)
    return LlamaServerRecipe(local, model_args, name, tuple(reasons), tuple(advice))


def _profile_name(profile: HardwareProfile) -> str:
    gpus = profile.gpus
    return f"{len(gpus)}x {gpus[0].name}" if gpus else "CPU only"


def _model_args(spec: ModelSpec) -> tuple[tuple[str, ...], Reason]:
    if spec.source == "gguf" and spec.ref:
        return ("-m", spec.ref), Reason("model", spec.ref, "The GGUF file the plan was made for.")
    if spec.gguf_repo:
        source = f"{spec.gguf_repo}:{spec.file_type or 'Q4_K_M'}"
        why = "llama-server downloads this quant from the hub (-hf) on first start."
        return ("-hf", source), Reason("model", source, why)
    return ("-m", "MODEL.gguf"), Reason(
        "model", "MODEL.gguf", f"Put the path of a {spec.file_type or 'GGUF'} file of {spec.name}."
    )


def _split_reasons(local: Plan, cluster: ClusterSpec | None) -> list[Reason]:
    gpus = [device for device in local.devices if device.device != "CPU"]
    if len(gpus) < 2:
        return []
    split = ",".join(_tensor_split(local))
    link = cluster.gpu_link if cluster else "pcie"
    return [
        Reason(
            "tensor_split",
            split,
            "The planner's split of the layers over the GPUs (-ts), so each GPU holds the "
            "weights and KV its memory allows.",
        ),
        Reason(
            "split_mode",
            local.config.split_mode,
            "Whole layers per GPU: one activation crosses "
            + ("NVLink" if link == "nvlink" else "PCIe")
            + " per GPU boundary per token. Row split exchanges partial results in every layer "
            "and rarely wins without NVLink.",
        ),
    ]


def _tensor_split(local: Plan) -> list[str]:
    gpus = [device for device in local.devices if device.device != "CPU"]
    shares = local.config.tensor_split or tuple(1.0 for _ in gpus)
    return [f"{share:g}" for share in shares[: len(gpus)]]


# --- emitters ---------------------------------------------------------------------------------


def vllm_command(plan: ServingPlan) -> list[str]:
    """`vllm serve ...` for a plan that fits; raises RecipeError otherwise."""
    if not plan.fits:
        raise RecipeError(
            f"There is no vLLM command for {plan.model} on {plan.hardware}: it does not fit.",
            hint=" ".join(plan.advice) or None,
        )
    argv = ["vllm", "serve", plan.checkpoint]
    argv += ["--tensor-parallel-size", str(plan.tensor_parallel_size)]
    argv += ["--pipeline-parallel-size", str(plan.pipeline_parallel_size)]
    if plan.distributed_executor_backend:
        argv += ["--distributed-executor-backend", plan.distributed_executor_backend]
    if plan.quantization:
        argv += ["--quantization", plan.quantization]
    argv += ["--kv-cache-dtype", plan.kv_cache_dtype]
    argv += ["--max-model-len", str(plan.max_model_len)]
    argv += ["--gpu-memory-utilization", f"{plan.gpu_memory_utilization:.2f}"]
    if plan.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    if plan.speculative_config:
        argv += ["--speculative-config", json.dumps(plan.speculative_config, separators=(",", ":"))]
    check_command(argv, vllm_options())
    return argv


def llama_server_command(
    plan: Plan,
    *,
    model_args: Sequence[str] | None = None,
    host: str = "127.0.0.1",
    port: int = 8080,
) -> list[str]:
    """`llama-server ...` realising the local planner's `plan` (same layers, split, overrides)."""
    config = plan.config
    argv = ["llama-server", *(model_args or ("-m", config.model_path))]
    argv += ["-ngl", "999" if config.n_gpu_layers == -1 else str(config.n_gpu_layers)]
    if sum(1 for device in plan.devices if device.device != "CPU") > 1:
        argv += ["-ts", ",".join(_tensor_split(plan)), "-sm", config.split_mode]
    for override in config.tensor_overrides:
        argv += ["-ot", override.to_flag()]
    # llama-server's -c is every slot's context together, shared out over -np slots
    argv += ["-c", str(config.total_context), "-fa", "on" if config.flash_attn else "off"]
    if config.n_parallel > 1:
        argv += ["-np", str(config.n_parallel)]
    argv += ["--cache-type-k", config.type_k, "--cache-type-v", config.type_v]
    if config.n_threads:
        argv += ["-t", str(config.n_threads)]
    argv += ["--host", host, "--port", str(port)]
    check_command(argv, llama_server_options())
    return argv


# --- the flag check ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CliOption:
    names: tuple[str, ...]
    value: str | None  # None: a switch
    choices: tuple[str, ...] = ()
    negatable: bool = False


@dataclass(frozen=True)
class CliOptions:
    tool: str
    program: tuple[str, ...]
    positionals: int
    version: str
    by_name: Mapping[str, CliOption] = field(default_factory=dict)

    def lookup(self, flag: str) -> CliOption | None:
        option = self.by_name.get(flag)
        if option is None and flag.startswith("--no-"):
            negated = self.by_name.get("--" + flag[5:])
            return negated if negated and negated.negatable else None
        return option


def parse_cli_options(data: Mapping[str, Any]) -> CliOptions:
    by_name: dict[str, CliOption] = {}
    for entry in data["options"]:
        option = CliOption(
            names=tuple(entry["names"]),
            value=entry.get("value"),
            choices=tuple(entry.get("choices", ())),
            negatable=bool(entry.get("negatable", False)),
        )
        for name in option.names:
            by_name[name] = option
    return CliOptions(
        tool=data["tool"],
        program=tuple(data["program"]),
        positionals=len(data.get("positionals", ())),
        version=data.get("version", "?"),
        by_name=by_name,
    )


@functools.cache
def _load_options(filename: str) -> CliOptions:
    text = resources.files("hearthside.assets").joinpath(filename).read_text("utf-8")
    return parse_cli_options(json.loads(text))


def vllm_options() -> CliOptions:
    return _load_options("vllm_cli_options.json")


def llama_server_options() -> CliOptions:
    return _load_options("llama_server_cli_options.json")


def shell_groups(argv: Sequence[str]) -> list[str]:
    """The command shell-quoted in paste-ready pieces: the program with its arguments, then
    each flag with its value."""
    head: list[str] = []
    rest = list(argv)
    while rest and not rest[0].startswith("-"):
        head.append(rest.pop(0))
    groups = [shlex.join(head)]
    while rest:
        flag = rest.pop(0)
        value = [rest.pop(0)] if rest and not rest[0].startswith("-") else []
        groups.append(shlex.join([flag, *value]))
    return groups


def check_command(argv: Sequence[str], options: CliOptions) -> None:
    """Raise RecipeFlagError unless every flag of `argv` is one the tool accepts, with a value
    of the right kind (and among its choices, where it has a fixed set)."""
    prefix = list(options.program)
    if list(argv[: len(prefix)]) != prefix:
        raise RecipeFlagError(f"A {options.tool} command must start with {' '.join(prefix)!r}.")
    rest = list(argv[len(prefix) :])
    positionals = 0
    while rest:
        token = rest.pop(0)
        if not token.startswith("-"):
            positionals += 1
            if positionals > options.positionals:
                raise RecipeFlagError(f"{options.tool} takes no argument {token!r} here.")
            continue
        flag, inline = token.split("=", 1) if "=" in token else (token, None)
        option = options.lookup(flag)
        if option is None:
            raise _unknown_flag(flag, options)
        if option.value is None or flag.startswith("--no-") and option.negatable:
            if inline is not None:
                raise RecipeFlagError(f"{options.tool}: {flag} is a switch and takes no value.")
            continue
        if inline is None and not rest and option.value != "optional-str":
            raise RecipeFlagError(f"{options.tool}: {flag} needs a value.")
        value = inline if inline is not None else rest.pop(0)
        _check_value(flag, value, option, options.tool)


def _unknown_flag(flag: str, options: CliOptions) -> RecipeFlagError:
    near = difflib.get_close_matches(flag, list(options.by_name), n=3, cutoff=0.6)
    hint = f"Did you mean {', '.join(near)}?" if near else None
    return RecipeFlagError(
        f"{flag} is not an option of {options.tool} ({options.version}).",
        hint=hint,
    )


def _check_value(flag: str, value: str, option: CliOption, tool: str) -> None:
    if option.choices and value not in option.choices:
        raise RecipeFlagError(
            f"{tool}: {value!r} is not a value {flag} accepts.",
            hint=f"Use one of: {', '.join(option.choices)}.",
        )
    try:
        if option.value == "int":
            int(value)
        elif option.value == "float":
            float(value)
        elif option.value == "json":
            json.loads(value)
    except ValueError as exc:
        raise RecipeFlagError(f"{tool}: {flag} wants {option.value}, not {value!r}.") from exc
