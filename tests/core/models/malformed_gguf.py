"""Small llama GGUF files that llama.cpp loads and runs, and damaged copies of them.

`write_small_llama` writes a complete two-layer F32 model (about 1.4 MB) with an SPM byte
vocabulary; `metadata` replaces (or, with REMOVE, drops) single metadata keys, and
`tensor_layers` writes fewer or more `blk.N` layers than `block_count` says. The byte-level
damage (truncation, flipped header bytes, counts and offsets past the end) works on the bytes
of such a file.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np

REMOVE = object()

ARCH = "llama"
HIDDEN = 128
FEED_FORWARD = 256
LAYERS = 2
HEADS = 4

_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), "▁hi"]
_TOKEN_TYPES = [2, 3, 3, *([6] * 256), 1]  # unknown, control x2, 256 bytes, normal

T = gguf.GGUFValueType


def base_metadata() -> dict[str, tuple[object, gguf.GGUFValueType]]:
    return {
        "general.name": ("Small Llama", T.STRING),
        "general.file_type": (int(gguf.LlamaFileType.ALL_F32), T.UINT32),
        f"{ARCH}.context_length": (256, T.UINT32),
        f"{ARCH}.embedding_length": (HIDDEN, T.UINT32),
        f"{ARCH}.block_count": (LAYERS, T.UINT32),
        f"{ARCH}.feed_forward_length": (FEED_FORWARD, T.UINT32),
        f"{ARCH}.attention.head_count": (HEADS, T.UINT32),
        f"{ARCH}.attention.head_count_kv": (HEADS, T.UINT32),
        f"{ARCH}.attention.layer_norm_rms_epsilon": (1e-5, T.FLOAT32),
        "tokenizer.ggml.model": ("llama", T.STRING),
        "tokenizer.ggml.tokens": (_TOKENS, T.ARRAY),
        "tokenizer.ggml.scores": ([0.0] * len(_TOKENS), T.ARRAY),
        "tokenizer.ggml.token_type": (_TOKEN_TYPES, T.ARRAY),
        "tokenizer.ggml.bos_token_id": (1, T.UINT32),
        "tokenizer.ggml.eos_token_id": (2, T.UINT32),
        "tokenizer.ggml.unknown_token_id": (0, T.UINT32),
    }


def write_small_llama(
    path: Path,
    *,
    metadata: Mapping[str, object] | None = None,
    tensor_layers: int = LAYERS,
    attention: bool = True,
    weights: bool = True,
    seed: int = 0,
) -> Path:
    """A complete small llama GGUF; `metadata` values are (value, GGUFValueType) or REMOVE.

    Without `attention` the layers have no attention weights (as a recurrent model's);
    without `weights` the file has no tensors at all (as llama.cpp's vocabulary files).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    entries = base_metadata()
    for key, change in (metadata or {}).items():
        if change is REMOVE:
            entries.pop(key, None)
        else:
            entries[key] = change  # type: ignore[assignment]
    writer = gguf.GGUFWriter(path, ARCH)
    for key, (value, value_type) in entries.items():
        sub_type = _array_type(value) if value_type == T.ARRAY else None
        writer.add_key_value(key, value, value_type, sub_type=sub_type)
    if weights:
        _add_tensors(writer, tensor_layers, attention, np.random.default_rng(seed))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _array_type(values: object) -> gguf.GGUFValueType:
    first = next(iter(values))  # type: ignore[call-overload]
    if isinstance(first, str):
        return T.STRING
    if isinstance(first, float):
        return T.FLOAT32
    return T.INT32


def _add_tensors(
    writer: gguf.GGUFWriter, layers: int, attention: bool, rng: np.random.Generator
) -> None:
    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", len(_TOKENS), HIDDEN)
    tensor("output_norm.weight", HIDDEN)
    for layer in range(layers):
        tensor(f"blk.{layer}.attn_norm.weight", HIDDEN)
        for name in ("q", "k", "v", "output") if attention else ():
            tensor(f"blk.{layer}.attn_{name}.weight", HIDDEN, HIDDEN)
        tensor(f"blk.{layer}.ffn_norm.weight", HIDDEN)
        tensor(f"blk.{layer}.ffn_gate.weight", FEED_FORWARD, HIDDEN)
        tensor(f"blk.{layer}.ffn_up.weight", FEED_FORWARD, HIDDEN)
        tensor(f"blk.{layer}.ffn_down.weight", HIDDEN, FEED_FORWARD)


# --- byte-level damage -----------------------------------------------------------------------


def header_fields(data: bytes) -> tuple[int, int, int]:
    """(version, tensor_count, kv_count) of a GGUF file's bytes."""
    version, tensors, kvs = struct.unpack_from("<IQQ", data, 4)
    return version, tensors, kvs


def with_bytes(data: bytes, offset: int, replacement: bytes) -> bytes:
    return data[:offset] + replacement + data[offset + len(replacement) :]


def flip_byte(data: bytes, offset: int) -> bytes:
    return with_bytes(data, offset, bytes([data[offset] ^ 0xFF]))


def tensor_info_offsets(data: bytes) -> list[int]:
    """Where each tensor entry's u64 data offset is stored, in table order."""
    _, tensor_count, kv_count = header_fields(data)
    position = _skip_metadata(data, 24, kv_count)
    offsets = []
    for _ in range(tensor_count):
        (name_length,) = struct.unpack_from("<Q", data, position)
        position += 8 + name_length
        (n_dims,) = struct.unpack_from("<I", data, position)
        position += 4 + 8 * n_dims + 4
        offsets.append(position)
        position += 8
    return offsets


_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_metadata(data: bytes, position: int, kv_count: int) -> int:
    for _ in range(kv_count):
        (key_length,) = struct.unpack_from("<Q", data, position)
        position += 8 + key_length
        (value_type,) = struct.unpack_from("<I", data, position)
        position = _skip_value(data, position + 4, value_type)
    return position


def _skip_value(data: bytes, position: int, value_type: int) -> int:
    if value_type == T.STRING:
        (length,) = struct.unpack_from("<Q", data, position)
        return position + 8 + length
    if value_type == T.ARRAY:
        element_type, count = struct.unpack_from("<IQ", data, position)
        position += 12
        for _ in range(count):
            position = _skip_value(data, position, element_type)
        return position
    return position + _SCALAR_SIZES[value_type]
