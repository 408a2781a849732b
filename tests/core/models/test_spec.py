"""ModelSpec from GGUF files, checked against what llama.cpp itself reports when it loads them.

Each model is loaded once through the real engine with llama.cpp's log captured: the low-level
API gives n_layer, n_head, n_head_kv, n_embd, vocab, trained context, parameters and size; the
loader's `print_info` lines give expert counts and head sizes; the KV-cache lines give what it
really allocated, which `ModelSpec.kv_cache_bytes` must predict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import gguf
import llama_cpp
import numpy as np
import pytest

from hearthside.core.engine import native_log
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.engine.load_report import KvCacheReport, parse_load_log
from hearthside.core.models.gguf_validator import GGUFValidationError
from hearthside.core.models.spec import (
    LayerSpec,
    ModelSpec,
    ModelSpecError,
    TensorGroup,
    layer_group_of,
    padded_context,
    spec_from_gguf,
    swa_layer_flags,
)
from tests.fixtures.synthetic_gguf import SHAPES, SyntheticShape, write_synthetic_gguf

pytestmark = pytest.mark.beside

MIB = 1024 * 1024
# llama.cpp logs KV sizes in MiB with two decimals (the load report turns them into bytes).
LOGGED_MIB_ROUNDING = 0.005 * MIB + 1
_PRINT_INFO = re.compile(r"print_info: (?P<key>[\w ]+?)\s+= (?P<value>.*)$")


@dataclass
class Loaded:
    spec: ModelSpec
    model: Any  # llama_model_p
    info: dict[str, str]  # print_info key -> value, as llama.cpp logged them
    kv_caches: list[KvCacheReport]
    n_ctx: int


@contextmanager
def loaded(path: Path, **config: Any) -> Iterator[Loaded]:
    """Load `path` with the real engine, capturing llama.cpp's log while it loads."""
    with native_log.captured_lines() as lines:
        engine = Engine(EngineConfig(str(path), n_threads=1, n_threads_batch=1, **config))
    try:
        info = {
            match["key"].strip(): match["value"].strip()
            for line in lines
            if (match := _PRINT_INFO.search(line))
        }
        yield Loaded(
            spec=spec_from_gguf(path),
            model=engine.llama.model,
            info=info,
            kv_caches=parse_load_log(lines).kv_caches,
            n_ctx=engine.n_ctx,
        )
    finally:
        engine.close()


def assert_matches_llama_cpp(run: Loaded) -> None:
    spec, model = run.spec, run.model
    vocab = llama_cpp.llama_model_get_vocab(model)
    assert spec.n_layers == llama_cpp.llama_model_n_layer(model)
    assert spec.n_head == llama_cpp.llama_model_n_head(model)
    assert spec.n_head_kv == llama_cpp.llama_model_n_head_kv(model)
    assert spec.n_embd == llama_cpp.llama_model_n_embd(model)
    assert spec.vocab_size == llama_cpp.llama_vocab_n_tokens(vocab)
    assert spec.context_length == llama_cpp.llama_model_n_ctx_train(model)
    assert spec.total_params == llama_cpp.llama_model_n_params(model)
    assert spec.size_bytes == llama_cpp.llama_model_size(model)
    assert (spec.sliding_window or 0) == llama_cpp.llama_model_n_swa(model)
    assert int(run.info["n_expert"]) == spec.n_expert
    assert int(run.info["n_expert_used"]) == spec.n_expert_used
    assert run.info["n_head_kv"] == str(spec.n_head_kv)
    assert int(run.info["n_embd_head_k"]) == spec.head_dim_k
    assert int(run.info["n_embd_head_v"]) == spec.head_dim_v
    assert int(run.info["n_ff"]) == spec.n_ff
    assert spec.unknown == ()


