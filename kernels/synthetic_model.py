"""Synthetic GGUF models with random weights: any shape, loadable and runnable by llama.cpp.

Compute and memory do not depend on the weights' values, so random weights of a real shape
give honest load sizes and speeds for models that cannot be downloaded here. The families:
dense llama-style (`llama`), mixture-of-experts (`qwen3moe`: router `ffn_gate_inp` plus
`ffn_{gate,up,down}_exps` holding every expert, as llama.cpp expects), Gemma-3-style
sliding-window attention (`gemma3`: every 6th layer global), DeepSeek-style latent attention
with shared experts and a dense first layer (`deepseek2`) and gpt-oss (`gpt-oss`: alternating
window, attention sinks, biased experts). Any other architecture name is written with llama
tensors and metadata under that name; llama.cpp will not load it, which is what tests of
unknown architectures want. Widths must be multiples of 32 (the quant block size).

Weights are random blocks tiled from a small random pool (a 1.5B Q4_0 model takes seconds).
F32, F16, BF16, Q8_0 and Q4_0 are written uniformly (`write_uniform_gguf` writes any of the
legacy, K-, I- (but IQ1_M), ternary and MXFP4 types too); a llama.cpp file type ("Q4_K_M",
"Q6_K", ...) gets the tensor types llama.cpp's quantizer would choose, learnt by quantizing a
narrow proxy of the shape, and falls back to quantizing a Q8_0 file with
`llama_model_quantize` when a type has no random-block writer here.

The calibration writes its speed probes with it (`kernels/engine_run.py`); tests and
benchmarks import it through `tests/fixtures/synthetic_gguf.py`:

    from hearthside.kernels.synthetic_model import SHAPES, write_synthetic_gguf
    write_synthetic_gguf(Path("/tmp/m.gguf"), SHAPES["dense-1.5b"], quant="Q4_0")
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np

from hearthside.core.models.gguf_validator import validate_gguf

__all__ = [
    "SHAPES",
    "SyntheticShape",
    "synthetic_tensors",
    "uniform_writable",
    "write_synthetic_gguf",
    "write_uniform_gguf",
]

_BYTE_TOKEN_TYPE = 6
_NORMAL_TOKEN_TYPE = 1
_CONTROL_TOKEN_TYPE = 3
_UNKNOWN_TOKEN_TYPE = 2
_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
_WEIGHT_STD = 0.02
_POOL_BLOCKS = 1 << 18
_POOL_VALUES = 1 << 22


@dataclass(frozen=True)
class SyntheticShape:
    """The architecture numbers of a synthetic model (llama.cpp metadata names in comments)."""

    architecture: str  # general.architecture: "llama", "qwen3moe", "gemma3", ...
    n_layers: int  # block_count
    n_embd: int  # embedding_length
    n_head: int  # attention.head_count
    n_head_kv: int  # attention.head_count_kv
    n_ff: int  # feed_forward_length (dense FFN width)
    n_vocab: int = 4096
    head_dim: int | None = None  # attention.key_length; n_embd // n_head if None
    head_dim_v: int | None = None  # attention.value_length; head_dim if None
    n_expert: int = 0  # expert_count
    n_expert_used: int = 0  # expert_used_count
    n_ff_expert: int | None = None  # expert_feed_forward_length
    n_expert_shared: int = 0  # expert_shared_count (deepseek2)
    n_layer_dense_lead: int = 0  # leading_dense_block_count (deepseek2)
    kv_lora_rank: int | None = None  # attention.kv_lora_rank: latent attention (deepseek2)
    q_lora_rank: int | None = None  # attention.q_lora_rank (deepseek2)
    rope_dim: int | None = None  # rope.dimension_count; the head size if None
    sliding_window: int | None = None  # attention.sliding_window (gemma3, gpt-oss)
    context_length: int = 4096
    tied_embeddings: bool = False  # no output.weight: the embeddings double as the output
    extra_metadata: tuple[tuple[str, int], ...] = field(default=())  # (key without arch, u32)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.n_embd // self.n_head

    @property
    def head_size_v(self) -> int:
        return self.head_dim_v or self.head_size

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None


SHAPES: dict[str, SyntheticShape] = {
    # ~10M parameters: loads and generates in well under a second on two cores.
    "tiny-dense": SyntheticShape("llama", 8, 256, 4, 2, 1024),
    "tiny-moe": SyntheticShape(
        "qwen3moe", 4, 256, 4, 2, 768, n_expert=8, n_expert_used=2, n_ff_expert=256
    ),
    # 12 layers so that layers 5 and 11 are the global ones.
    "tiny-gemma3": SyntheticShape(
        "gemma3", 12, 256, 4, 1, 768, head_dim=64, sliding_window=128, tied_embeddings=True
    ),
    # Latent attention (the cache holds kv_lora_rank + rope_dim per token), one shared expert,
    # a dense first layer: DeepSeek-V3's layout in miniature.
    "tiny-deepseek2": SyntheticShape(
        "deepseek2",
        4,
        256,
        4,
        1,
        768,
        head_dim=64,
        head_dim_v=32,
        n_expert=8,
        n_expert_used=2,
        n_ff_expert=128,
        n_expert_shared=1,
        n_layer_dense_lead=1,
        kv_lora_rank=64,
        q_lora_rank=96,
        rope_dim=32,
    ),
    # gpt-oss: alternating sliding-window and global layers, attention sinks, biased experts.
    "tiny-gpt-oss": SyntheticShape(
        "gpt-oss",
        4,
        256,
        4,
        2,
        256,
        head_dim=64,
        n_expert=8,
        n_expert_used=2,
        n_ff_expert=256,
        sliding_window=128,
    ),
    # Sizes for speed and memory checks.
    "dense-0.5b": SyntheticShape("llama", 24, 1024, 16, 4, 4864, n_vocab=32000),
    "dense-1.5b": SyntheticShape("llama", 30, 1536, 12, 2, 8960, n_vocab=32000),
    "moe-1b": SyntheticShape(
        "qwen3moe",
        16,
        1024,
        16,
        4,
        3072,
        n_vocab=32000,
        n_expert=32,
        n_expert_used=4,
        n_ff_expert=512,
    ),
    # The models people really run (config.json of each), for the realistic-model benchmark.
    "llama-3.1-8b": SyntheticShape(
        "llama", 32, 4096, 32, 8, 14336, n_vocab=128256, context_length=131072
    ),
    "qwen3-30b-a3b": SyntheticShape(
        "qwen3moe",
        48,
        2048,
        32,
        4,
        6144,
        n_vocab=151936,
        head_dim=128,
        n_expert=128,
        n_expert_used=8,
        n_ff_expert=768,
        context_length=40960,
    ),
    # DeepSeek-V2-Lite's widths with V3's query compression: latent attention at a size people
    # run. 28 layers, not Lite's 27: llama.cpp reads a 26- or 27-layer deepseek2 as V2-Lite,
    # whose queries are not compressed, and refuses the file. One KV head, as llama.cpp's
    # converter writes MLA models (a tiny one with 4 fails a shape assertion).
    "deepseek2-16b": SyntheticShape(
        "deepseek2",
        28,
        2048,
        16,
        1,
        10944,
        n_vocab=102400,
        head_dim=192,
        head_dim_v=128,
        n_expert=64,
        n_expert_used=6,
        n_ff_expert=1408,
        n_expert_shared=2,
        n_layer_dense_lead=1,
        kv_lora_rank=512,
        q_lora_rank=1536,
        rope_dim=64,
        context_length=32768,
    ),
}


# --- tensors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (the row length) first
    weight: bool  # a matrix stored in the chosen type; otherwise F32 (norms, router, biases)


def synthetic_tensors(shape: SyntheticShape) -> list[_Tensor]:
    """The tensors llama.cpp's loader expects for `shape`, in ggml dimension order."""
    embd, vocab = shape.n_embd, shape.n_vocab
    tensors = [_Tensor("token_embd.weight", (embd, vocab), True)]
    for index in range(shape.n_layers):
        blk = f"blk.{index}."
        tensors += _attention_tensors(shape, blk) + _ffn_tensors(shape, index, blk)
    tensors.append(_Tensor("output_norm.weight", (embd,), False))
    if not shape.tied_embeddings:
        tensors.append(_Tensor("output.weight", (embd, vocab), True))
    return tensors


