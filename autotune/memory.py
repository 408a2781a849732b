"""The memory model: what llama.cpp will allocate on each device for a model and its settings.

It follows llama.cpp's own placement rules, so the prediction can be checked buffer by buffer
against what the loader logs (`core/engine/load_report.py`):
- the input embeddings stay on the CPU; with n_gpu_layers = g, the last g of the n_layer + 1
  "layers" (the blocks, then the output layer) go to the GPUs, split by `tensor_split`;
- tensor overrides (`-ot`) move matching tensors, e.g. MoE experts, back to the CPU;
- each layer's KV cache lives with the layer (sliding-window layers hold a window); with
  `n_parallel` slots every slot holds its own `n_ctx` cells (and its own window), so the cache
  is `n_parallel` times one slot's: llama.cpp's per-sequence streams (a unified cache holds
  the same full-context cells and a little less for the windows);
- on the CPU, weights of some quant types are repacked into a second buffer for faster
  matmuls (Q4_0, Q4_K, IQ4_NL with AVX2 or NEON) while the mmapped range still spans them;
- the compute buffer is the largest of the graph's phases (logits, attention, FFN) — see
  docs/architecture.md, "Decisions", for the measurements behind each term; with several
  slots the cache has one stream per slot and the graph splits the batch across them, so
  the attention scores and masks span one slot's cells, not every slot's; the logits buffer
  holds one row per slot (llama.cpp reserves n_seq_max outputs).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.load_report import DeviceMemory as AllocatedMemory
from hearthside.core.engine.load_report import LoadReport
from hearthside.core.models.gguf_validator import GGUFInfo
from hearthside.core.models.spec import LayerSpec, ModelSpec, TensorGroup

CPU = "CPU"
F32_BYTES = 4
F16_BYTES = 2
# Weight types the CPU backend repacks (ggml-cpu repack.cpp) when the CPU has the kernels.
# what ggml-cpu's repack.cpp (`ggml_repack_get_optimal_repack_type`, llama.cpp 0.3.36) repacks
REPACKED_ON_X86_AVX2 = frozenset({"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"})
REPACKED_ON_X86_AVX512 = REPACKED_ON_X86_AVX2 | {"Q2_K"}
REPACKED_ON_ARM_NEON = frozenset({"Q4_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "MXFP4", "Q8_0"})
# f32 activations per batch token alive at each phase's peak, fitted to llama.cpp's logged
# compute buffers over synthetic models (benchmarks/memory_model.py, docs/architecture.md).
# Attention: rows n_embd wide, n_head x head_dim wide and n_head_kv x head_dim wide (one more
# of those without flash attention), fitted over MHA, GQA and wide-head llamas, gemma3, gpt-oss.
ATTENTION_EMBD_ROWS = 3
ATTENTION_QUERY_ROWS = 2
ATTENTION_KV_ROWS = 1
ATTENTION_KV_ROWS_WITHOUT_FLASH = 2
# Latent attention (MLA): the absorbed query (n_head x the latent K row) twice, n_embd rows.
LATENT_QUERY_ROWS = 2
LATENT_EMBD_ROWS = 6
FFN_INTERMEDIATES = 3  # gate, up and their product, n_ff wide
# The allocator's reuse leaves 3 n_embd rows live at long contexts with a quantized cache and
# 4 elsewhere; the mean keeps both within 5%.
FFN_ACTIVATIONS = 3.5
LOGIT_ACTIVATIONS = 3
COMPUTE_BASE_BYTES = 1 << 17  # positions, output ids, small graph inputs: ~0.01-0.25 MiB


@dataclass(frozen=True)
class WeightPiece:
    """A tensor (from a file) or a group of tensors (from a spec), placed as one."""

    name: str  # a tensor name override patterns are matched against
    layer: int | None  # block index; None for the input embeddings; n_layer for the output
    bytes: int
    type_names: tuple[str, ...]
    matmul: bool  # used as a matmul weight, so the CPU may repack it
    offset: int | None = None  # in the file, when known
    rows: int = 0  # matrix rows (dot products per token); a spec's groups: estimated


@dataclass
class DeviceMemory:
    """Predicted bytes on one device, by purpose (same split as llama.cpp's log)."""

    device: str
    weights_bytes: int = 0
    kv_bytes: int = 0
    compute_bytes: int = 0
    output_bytes: int = 0
    # the routed experts among the weights (a token reads a few); on the CPU those read from
    # the mapping only, not those repacked
    expert_bytes: int = 0
    # copies of repacked weights in anonymous memory: the kernel cannot page them back from
    # the file, so they stay in RAM whatever else streams
    repacked_bytes: int = 0
    lookup_bytes: int = 0  # input embeddings: a token reads one row of them, not all
    unread_bytes: int = 0  # mapped but never read (the file's copy of repacked weights)
    layers: list[int] = field(default_factory=list)

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.output_bytes


@dataclass
class MemoryEstimate:
    devices: dict[str, DeviceMemory]

    def device(self, name: str) -> DeviceMemory:
        return self.devices.setdefault(name, DeviceMemory(name))

    @property
    def total_bytes(self) -> int:
        return sum(memory.total_bytes for memory in self.devices.values())

    def to_dict(self) -> dict[str, dict[str, int]]:
        return {
            name: {
                "weights_bytes": memory.weights_bytes,
                "kv_bytes": memory.kv_bytes,
                "compute_bytes": memory.compute_bytes,
                "output_bytes": memory.output_bytes,
                "total_bytes": memory.total_bytes,
            }
            for name, memory in self.devices.items()
        }


def repacked_types(cpu_flags: Sequence[str], arch: str) -> frozenset[str]:
    """The weight types this CPU's backend repacks (and so holds twice when mmapped)."""
    if arch in ("x86_64", "amd64") and "avx2" in cpu_flags:
        return REPACKED_ON_X86_AVX512 if "avx512f" in cpu_flags else REPACKED_ON_X86_AVX2
    if arch in ("arm64", "aarch64") and "dotprod" in cpu_flags:
        return REPACKED_ON_ARM_NEON
    return frozenset()


def estimate_memory(
    spec: ModelSpec,
    config: EngineConfig,
    *,
    gpus: Sequence[str] = (),
    repacked: frozenset[str] = frozenset(),
    pieces: Sequence[WeightPiece] | None = None,
    n_outputs: int = 1,
) -> MemoryEstimate:
    """Bytes per device llama.cpp will allocate to load `spec` with `config`.

    `gpus` are the engine's GPU device names in order ("CUDA0", ...); `pieces` the model's
    tensors when its file is at hand (`pieces_from_gguf`), else they come from the spec.
    """
    n_layers = _layer_count(spec)
    placement = LayerPlacement(n_layers, config, gpus)
    estimate = MemoryEstimate({CPU: DeviceMemory(CPU)})
    for gpu in gpus:
        estimate.device(gpu)
    weight_pieces = list(pieces) if pieces is not None else pieces_from_spec(spec)
    _place_weights(estimate, weight_pieces, placement, config, repacked, spec.tied_embeddings)
    _place_kv(estimate, spec, config, placement)
    _place_compute(estimate, spec, config, placement)
    outputs = max(n_outputs, config.n_parallel)
    estimate.device(placement.device_of(n_layers)).output_bytes += _output_bytes(spec, outputs)
    for index in range(n_layers):
        estimate.device(placement.device_of(index)).layers.append(index)
    return estimate


class LayerPlacement:
    """Which device holds each block and the output layer (llama.cpp's `-ngl` / `-ts`)."""

    def __init__(self, n_layers: int, config: EngineConfig, gpus: Sequence[str]) -> None:
        self.n_layers = n_layers
        self.gpus = list(gpus)
        wanted = n_layers + 1 if config.n_gpu_layers < 0 else config.n_gpu_layers
        self.offloaded = min(wanted, n_layers + 1) if self.gpus else 0
        self.first_gpu_layer = n_layers + 1 - self.offloaded
        split = config.tensor_split or tuple(1.0 for _ in self.gpus)
        total = sum(split[: len(self.gpus)]) or 1.0
        running = 0.0
        self._bounds = []
        for share in split[: len(self.gpus)]:
            running += share / total
            self._bounds.append(running)

    def device_of(self, layer: int) -> str:
        if layer < self.first_gpu_layer or not self.gpus:
            return CPU
        position = (layer - self.first_gpu_layer) / self.offloaded
        for gpu, bound in zip(self.gpus, self._bounds, strict=False):
            if position < bound:
                return gpu
        return self.gpus[-1]


def pieces_from_gguf(info: GGUFInfo) -> list[WeightPiece]:
    """One piece per tensor of a validated file, with its place in the file."""
    n_layers = _block_count(info)
    return [
        WeightPiece(
            name=tensor.name,
            layer=_layer_of(tensor.name, n_layers),
            bytes=tensor.n_bytes,
            type_names=(tensor.type_name,),
            matmul=_is_matmul_weight(tensor.name, len(tensor.shape)),
            offset=tensor.offset,
            rows=tensor.n_elements // max(1, tensor.shape[0]),
        )
        for tensor in info.tensors
    ]


def pieces_from_spec(spec: ModelSpec) -> list[WeightPiece]:
    """One piece per tensor group, named like a tensor of that group (for override patterns)."""
    n_layers = _layer_count(spec)
    width = spec.n_embd or 0
    pieces = [
        _group_piece("token_embd.weight", None, spec.embeddings, width, matmul=False),
        _group_piece("output.weight", n_layers, spec.output, width, matmul=True),
        _group_piece("output_norm.weight", n_layers, spec.output_norm, width, matmul=False),
        _group_piece("rope_freqs.weight", None, spec.other_tensors, width, matmul=False),
    ]
    for layer in spec.layers:
        pieces.extend(_layer_pieces(layer, width))
    return [piece for piece in pieces if piece.bytes]


def _layer_pieces(layer: LayerSpec, width: int) -> list[WeightPiece]:
    blk = f"blk.{layer.index}"
    return [
        _group_piece(f"{blk}.attn_q.weight", layer.index, layer.attention, width, matmul=True),
        _group_piece(f"{blk}.ffn_up.weight", layer.index, layer.ffn, width, matmul=True),
        _group_piece(f"{blk}.ffn_up_exps.weight", layer.index, layer.experts, width, matmul=True),
        _group_piece(
            f"{blk}.ffn_up_shexp.weight", layer.index, layer.shared_experts, width, matmul=True
        ),
        _group_piece(f"{blk}.attn_norm.weight", layer.index, layer.norms, width, matmul=False),
        _group_piece(f"{blk}.ffn_gate_inp.weight", layer.index, layer.other, width, matmul=False),
    ]


def _group_piece(
    name: str, layer: int | None, group: TensorGroup, width: int, *, matmul: bool
) -> WeightPiece:
    # most matrices take the embedding width in (the FFN's down projection does not: its
    # group's rows come out about a third too many, a small share of a token's time)
    rows = group.params // width if width else 0
    return WeightPiece(name, layer, group.bytes, group.quant_types, matmul, rows=rows)


def _place_weights(
    estimate: MemoryEstimate,
    pieces: Sequence[WeightPiece],
    placement: LayerPlacement,
    config: EngineConfig,
    repacked: frozenset[str],
    tied_embeddings: bool,
) -> None:
    mapped: list[WeightPiece] = []
    used_from_map = 0
    for piece in pieces:
        device = device_of_piece(piece, placement, config)
        is_repacked = piece.matmul and bool(piece.type_names) and set(piece.type_names) <= repacked
        if "_exps" in piece.name and not (device == CPU and is_repacked):
            estimate.device(device).expert_bytes += piece.bytes
        if device != CPU:
            estimate.device(device).weights_bytes += piece.bytes
            continue
        if is_repacked:
            estimate.device(CPU).weights_bytes += piece.bytes
            estimate.device(CPU).repacked_bytes += piece.bytes
            if config.use_mmap and piece.offset is None:
                mapped.append(piece)  # a spec's group sits inside the mapped range
            continue
        mapped.append(piece)
        used_from_map += piece.bytes
    mapped_bytes = _mapped_bytes(mapped, config.use_mmap)
    estimate.device(CPU).weights_bytes += mapped_bytes
    # what the mapping spans but no kernel reads: the originals of repacked weights, gaps
    estimate.device(CPU).unread_bytes += max(0, mapped_bytes - used_from_map)
    output_device = placement.device_of(placement.n_layers)
    embeddings = next((p for p in pieces if p.name.startswith("token_embd")), None)
    if embeddings is None:
        return
    if not (tied_embeddings and output_device == CPU):  # else the output matmul reads them all
        estimate.device(CPU).lookup_bytes += embeddings.bytes
    if tied_embeddings and output_device != CPU:  # the output layer gets its own copy
        estimate.device(output_device).weights_bytes += embeddings.bytes


def _mapped_bytes(pieces: Sequence[WeightPiece], use_mmap: bool) -> int:
    """An mmapped buffer spans its first to its last tensor in the file."""
    located = [piece for piece in pieces if piece.offset is not None]
    if not use_mmap or not located:
        return sum(piece.bytes for piece in pieces)
    start = min(piece.offset or 0 for piece in located)
    end = max((piece.offset or 0) + piece.bytes for piece in located)
    unlocated = sum(piece.bytes for piece in pieces if piece.offset is None)
    return end - start + unlocated


# llama.cpp refuses a file with a tensor name this long or longer (GGML_MAX_NAME), so only
# this much of a name can ever be placed. A user's override pattern is any regex (`.*_exps`)
# and the file's names can be 64 KiB: matching the prefix keeps each match short (issue 36).
GGML_MAX_NAME = 64


def device_of_piece(piece: WeightPiece, placement: LayerPlacement, config: EngineConfig) -> str:
    name = piece.name[:GGML_MAX_NAME]
    for override in config.tensor_overrides:
        if re.search(override.pattern, name):
            return CPU if override.device.upper().startswith("CPU") else override.device
    if piece.layer is None:
        return CPU
    return placement.device_of(piece.layer)


def _place_kv(
    estimate: MemoryEstimate, spec: ModelSpec, config: EngineConfig, placement: LayerPlacement
) -> None:
    by_layer = spec.kv_bytes_by_layer(
        config.n_ctx,
        config.type_k,
        config.type_v,
        config.swa_full,
        n_ubatch=_ubatch(config),
        flash_attn=config.flash_attn,
    )
    for index, size in by_layer.items():  # each slot has cells of its own
        estimate.device(placement.device_of(index)).kv_bytes += size * config.n_parallel


def _place_compute(
    estimate: MemoryEstimate, spec: ModelSpec, config: EngineConfig, placement: LayerPlacement
) -> None:
    """Each device that runs blocks needs the attention and FFN phases; the output device
    also the logits phase. A phase's tensors are freed before the next, so a device needs
    its largest phase, not their sum."""
    ubatch = _ubatch(config)
    block_peak = max(_attention_phase(spec, config, ubatch), _ffn_phase(spec, config, ubatch))
    devices = {placement.device_of(index) for index in range(placement.n_layers)}
    output_device = placement.device_of(placement.n_layers)
    for device in devices | {output_device}:
        peak = block_peak if device in devices else 0
        if device == output_device:
            peak = max(peak, _logits_phase(spec, ubatch))
        estimate.device(device).compute_bytes += peak + COMPUTE_BASE_BYTES


def _attention_phase(spec: ModelSpec, config: EngineConfig, ubatch: int) -> int:
    activations = _attention_rows(spec, config.flash_attn) * ubatch * F32_BYTES
    phase = _masks(spec, config, ubatch) + activations
    if config.flash_attn:
        return phase
    full_cells = spec.kv_cells(config.n_ctx, swa_full=config.swa_full, n_ubatch=ubatch)[0]
    scores = full_cells * ubatch * (spec.n_head or 0) * F32_BYTES  # one slot's cells: see top
    if spec.mla:  # without flash attention every slot's latent V is copied out transposed
        scores += full_cells * config.n_parallel * (spec.head_dim_v or 0) * F16_BYTES
    return phase + scores


def _attention_rows(spec: ModelSpec, flash_attn: bool) -> int:
    """f32 values per batch token alive next to the attention (scores and masks aside)."""
    n_embd = spec.n_embd or 0
    query = (spec.n_head or 0) * (spec.head_dim_k or 0)
    if spec.mla:  # head_dim_k is the latent K row (kv_lora_rank + rope dims)
        return LATENT_QUERY_ROWS * query + LATENT_EMBD_ROWS * n_embd
    kv = (spec.n_head_kv or 0) * (spec.head_dim_k or 0)
    kv_rows = ATTENTION_KV_ROWS if flash_attn else ATTENTION_KV_ROWS_WITHOUT_FLASH
    return ATTENTION_EMBD_ROWS * n_embd + ATTENTION_QUERY_ROWS * query + kv_rows * kv


def _ffn_phase(spec: ModelSpec, config: EngineConfig, ubatch: int) -> int:
    width = max(_dense_ffn_width(spec), spec.n_expert_used * (spec.n_ff_expert or 0))
    n_embd = spec.n_embd or 0
    rows = FFN_INTERMEDIATES * width + FFN_ACTIVATIONS * n_embd
    activations = round(rows * ubatch * F32_BYTES)
    return _masks(spec, config, ubatch) + activations


def _dense_ffn_width(spec: ModelSpec) -> int:
    """n_ff, where a block has a dense FFN (a MoE model's n_ff may name a width none uses)."""
    has_dense = not spec.layers or any(layer.ffn.bytes for layer in spec.layers)
    return (spec.n_ff or 0) if has_dense else 0


def _masks(spec: ModelSpec, config: EngineConfig, ubatch: int) -> int:
    """Attention masks are graph inputs, alive until the last block: one for the full-context
    layers and, on a sliding-window model, one for the window's cells (f16 with flash
    attention, else f32), over one slot's cells (each slot's stream takes its share of the
    batch)."""
    full_cells, window_cells = spec.kv_cells(
        config.n_ctx, swa_full=config.swa_full, n_ubatch=ubatch
    )
    cells = full_cells + (window_cells if spec.swa_layers else 0)
    return cells * ubatch * (F16_BYTES if config.flash_attn else F32_BYTES)


def _logits_phase(spec: ModelSpec, ubatch: int) -> int:
    n_vocab = spec.vocab_size or 0
    n_embd = spec.n_embd or 0
    return (n_vocab + LOGIT_ACTIVATIONS * n_embd) * ubatch * F32_BYTES


def _output_bytes(spec: ModelSpec, n_outputs: int) -> int:
    return (spec.vocab_size or 0) * n_outputs * F32_BYTES


def _ubatch(config: EngineConfig) -> int:
    """The physical batch llama-cpp-python really uses (it caps the batch at the context it
    allocates: every slot's)."""
    return min(config.total_context, config.n_batch, config.n_ubatch)


def _layer_count(spec: ModelSpec) -> int:
    return spec.n_layers if spec.n_layers is not None else len(spec.layers)


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _layer_of(name: str, n_layers: int) -> int | None:
    if match := _BLOCK.match(name):
        return int(match.group(1))
    if name.startswith(("output", "output_norm")):
        return n_layers
    return None  # token_embd, rope_freqs, per-layer embeddings: the input side, on the CPU


def _block_count(info: GGUFInfo) -> int:
    layers = [int(m.group(1)) for t in info.tensors if (m := _BLOCK.match(t.name))]
    return max(layers, default=-1) + 1


def _is_matmul_weight(name: str, n_dims: int) -> bool:
    return n_dims >= 2 and name.endswith(".weight") and not name.startswith("token_embd")


# --- checking a prediction against what llama.cpp allocated ------------------------------------

TOLERANCE_FRACTION = 0.05
# Below this size a buffer may also be off by SMALL_BUFFER_SLACK_BYTES (llama.cpp logs MiB
# with two decimals, and a few small graph inputs are not modelled); at or above it, 5% only.
LARGE_BUFFER_BYTES = 320 * 1024 * 1024
SMALL_BUFFER_SLACK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class BufferComparison:
    device: str
    purpose: str  # "weights" | "kv" | "compute" | "output" | "total"
    predicted_bytes: int
    allocated_bytes: int

    @property
    def error_bytes(self) -> int:
        return self.predicted_bytes - self.allocated_bytes

    @property
    def relative_error(self) -> float:
        return self.error_bytes / self.allocated_bytes if self.allocated_bytes else 0.0

    @property
    def is_large(self) -> bool:
        """Held to the relative bound alone."""
        return self.allocated_bytes >= LARGE_BUFFER_BYTES

    @property
    def within_tolerance(self) -> bool:
        slack = 0 if self.is_large else SMALL_BUFFER_SLACK_BYTES
        return abs(self.error_bytes) <= TOLERANCE_FRACTION * self.allocated_bytes + slack


def compare_with_load(estimate: MemoryEstimate, report: LoadReport) -> list[BufferComparison]:
    """The prediction against llama.cpp's logged buffers, per device and purpose."""
    comparisons = []
    for name in sorted(set(estimate.devices) | set(report.devices)):
        predicted = estimate.devices.get(name, DeviceMemory(name))
        allocated = report.devices.get(name) or AllocatedMemory(name)
        pairs = {
            "weights": (predicted.weights_bytes, allocated.model_bytes),
            "kv": (predicted.kv_bytes, allocated.kv_bytes),
            "compute": (predicted.compute_bytes, allocated.compute_bytes),
            "output": (predicted.output_bytes, allocated.output_bytes),
            "total": (predicted.total_bytes, allocated.total_bytes),
        }
        for purpose, (guess, real) in pairs.items():
            comparisons.append(BufferComparison(name, purpose, guess, real))
    return comparisons