def assert_kv_cache_predicted(run: Loaded, *, type_k: str, type_v: str, swa_full: bool) -> None:
    """Every KV cache llama.cpp made has the cells, layers and bytes the spec predicts."""
    spec = run.spec
    full_cells, window_cells = spec.kv_cells(run.n_ctx, swa_full=swa_full)
    global_layers = len(spec.layers) - len(spec.swa_layers)
    expected = [(full_cells, global_layers)]
    if spec.swa_layers:
        expected.append((window_cells, len(spec.swa_layers)))
    assert [(cache.cells, cache.layers) for cache in run.kv_caches] == expected
    assert all((c.type_k, c.type_v) == (type_k, type_v) for c in run.kv_caches)
    logged = sum(cache.bytes for cache in run.kv_caches)
    predicted = spec.kv_cache_bytes(run.n_ctx, type_k, type_v, swa_full)
    assert abs(predicted - logged) <= LOGGED_MIB_ROUNDING * len(run.kv_caches)


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("synthetic-models")


def synthetic(models_dir: Path, shape_name: str, quant: str) -> Path:
    path = models_dir / f"{shape_name}-{quant}.gguf"
    if not path.exists():
        write_synthetic_gguf(path, shape_name, quant)
    return path


# --- the default model -----------------------------------------------------------------------


def test_the_default_model_spec_matches_llama_cpp(default_model_file: Path) -> None:
    with loaded(default_model_file, n_ctx=2048, swa_full=False) as run:
        assert_matches_llama_cpp(run)
        assert_kv_cache_predicted(run, type_k="f16", type_v="f16", swa_full=False)
    spec = run.spec
    assert (spec.name, spec.architecture, spec.source) == ("Gemma 3 270m", "gemma3", "gguf")
    assert spec.file_type == "Q4_K_M"
    assert spec.tied_embeddings and spec.output == TensorGroup()
    assert spec.embeddings.quant_types == ("Q8_0",)
    # Gemma 3: every 6th layer attends to the whole context, the rest to a 512-token window.
    assert spec.sliding_window == 512
    assert spec.swa_layers == tuple(i for i in range(18) if i % 6 != 5)
    assert spec.chat_template is None  # a base model
    parts = spec.embeddings.bytes + spec.output_norm.bytes + spec.layer_bytes
    assert parts == spec.size_bytes
    assert spec.active_params == spec.total_params


# --- synthetic models ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape_name", "quant"),
    [
        ("tiny-dense", "Q8_0"),
        ("tiny-moe", "Q4_0"),
        ("tiny-deepseek2", "F16"),
        ("tiny-gpt-oss", "Q8_0"),
    ],
)
def test_synthetic_model_specs_match_llama_cpp(
    models_dir: Path, shape_name: str, quant: str
) -> None:
    path = synthetic(models_dir, shape_name, quant)
    with loaded(path, n_ctx=512) as run:
        assert_matches_llama_cpp(run)
        assert_kv_cache_predicted(run, type_k="f16", type_v="f16", swa_full=True)
    assert run.spec.file_type == quant


def test_moe_spec_counts_experts_and_active_parameters(models_dir: Path) -> None:
    shape = SHAPES["tiny-moe"]
    spec = spec_from_gguf(synthetic(models_dir, "tiny-moe", "Q4_0"))
    assert (spec.n_expert, spec.n_expert_used, spec.n_ff_expert) == (8, 2, 256)
    routed = shape.n_layers * shape.n_expert * 3 * shape.n_embd * 256
    assert spec.routed_expert_params == routed
    assert spec.active_params == (spec.total_params or 0) - routed * 6 // 8
    layer = spec.layers[0]
    assert layer.ffn == TensorGroup() and layer.experts.quant_types == ("Q4_0",)
    assert layer.other.params == shape.n_embd * shape.n_expert  # the router, kept F32
    assert layer.other.quant_types == ("F32",)


def test_deepseek_style_spec_has_latent_attention_shared_experts_and_a_dense_lead(
    models_dir: Path,
) -> None:
    spec = spec_from_gguf(synthetic(models_dir, "tiny-deepseek2", "F16"))
    assert spec.mla and spec.kv_lora_rank == 64
    assert (spec.n_head_kv, spec.head_dim_k) == (1, 64 + 32)  # latent + rope key, no V
    assert (spec.n_layer_dense_lead, spec.n_expert_shared) == (1, 1)
    dense, moe = spec.layers[0], spec.layers[1]
    assert dense.ffn.params > 0 and dense.experts.params == 0
    assert moe.ffn.params == 0 and moe.experts.params > 0 and moe.shared_experts.params > 0
    assert spec.kv_bytes_per_token() == 4 * 96 * 2  # f16 K rows only