def _attention_tensors(shape: SyntheticShape, blk: str) -> list[_Tensor]:
    if shape.is_mla:
        return _latent_attention_tensors(shape, blk)
    embd, head = shape.n_embd, shape.head_size
    q_width, kv_width = shape.n_head * head, shape.n_head_kv * head
    tensors = [
        _Tensor(blk + "attn_norm.weight", (embd,), False),
        _Tensor(blk + "attn_q.weight", (embd, q_width), True),
        _Tensor(blk + "attn_k.weight", (embd, kv_width), True),
        _Tensor(blk + "attn_v.weight", (embd, kv_width), True),
        _Tensor(blk + "attn_output.weight", (q_width, embd), True),
    ]
    extras = _ARCH_EXTRAS.get(shape.architecture, frozenset())
    if "qk_norm" in extras:
        tensors += [
            _Tensor(blk + "attn_q_norm.weight", (head,), False),
            _Tensor(blk + "attn_k_norm.weight", (head,), False),
        ]
    if "sandwich_norm" in extras:
        tensors += [
            _Tensor(blk + "post_attention_norm.weight", (embd,), False),
            _Tensor(blk + "post_ffw_norm.weight", (embd,), False),
        ]
    if "biases_and_sinks" in extras:
        tensors += [
            _Tensor(blk + "post_attention_norm.weight", (embd,), False),
            _Tensor(blk + "attn_q.bias", (q_width,), False),
            _Tensor(blk + "attn_k.bias", (kv_width,), False),
            _Tensor(blk + "attn_v.bias", (kv_width,), False),
            _Tensor(blk + "attn_output.bias", (embd,), False),
            _Tensor(blk + "attn_sinks.weight", (shape.n_head,), False),
        ]
    else:
        tensors.append(_Tensor(blk + "ffn_norm.weight", (embd,), False))
    return tensors


