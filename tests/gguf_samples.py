"""Tiny synthetic GGUF files for tests: real files written with the `gguf` package."""

from __future__ import annotations

import ctypes
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

import gguf
import llama_cpp
import numpy as np

from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir

_BYTE_TOKEN_TYPE = 6
_NORMAL_TOKEN_TYPE = 1
_CONTROL_TOKEN_TYPE = 3
_UNKNOWN_TOKEN_TYPE = 2


LLAMA_FTYPE = {"F16": 1, "Q4_0": 2, "Q8_0": 7}  # llama.cpp's LLAMA_FTYPE_MOSTLY_*


def quantize_file(source: Path, target: Path, quant: str) -> Path:
    """`source` re-quantized to `quant` by llama.cpp (a second or two for SmolLM2)."""
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE[quant]
    params.allow_requantize = True
    params.nthread = 2
    written = llama_cpp.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    assert written == 0
    return target


def register_tiny_variants(files: dict[str, Path]) -> dict[str, Path]:
    """Install synthetic `tiny-q8_0`/`tiny-q4_0` files in the model store: Q8_0 as the
    original, Q4_0 as a variant quantized from it. Returns the installed paths by quant."""
    installed = {}
    with ModelStore(data_dir()) as store:
        for quant, source in files.items():
            target = store.models_dir / source.name
            shutil.copyfile(source, target)
            store.register_installed(
                target,
                model_id=source.stem,
                source="file" if quant == "Q8_0" else "quantized:tiny-q8_0",
                variant_of=None if quant == "Q8_0" else "tiny-q8_0",
                check_native=False,
            )
            installed[quant] = target
    return installed


def write_tiny_gguf(
    path: Path,
    *,
    seed: int = 0,
    loadable: bool = False,
    name: str | None = None,
    chat_template: str | Sequence[Mapping[str, str]] | None = None,
) -> Path:
    """A valid GGUF of two small F32 tensors. Seeds give different bytes (and sha256).

    With `loadable`, it is instead a complete one-layer llama model (about 0.8 MB) with an SPM
    vocabulary (with the 256 byte tokens), which llama.cpp loads and runs; without, llama.cpp
    refuses it even though it is structurally sound. `chat_template` is its
    `tokenizer.chat_template`, or a list of {"name", "template"} for named ones as well
    (`tokenizer.chat_template.<name>`; the one named "default" is the plain key).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"Tiny Test {seed}" if name is None else name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    rng = np.random.default_rng(seed)
    if loadable:
        _add_llama_hparams_and_vocab(writer)
        _add_llama_tensors(writer, rng)
    else:
        writer.add_tensor("token_embd.weight", rng.standard_normal((8, 16)).astype(np.float32))
        writer.add_tensor("output_norm.weight", rng.standard_normal(16).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# Heads of 32 values: with 16, this llama.cpp build loads the model but fails to decode.
_HIDDEN = 128
_FEED_FORWARD = 256
_TOKENS = ["<unk>", "<s>", "</s>", *(f"<0x{byte:02X}>" for byte in range(256)), "▁hi"]


def _add_llama_hparams_and_vocab(writer: gguf.GGUFWriter) -> None:
    writer.add_context_length(64)
    writer.add_embedding_length(_HIDDEN)
    writer.add_block_count(1)
    writer.add_feed_forward_length(_FEED_FORWARD)
    writer.add_head_count(4)
    writer.add_head_count_kv(4)
    writer.add_layer_norm_rms_eps(1e-5)
    tokens = _TOKENS
    types = [_UNKNOWN_TOKEN_TYPE, _CONTROL_TOKEN_TYPE, _CONTROL_TOKEN_TYPE]
    types += [_BYTE_TOKEN_TYPE] * 256 + [_NORMAL_TOKEN_TYPE]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def _add_llama_tensors(writer: gguf.GGUFWriter, rng: np.random.Generator) -> None:
    def tensor(name: str, *shape: int) -> None:
        writer.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))

    tensor("token_embd.weight", len(_TOKENS), _HIDDEN)
    tensor("output_norm.weight", _HIDDEN)
    tensor("blk.0.attn_norm.weight", _HIDDEN)
    for name in ("q", "k", "v", "output"):
        tensor(f"blk.0.attn_{name}.weight", _HIDDEN, _HIDDEN)
    tensor("blk.0.ffn_norm.weight", _HIDDEN)
    tensor("blk.0.ffn_gate.weight", _FEED_FORWARD, _HIDDEN)
    tensor("blk.0.ffn_up.weight", _FEED_FORWARD, _HIDDEN)
    tensor("blk.0.ffn_down.weight", _HIDDEN, _FEED_FORWARD)