def test_gpt_oss_alternates_sliding_and_global_layers(models_dir: Path) -> None:
    spec = spec_from_gguf(synthetic(models_dir, "tiny-gpt-oss", "Q8_0"))
    assert spec.sliding_window == 128
    assert [layer.sliding_window for layer in spec.layers] == [True, False, True, False]
    assert "F32" in spec.layers[0].experts.quant_types  # the experts' biases


# --- the KV cache ----------------------------------------------------------------------------


@pytest.mark.parametrize("n_ctx", [512, 1300])
@pytest.mark.parametrize("kv_type", ["f16", "q8_0", "q4_0"])
def test_kv_cache_size_is_what_llama_cpp_allocates(
    models_dir: Path, n_ctx: int, kv_type: str
) -> None:
    path = synthetic(models_dir, "tiny-dense", "Q8_0")
    # A quantized V cache needs flash attention; f16 runs without, V stored transposed.
    flash_attn = kv_type != "f16"
    config = {"n_ctx": n_ctx, "type_k": kv_type, "type_v": kv_type, "flash_attn": flash_attn}
    with loaded(path, **config) as run:
        assert run.n_ctx == padded_context(n_ctx)
        assert_kv_cache_predicted(run, type_k=kv_type, type_v=kv_type, swa_full=True)
    row_bytes = {"f16": 2 * 128, "q8_0": 34 * 4, "q4_0": 18 * 4}[kv_type]  # 2 heads x 64
    assert run.spec.kv_bytes_per_token(kv_type, kv_type) == 8 * 2 * row_bytes