def _latent_attention_tensors(shape: SyntheticShape, blk: str) -> list[_Tensor]:
    """DeepSeek's multi-head latent attention, in llama.cpp's split k_b / v_b form."""
    assert shape.kv_lora_rank is not None and shape.q_lora_rank is not None
    embd, heads = shape.n_embd, shape.n_head
    kv_lora, q_lora = shape.kv_lora_rank, shape.q_lora_rank
    rope = shape.rope_dim or shape.head_size // 2
    nope = shape.head_size - rope
    return [
        _Tensor(blk + "attn_norm.weight", (embd,), False),
        _Tensor(blk + "attn_q_a_norm.weight", (q_lora,), False),
        _Tensor(blk + "attn_kv_a_norm.weight", (kv_lora,), False),
        _Tensor(blk + "attn_q_a.weight", (embd, q_lora), True),
        _Tensor(blk + "attn_q_b.weight", (q_lora, heads * shape.head_size), True),
        _Tensor(blk + "attn_kv_a_mqa.weight", (embd, kv_lora + rope), True),
        _Tensor(blk + "attn_k_b.weight", (nope, kv_lora, heads), True),
        _Tensor(blk + "attn_v_b.weight", (kv_lora, shape.head_size_v, heads), True),
        _Tensor(blk + "attn_output.weight", (heads * shape.head_size_v, embd), True),
        _Tensor(blk + "ffn_norm.weight", (embd,), False),
    ]


def _ffn_tensors(shape: SyntheticShape, index: int, blk: str) -> list[_Tensor]:
    embd = shape.n_embd
    if not shape.is_moe or index < shape.n_layer_dense_lead:
        return [
            _Tensor(blk + "ffn_gate.weight", (embd, shape.n_ff), True),
            _Tensor(blk + "ffn_up.weight", (embd, shape.n_ff), True),
            _Tensor(blk + "ffn_down.weight", (shape.n_ff, embd), True),
        ]
    width, experts = shape.n_ff_expert or shape.n_ff, shape.n_expert
    tensors = [
        # llama.cpp's quantizer keeps the router in F32 too.
        _Tensor(blk + "ffn_gate_inp.weight", (embd, experts), False),
        _Tensor(blk + "ffn_gate_exps.weight", (embd, width, experts), True),
        _Tensor(blk + "ffn_up_exps.weight", (embd, width, experts), True),
        _Tensor(blk + "ffn_down_exps.weight", (width, embd, experts), True),
    ]
    if shape.n_expert_shared:
        shared = width * shape.n_expert_shared
        tensors += [
            _Tensor(blk + "ffn_gate_shexp.weight", (embd, shared), True),
            _Tensor(blk + "ffn_up_shexp.weight", (embd, shared), True),
            _Tensor(blk + "ffn_down_shexp.weight", (shared, embd), True),
        ]
    if "biases_and_sinks" in _ARCH_EXTRAS.get(shape.architecture, frozenset()):
        tensors += [
            _Tensor(blk + "ffn_gate_inp.bias", (experts,), False),
            _Tensor(blk + "ffn_gate_exps.bias", (width, experts), False),
            _Tensor(blk + "ffn_up_exps.bias", (width, experts), False),
            _Tensor(blk + "ffn_down_exps.bias", (embd, experts), False),
        ]
    return tensors


# Per-architecture tensors beyond the llama layout (from llama.cpp's load_arch_tensors).
_ARCH_EXTRAS: dict[str, frozenset[str]] = {
    "qwen3": frozenset({"qk_norm"}),
    "qwen3moe": frozenset({"qk_norm"}),
    "gemma3": frozenset({"qk_norm", "sandwich_norm"}),
    "gpt-oss": frozenset({"biases_and_sinks"}),
}


# --- writing ---------------------------------------------------------------------------------


def write_synthetic_gguf(
    path: str | os.PathLike[str],
    shape: SyntheticShape | str,
    quant: str = "F16",
    *,
    seed: int = 0,
    name: str | None = None,
    via_quantizer: bool | None = None,
) -> Path:
    """Write a GGUF of `shape` (or a SHAPES name) with random weights in `quant`; return path.

    `quant` is a ggml type written uniformly (F32, F16, BF16, Q8_0, Q4_0) or a llama.cpp file
    type (Q4_K_M, Q6_K, ...). For the latter the tensor types are the ones llama.cpp's quantizer
    picks: with `via_quantizer` a Q8_0 file is run through `llama_model_quantize` (minutes for
    billions of weights); without, the types are learnt from a narrow proxy and random blocks
    of them written directly, when this module can write every type they need. By default the
    quantizer is used for small shapes, where it is the quicker of the two.
    """
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    quant = quant.upper()
    label = name or f"Synthetic {shape.architecture} {quant}"
    if quant in _UNIFORM_FILE_TYPES:
        uniform = _uniform_types(shape, quant)
        return _write_blocks(target, shape, uniform, _UNIFORM_FILE_TYPES[quant], seed, label)
    file_type = _llama_file_type(quant)  # also refuses a type llama.cpp does not have
    if via_quantizer is None:
        via_quantizer = _parameter_count(shape) < _DIRECT_K_QUANT_MIN_PARAMS
    types = None if via_quantizer else _quantizer_types(shape, quant, target.parent)
    if types is not None:
        return _write_blocks(target, shape, types, file_type, seed, label)
    source = target.with_name(target.name + ".q8_0.tmp")
    try:
        q8_0 = _UNIFORM_FILE_TYPES["Q8_0"]
        _write_blocks(source, shape, _uniform_types(shape, "Q8_0"), q8_0, seed, label)
        _quantize(source, target, quant)
    finally:
        source.unlink(missing_ok=True)
    return target


def write_uniform_gguf(
    path: str | os.PathLike[str], shape: SyntheticShape, type_name: str, *, seed: int = 0
) -> Path:
    """Every weight matrix of `shape` in the one ggml type `type_name` (Q2_K, Q6_K, Q5_0, ...),
    written directly from random blocks — unlike llama.cpp's mixes, which spend more bits on
    some tensors. Rows must fill the type's blocks (256 values for K-quants)."""
    type_name = type_name.upper()
    if type_name not in _WRITABLE_TYPES:
        raise ValueError(f"no random-block writer for {type_name!r}")
    for tensor in synthetic_tensors(shape):
        if tensor.weight and tensor.shape[0] % _block_size(type_name):
            raise ValueError(f"{tensor.name}: rows of {tensor.shape[0]} do not fill {type_name}")
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    file_type = _UNIFORM_FILE_TYPES.get(type_name) or _llama_file_type(
        _FILE_TYPE_OF_UNIFORM.get(type_name, type_name)
    )
    label = f"Synthetic {shape.architecture} {type_name} (uniform)"
    return _write_blocks(target, shape, _uniform_types(shape, type_name), file_type, seed, label)


# the llama.cpp file type whose name a uniform file of a tensor type carries
_FILE_TYPE_OF_UNIFORM = {
    "Q3_K": "Q3_K_M",
    "Q4_K": "Q4_K_M",
    "Q5_K": "Q5_K_M",
    "MXFP4": "MXFP4_MOE",
}