@pytest.mark.parametrize("swa_full", [False, True])
def test_sliding_window_cache_size_is_what_llama_cpp_allocates(
    models_dir: Path, swa_full: bool
) -> None:
    path = synthetic(models_dir, "tiny-gemma3", "Q8_0")
    config = {"n_ctx": 2048, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": True}
    with loaded(path, **config, swa_full=swa_full) as run:
        assert_kv_cache_predicted(run, type_k="q8_0", type_v="q8_0", swa_full=swa_full)
    window_cells = run.kv_caches[1].cells
    assert window_cells == (2048 if swa_full else padded_context(128 + 512))


def test_latent_attention_cache_holds_k_only(models_dir: Path) -> None:
    path = synthetic(models_dir, "tiny-deepseek2", "F16")
    config = {"n_ctx": 1024, "type_k": "q8_0", "type_v": "q8_0", "flash_attn": True}
    with loaded(path, **config) as run:
        assert_kv_cache_predicted(run, type_k="q8_0", type_v="q8_0", swa_full=True)
    assert run.spec.kv_cache_bytes(1024, "q8_0", "q8_0") == 4 * 1024 * 96 // 32 * 34


def test_kv_bytes_per_token_counts_window_layers_only_within_a_context(
    default_model_file: Path,
) -> None:
    spec = spec_from_gguf(default_model_file)
    per_layer = 2 * 256 * 2  # K + V, one KV head of 256, f16
    assert spec.kv_bytes_per_token() == 3 * per_layer  # the 3 global layers
    assert spec.kv_bytes_per_token(n_ctx=512) == 18 * per_layer  # the window holds it all
    assert spec.kv_bytes_per_token(n_ctx=4096) == 3 * per_layer + 15 * per_layer * 512 // 4096


def test_a_kv_type_that_does_not_exist_is_refused(default_model_file: Path) -> None:
    spec = spec_from_gguf(default_model_file)
    with pytest.raises(ModelSpecError, match="not a ggml tensor type"):
        spec.kv_cache_bytes(1024, "q3_z")


# --- unknown architectures and bad files -----------------------------------------------------


def test_an_unknown_architecture_with_the_usual_keys_is_read_but_its_window_is_unknown(
    tmp_path: Path,
) -> None:
    shape = SyntheticShape("futurenet", 2, 128, 2, 1, 256, sliding_window=64)
    spec = spec_from_gguf(write_synthetic_gguf(tmp_path / "future.gguf", shape, "F16"))
    assert spec.architecture == "futurenet"
    assert (spec.n_layers, spec.n_embd, spec.n_head, spec.n_head_kv) == (2, 128, 2, 1)
    assert spec.sliding_window == 64
    assert spec.unknown == ("sliding_window",)  # which layers slide is the architecture's rule


def test_an_unknown_architecture_with_bare_metadata_degrades_to_unknown_fields(
    tmp_path: Path,
) -> None:
    path = tmp_path / "bare.gguf"
    writer = gguf.GGUFWriter(path, "mysterynet")
    writer.add_uint32("mysterynet.block_count", 2)
    rng = np.random.default_rng(0)
    writer.add_tensor("token_embd.weight", rng.standard_normal((50, 32)).astype(np.float16))
    for index in range(2):
        writer.add_tensor(f"blk.{index}.mixer.weight", np.ones((32, 32), dtype=np.float32))
        writer.add_tensor(f"blk.{index}.ffn_up_exps.weight", np.ones((4, 16, 32), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    spec = spec_from_gguf(path)
    assert (spec.n_layers, spec.n_embd, spec.vocab_size) == (2, 32, 50)  # from the tensors
    assert spec.n_expert == 4 and spec.n_expert_used == 0  # counted, but not how many run
    for name in ("n_head", "n_head_kv", "head_dim_k", "context_length", "active_params"):
        assert getattr(spec, name) is None
        assert name in spec.unknown
    assert {"n_expert", "sliding_window", "n_ff"} <= set(spec.unknown)
    assert spec.layers[0].other.params == 32 * 32  # an unrecognised tensor, still counted
    assert spec.total_params == 50 * 32 + 2 * (32 * 32 + 4 * 16 * 32)
    with pytest.raises(ModelSpecError, match="unknown"):
        spec.kv_cache_bytes(1024)


def test_a_malformed_file_is_refused_by_the_validator(tmp_path: Path) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(b"GGUF" + b"\xff" * 40)
    with pytest.raises(GGUFValidationError):
        spec_from_gguf(path)


# --- pure parts ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tensor", "group"),
    [
        ("attn_q", "attention"),
        ("attn_qkv", "attention"),
        ("attn_kv_a_mqa", "attention"),
        ("attn_sinks", "attention"),
        ("attn_norm", "norms"),
        ("attn_q_a_norm", "norms"),
        ("post_ffw_norm", "norms"),
        ("ffn_gate", "ffn"),
        ("ffn_down", "ffn"),
        ("ffn_gate_exps", "experts"),
        ("ffn_gate_up_exps", "experts"),
        ("ffn_down_shexp", "shared_experts"),
        ("ffn_gate_inp_shexp", "shared_experts"),
        ("ffn_gate_inp", "other"),
        ("exp_probs_b", "other"),
        ("ssm_conv1d", "other"),
    ],
)
def test_block_tensors_fall_into_their_groups(tensor: str, group: str) -> None:
    assert layer_group_of(tensor) == group


def test_swa_patterns_follow_llama_cpp() -> None:
    assert swa_layer_flags(6, 6) == (True,) * 5 + (False,)
    assert swa_layer_flags(4, 2) == (True, False, True, False)
    assert swa_layer_flags(8, 4, dense_first=True) == (False, True, True, True) * 2
    assert swa_layer_flags(3, 0) == (True, True, True)


def test_a_spec_round_trips_through_json(default_model_file: Path) -> None:
    spec = spec_from_gguf(default_model_file)
    again = ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict())))
    assert again == spec
    assert isinstance(again.layers[0], LayerSpec)


def test_a_spec_from_a_newer_hearthside_is_refused(default_model_file: Path) -> None:
    data = replace(spec_from_gguf(default_model_file), schema=99).to_dict()
    with pytest.raises(ModelSpecError, match="schema 99"):
        ModelSpec.from_dict(data)
    with pytest.raises(ModelSpecError, match="not a complete model spec"):
        ModelSpec.from_dict({"name": "x"})