def uniform_writable(type_name: str) -> bool:
    """Whether `write_uniform_gguf` can write weights of `type_name`."""
    return type_name.upper() in _WRITABLE_TYPES


def _parameter_count(shape: SyntheticShape) -> int:
    return sum(int(np.prod(tensor.shape)) for tensor in synthetic_tensors(shape))


def _llama_file_type(quant: str) -> int:
    names = gguf.LlamaFileType.__members__
    found = names.get(f"MOSTLY_{quant}") or names.get(f"ALL_{quant}")  # ALL_F32
    if found is None:
        raise ValueError(f"llama.cpp has no file type {quant!r}")
    return int(found)


def _uniform_types(shape: SyntheticShape, type_name: str) -> dict[str, str]:
    return {t.name: type_name if t.weight else "F32" for t in synthetic_tensors(shape)}


def _quantizer_types(shape: SyntheticShape, quant: str, workdir: Path) -> dict[str, str] | None:
    """The type llama.cpp's quantizer gives each tensor of `shape` for file type `quant`.

    Its choice depends on the tensor's role, layer index, layer and expert counts, and on
    whether the row length fits the type's blocks, not on the widths; so a narrow proxy of the
    same shape is quantized (a second or so) and its types are taken. None when a type has no
    random-block writer here, or a row length would fit differently at full width.
    """
    proxy = _narrow_proxy(shape)
    stem = workdir / f".proxy-{os.getpid()}-{quant}"
    source, quantized = stem.with_suffix(".src.gguf"), stem.with_suffix(".gguf")
    try:
        q8_0 = _UNIFORM_FILE_TYPES["Q8_0"]
        _write_blocks(source, proxy, _uniform_types(proxy, "Q8_0"), q8_0, 0, "proxy")
        _quantize(source, quantized, quant)
        chosen = {t.name: t.type_name for t in validate_gguf(quantized).tensors}
    finally:
        source.unlink(missing_ok=True)
        quantized.unlink(missing_ok=True)
    proxy_rows = {t.name: t.shape[0] for t in synthetic_tensors(proxy)}
    for tensor in synthetic_tensors(shape):
        type_name, row = chosen[tensor.name], tensor.shape[0]
        if type_name not in _WRITABLE_TYPES or row % _block_size(type_name):
            return None
        if (row % _QK_K == 0) != (proxy_rows[tensor.name] % _QK_K == 0):
            return None
    return chosen


def _narrow_proxy(shape: SyntheticShape) -> SyntheticShape:
    """`shape` with its big widths shrunk: the same tensors, counts and head sizes."""
    return replace(
        shape,
        n_embd=_narrow(shape.n_embd),
        n_ff=_narrow(shape.n_ff),
        n_ff_expert=_narrow(shape.n_ff_expert) if shape.n_ff_expert else None,
        n_vocab=512,
        head_dim=shape.head_size,
    )


def _narrow(width: int) -> int:
    """256 for a width that fills whole K-quant blocks, 96 (32-value blocks only) otherwise."""
    return _QK_K if width % _QK_K == 0 else 96


def _write_blocks(
    path: Path,
    shape: SyntheticShape,
    types: dict[str, str],
    file_type: int,
    seed: int,
    name: str,
) -> Path:
    writer = gguf.GGUFWriter(path, shape.architecture)
    try:
        writer.add_name(name)
        writer.add_file_type(file_type)
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
        _add_hparams(writer, shape)
        _add_vocab(writer, shape.n_vocab)
        tensors = synthetic_tensors(shape)
        for tensor in tensors:
            _declare(writer, tensor, gguf.GGMLQuantizationType[types[tensor.name]])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        weights = _RandomBlocks(np.random.default_rng(seed))
        for tensor in tensors:
            writer.write_tensor_data(weights.make(tensor, types[tensor.name]))
    finally:
        writer.close()
    return path


def _declare(
    writer: gguf.GGUFWriter, tensor: _Tensor, ggml_type: gguf.GGMLQuantizationType
) -> None:
    numpy_shape = tuple(reversed(tensor.shape))
    if ggml_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        dtype = np.dtype(np.float32 if ggml_type == gguf.GGMLQuantizationType.F32 else np.float16)
        n_bytes = int(np.prod(numpy_shape)) * dtype.itemsize
        writer.add_tensor_info(tensor.name, numpy_shape, dtype, n_bytes)
        return
    byte_shape = gguf.quant_shape_to_byte_shape(numpy_shape, ggml_type)
    writer.add_tensor_info(
        tensor.name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)), raw_dtype=ggml_type
    )


_QK_K = 256
# Below this many weights llama.cpp quantizes the whole model faster than its proxy round trip.
_DIRECT_K_QUANT_MIN_PARAMS = 100_000_000
# For each block type: where its f16 scale fields sit in a block, and roughly the spread of
# its integer part (scale x quant) for random bytes, which sets the scale that gives weights a
# spread of about _WEIGHT_STD. Layouts from ggml-common.h.
_BLOCK_SCALES: dict[str, tuple[tuple[int, ...], float]] = {
    "Q8_0": ((0,), 74.0),
    "Q4_0": ((0,), 4.6),
    "Q4_1": ((0, 2), 9.0),
    "Q5_0": ((0,), 9.2),
    "Q5_1": ((0, 2), 18.0),
    "Q2_K": ((80, 82), 17.0),
    "Q3_K": ((108,), 43.0),
    "Q4_K": ((0, 2), 330.0),
    "Q5_K": ((0, 2), 650.0),
    "Q6_K": ((208,), 1370.0),
    # random bytes index the I-quants' grids and the ternary digits; every index is valid
    "IQ4_NL": ((0,), 67.0),
    "IQ4_XS": ((0,), 1250.0),
    "IQ3_XXS": ((0,), 142.0),
    "IQ3_S": ((0,), 140.0),
    "IQ2_XXS": ((0,), 53.0),
    "IQ2_XS": ((0,), 56.0),
    "IQ2_S": ((0,), 56.0),
    "IQ1_S": ((0,), 7.2),
    "TQ1_0": ((52,), 0.82),
    "TQ2_0": ((64,), 1.12),
}
# MXFP4's scale is one E8M0 byte (2^(e-127)), not an f16: (offset, spread at e = 127).
# IQ1_M spreads its scale over the nibbles of its sub-block scales: no writer.
_EXPONENT_SCALES: dict[str, tuple[int, float]] = {"MXFP4": (0, 2.93)}
_FLOAT_TYPES = ("F32", "F16", "BF16")
_WRITABLE_TYPES = frozenset(_BLOCK_SCALES) | frozenset(_EXPONENT_SCALES) | frozenset(_FLOAT_TYPES)
_UNIFORM_FILE_TYPES: dict[str, int] = {
    "F32": int(gguf.LlamaFileType.ALL_F32),
    "F16": int(gguf.LlamaFileType.MOSTLY_F16),
    "BF16": int(gguf.LlamaFileType.MOSTLY_BF16),
    "Q8_0": int(gguf.LlamaFileType.MOSTLY_Q8_0),
    "Q4_0": int(gguf.LlamaFileType.MOSTLY_Q4_0),
}


def _block_size(type_name: str) -> int:
    return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]][0]


class _RandomBlocks:
    """Random tensor data of any writable type, tiled from one small random pool per type."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._pools: dict[str, np.ndarray] = {}

    def make(self, tensor: _Tensor, type_name: str) -> np.ndarray:
        numpy_shape = tuple(reversed(tensor.shape))
        if not tensor.weight:
            if tensor.name.endswith("_norm.weight"):
                return np.ones(numpy_shape, dtype=np.float32)
            values = self._rng.standard_normal(numpy_shape) * _WEIGHT_STD
            return values.astype(np.float32)
        pool = self._pool(type_name)
        if type_name in _FLOAT_TYPES:
            return self._tiled(pool, int(np.prod(numpy_shape))).reshape(numpy_shape)
        byte_shape = gguf.quant_shape_to_byte_shape(
            numpy_shape, gguf.GGMLQuantizationType[type_name]
        )
        n_blocks = int(np.prod(byte_shape)) // pool.shape[1]
        return self._tiled(pool, n_blocks).reshape(byte_shape)

    def _pool(self, type_name: str) -> np.ndarray:
        if type_name not in self._pools:
            self._pools[type_name] = self._new_pool(type_name)
        return self._pools[type_name]

    def _new_pool(self, type_name: str) -> np.ndarray:
        if type_name in _FLOAT_TYPES:
            values = self._rng.standard_normal(_POOL_VALUES, dtype=np.float32) * _WEIGHT_STD
            if type_name == "BF16":
                return (values.view(np.uint32) >> 16).astype(np.uint16)
            return values.astype(np.float32 if type_name == "F32" else np.float16)
        _, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
        pool = self._rng.integers(0, 256, size=(_POOL_BLOCKS, block_bytes), dtype=np.uint8)
        if type_name in _EXPONENT_SCALES:
            offset, spread = _EXPONENT_SCALES[type_name]
            pool[:, offset] = 127 + round(np.log2(_WEIGHT_STD / spread))
            return pool
        offsets, spread = _BLOCK_SCALES[type_name]
        scale = np.frombuffer(np.float16(_WEIGHT_STD / spread).tobytes(), dtype=np.uint8)
        for offset in offsets:
            pool[:, offset : offset + 2] = scale
        return pool

    def _tiled(self, pool: np.ndarray, count: int) -> np.ndarray:
        start = int(self._rng.integers(0, len(pool)))
        return pool[(start + np.arange(count)) % len(pool)]  # copies `count` entries only


def _add_hparams(writer: gguf.GGUFWriter, shape: SyntheticShape) -> None:
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layers)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    if shape.is_mla:
        _add_latent_attention_hparams(writer, shape)
    else:
        writer.add_key_length(shape.head_size)
        writer.add_value_length(shape.head_size_v)
        writer.add_rope_dimension_count(shape.rope_dim or shape.head_size)
    if shape.is_moe:
        writer.add_expert_count(shape.n_expert)
        writer.add_expert_used_count(shape.n_expert_used)
        writer.add_expert_feed_forward_length(shape.n_ff_expert or shape.n_ff)
    if shape.n_expert_shared or shape.architecture == "deepseek2":
        writer.add_expert_shared_count(shape.n_expert_shared)
    if shape.n_layer_dense_lead:
        writer.add_leading_dense_block_count(shape.n_layer_dense_lead)
    if shape.sliding_window is not None:
        writer.add_sliding_window(shape.sliding_window)
    for key, value in shape.extra_metadata:
        writer.add_uint32(f"{shape.architecture}.{key}", value)


def _add_latent_attention_hparams(writer: gguf.GGUFWriter, shape: SyntheticShape) -> None:
    """llama.cpp's MLA convention: one KV "head" of latent + rope key; V is the latent."""
    assert shape.kv_lora_rank is not None and shape.q_lora_rank is not None
    rope = shape.rope_dim or shape.head_size // 2
    writer.add_kv_lora_rank(shape.kv_lora_rank)
    writer.add_q_lora_rank(shape.q_lora_rank)
    writer.add_key_length(shape.kv_lora_rank + rope)
    writer.add_value_length(shape.kv_lora_rank)
    writer.add_key_length_mla(shape.head_size)
    writer.add_value_length_mla(shape.head_size_v)
    writer.add_rope_dimension_count(rope)


def _add_vocab(writer: gguf.GGUFWriter, n_vocab: int) -> None:
    """An SPM vocabulary: specials, the 256 byte tokens llama.cpp needs, then filler pieces."""
    tokens = [*_SPECIAL_TOKENS, *(f"<0x{byte:02X}>" for byte in range(256))]
    types = [_UNKNOWN_TOKEN_TYPE, _CONTROL_TOKEN_TYPE, _CONTROL_TOKEN_TYPE]
    types += [_BYTE_TOKEN_TYPE] * 256
    filler = _filler_pieces(n_vocab - len(tokens))
    tokens += filler
    types += [_NORMAL_TOKEN_TYPE] * len(filler)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(index) for index in range(len(tokens))])
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)


def _filler_pieces(count: int) -> list[str]:
    """Printable letters, then word-start pieces ("▁a", "▁ab", ...), all distinct."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    pieces = [*letters, *(f"\u2581{letter}" for letter in letters), "\u2581"]
    number = 0
    while len(pieces) < count:
        word, value = "", number
        while True:
            word = letters[value % 26] + word
            value = value // 26 - 1
            if value < 0:
                break
        if len(word) > 1:
            pieces.append("\u2581" + word)
        number += 1
    return pieces[:count]


def _quantize(source: Path, target: Path, quant: str) -> None:
    import llama_cpp

    from hearthside.core.engine import native_log

    native_log.install()  # keep the quantizer's per-tensor chatter off the terminal
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = _llama_file_type(quant)
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    status = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if status != 0:
        raise RuntimeError(f"llama_model_quantize to {quant} failed with status {status}")
