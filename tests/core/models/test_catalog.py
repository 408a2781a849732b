"""What-if models: the catalog, descriptors and resolving any model reference to a spec."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hearthside.core.errors import ModelFileError, ModelStoreError
from hearthside.core.models.catalog import (
    catalog_entry,
    catalog_ids,
    catalog_spec,
    parse_catalog,
    resolve_spec,
)
from hearthside.core.models.descriptor import (
    QUANT_PROFILES,
    DescriptorError,
    spec_from_descriptor,
)
from hearthside.core.models.spec import ModelSpec, TensorGroup
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.fixtures.synthetic_gguf import write_synthetic_gguf

pytestmark = pytest.mark.beside

GB = 10**9

# A user's own descriptor for a 70B dense model (Llama 3.1 70B's config.json numbers).
DENSE_70B: dict[str, Any] = {
    "schema": 1,
    "name": "My 70B",
    "architecture": "llama",
    "total_params": 70.6e9,
    "layers": 80,
    "hidden_size": 8192,
    "heads": 64,
    "kv_heads": 8,
    "ffn_size": 28672,
    "context": 131072,
    "vocab_size": 128256,
    "quant": "Q4_K_M",
}

# And one for a 30B-A3B mixture of experts (Qwen3-30B-A3B's numbers).
MOE_30B_A3B: dict[str, Any] = {
    "name": "My 30B-A3B",
    "architecture": "qwen3moe",
    "total_params": 30.5e9,
    "layers": 48,
    "hidden_size": 2048,
    "heads": 32,
    "kv_heads": 4,
    "head_dim": 128,
    "experts": 128,
    "experts_used": 8,
    "expert_ffn_size": 768,
    "context": 40960,
    "vocab_size": 151936,
    "bits_per_weight": 4.8,
}

REQUIRED_IDS = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "gemma-3-1b",
    "gemma-3-4b",
    "gemma-3-12b",
    "gemma-3-27b",
    "mistral-7b",
    "mixtral-8x7b",
    "deepseek-v3",
    "gpt-oss-20b",
    "gpt-oss-120b",
}


# --- the catalog -----------------------------------------------------------------------------


def test_the_catalog_has_the_well_known_models() -> None:
    assert set(catalog_ids()) >= REQUIRED_IDS


@pytest.mark.parametrize("model_id", catalog_ids())
def test_every_catalog_entry_makes_a_consistent_spec(model_id: str) -> None:
    entry = catalog_entry(model_id)
    spec = catalog_spec(model_id)
    assert spec.source == "catalog" and spec.ref == model_id
    assert spec.total_params is not None and spec.active_params is not None
    assert abs(spec.total_params - entry.total_params) <= 0.03 * entry.total_params
    assert spec.unknown == ()
    assert spec.licence
    if spec.n_expert:
        assert spec.active_params < spec.total_params / 2
    else:
        assert spec.active_params == spec.total_params
    assert (
        spec.size_bytes
        == sum(group.bytes for group in (spec.embeddings, spec.output, spec.output_norm))
        + spec.layer_bytes
    )
    assert spec.kv_cache_bytes(4096) > 0
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_catalog_entries_need_unique_ids() -> None:
    entry = {**DENSE_70B, "id": "twice"}
    with pytest.raises(DescriptorError, match="two entries with id 'twice'"):
        parse_catalog({"schema": 1, "models": [entry, entry]})
    with pytest.raises(DescriptorError, match="has no id"):
        parse_catalog({"schema": 1, "models": [DENSE_70B]})


def test_deepseek_v3_has_latent_attention_shared_experts_and_dense_first_layers() -> None:
    spec = catalog_spec("deepseek-v3")
    assert spec.mla and (spec.n_head_kv, spec.head_dim_k) == (1, 512 + 64)
    assert (spec.n_expert, spec.n_expert_used, spec.n_expert_shared) == (256, 8, 1)
    assert [layer.ffn.params > 0 for layer in spec.layers[:4]] == [True, True, True, False]
    assert all(layer.experts.params > 0 for layer in spec.layers[3:])
    assert 36e9 < (spec.active_params or 0) < 39e9  # published: 37B
    assert spec.kv_bytes_per_token() == 61 * 576 * 2  # the latent and rope key only


def test_gpt_oss_alternates_window_and_global_layers() -> None:
    spec = catalog_spec("gpt-oss-120b")
    assert spec.swa_layers == tuple(range(0, 36, 2))
    assert spec.layers[0].experts.quant_types == ("MXFP4",)
    assert spec.kv_cache_bytes(8192, swa_full=False) < spec.kv_cache_bytes(8192, swa_full=True)


def test_gemma_3_keeps_a_window_on_five_layers_in_six() -> None:
    spec = catalog_spec("gemma-3-27b")
    assert len(spec.swa_layers) == 52 and spec.tied_embeddings
    assert spec.output == TensorGroup()


# --- descriptors -----------------------------------------------------------------------------


def test_a_70b_dense_descriptor_plans_without_a_file() -> None:
    spec = spec_from_descriptor(DENSE_70B)
    assert spec.source == "descriptor" and spec.file_type == "Q4_K_M"
    assert spec.total_params == 70_553_706_496  # exactly what Llama 3.1 70B publishes
    assert spec.active_params == spec.total_params
    assert 40 * GB < (spec.size_bytes or 0) < 45 * GB  # Q4_K_M files of it are ~42.5 GB
    assert spec.kv_bytes_per_token() == 80 * 2 * 8 * 128 * 2  # 320 KiB per token at f16
    assert spec.kv_cache_bytes(8192, "q8_0", "q8_0") == 80 * 8192 * 2 * 8 * 128 // 32 * 34
    layer = spec.layers[0]
    assert layer.attention.params == 8192 * (8192 + 2 * 1024) + 8192 * 8192
    assert layer.ffn.params == 3 * 8192 * 28672
    assert layer.norms.quant_types == ("F32",)


def test_a_30b_a3b_moe_descriptor_has_about_3_3b_active_parameters() -> None:
    spec = spec_from_descriptor(MOE_30B_A3B)
    assert 30.0e9 < (spec.total_params or 0) < 31.0e9
    assert 3.2e9 < (spec.active_params or 0) < 3.45e9
    assert spec.file_type is None and spec.bits_per_weight == pytest.approx(4.8, abs=0.05)
    assert spec.layers[0].ffn == TensorGroup()
    assert spec.layers[0].other.params == 2048 * 128  # the router


def test_one_left_out_width_is_solved_from_the_total() -> None:
    exact = {**DENSE_70B, "total_params": 70_553_706_496}
    without_ffn = {k: v for k, v in exact.items() if k != "ffn_size"}
    assert spec_from_descriptor(without_ffn).n_ff == 28672
    without_vocab = {k: v for k, v in exact.items() if k != "vocab_size"}
    assert spec_from_descriptor(without_vocab).vocab_size == 128256


def test_every_quant_profile_gives_a_size_in_proportion() -> None:
    sizes = {
        name: spec_from_descriptor({**DENSE_70B, "quant": name}).size_bytes or 0
        for name in ("F16", "Q8_0", "Q4_K_M", "Q2_K")
    }
    assert sizes["F16"] > sizes["Q8_0"] > sizes["Q4_K_M"] > sizes["Q2_K"]
    assert {"Q4_K_M", "Q8_0", "Q4_0", "F16", "MXFP4_MOE"} <= set(QUANT_PROFILES)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"layers": None}, "layers: Field required"),
        ({"layers": "80"}, "layers:"),
        ({"layers": 0}, "layers:"),
        ({"hiden_size": 8192}, "hiden_size: Extra inputs are not permitted"),
        ({"quant": "Q9_X"}, "quant: 'Q9_X' is not a known type"),
        ({"bits_per_weight": 4.5}, "exactly one of quant and bits_per_weight"),
        ({"kv_heads": 7}, "kv_heads: 7 does not divide heads"),
        ({"experts_used": 2}, "experts_used: needs experts > 0"),
        ({"sliding_window": 4096}, "sliding_window_pattern: needed"),
        ({"schema": 2}, "schema:"),
        ({"total_params": 7e9}, "does not add up"),
        ({"ffn_size": None, "vocab_size": None}, "ffn_size: needed"),
    ],
)
def test_a_malformed_descriptor_names_the_bad_field(change: dict[str, Any], named: str) -> None:
    data = {**DENSE_70B, **change}
    data = {key: value for key, value in data.items() if value is not None}
    with pytest.raises(DescriptorError) as caught:
        spec_from_descriptor(data)
    assert named in caught.value.message
    assert caught.value.hint


def test_moe_descriptors_check_their_expert_numbers() -> None:
    with pytest.raises(DescriptorError, match="experts_used: must be from 1 to experts"):
        spec_from_descriptor({**MOE_30B_A3B, "experts_used": 200})


def test_a_descriptor_file_is_read_and_bad_json_is_reported(tmp_path: Path) -> None:
    good = tmp_path / "mine.json"
    good.write_text(json.dumps(DENSE_70B))
    assert spec_from_descriptor(good).ref == str(good)
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",')
    with pytest.raises(DescriptorError, match="not valid JSON"):
        spec_from_descriptor(bad)
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(DescriptorError, match="must be a JSON object"):
        spec_from_descriptor(listed)


# --- resolving references --------------------------------------------------------------------


def test_any_way_of_naming_a_model_resolves_to_its_spec(tmp_path: Path) -> None:
    gguf_path = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    descriptor_path = tmp_path / "what-if.json"
    descriptor_path.write_text(json.dumps(DENSE_70B))
    with ModelStore(data_dir()) as store:
        record = store.add(gguf_path, link=True, name="Tiny one", check_native=False)
        store.set_default(record.id)
        by_id = resolve_spec(record.id, store)
        by_default = resolve_spec("default", store)
        by_path = resolve_spec(str(gguf_path), store)
        by_catalog = resolve_spec("llama-3.1-70b", store)
        by_descriptor = resolve_spec(str(descriptor_path), store)
    assert (by_id.name, by_id.ref, by_id.source) == ("Tiny one", record.id, "gguf")
    assert by_default == by_id
    assert by_path.total_params == by_id.total_params and by_path.ref == str(gguf_path)
    assert by_catalog.source == "catalog" and by_catalog.n_layers == 80
    assert by_descriptor.source == "descriptor" and by_descriptor.name == "My 70B"
    assert resolve_spec("qwen3-8b").n_layers == 36  # opens the store itself


def test_an_unknown_reference_says_how_to_name_a_model() -> None:
    with pytest.raises(ModelFileError) as caught:
        resolve_spec("qwen3-30b")
    assert "Did you mean" in caught.value.message and "qwen3-30b-a3b" in caught.value.message
    assert "catalog id" in (caught.value.hint or "")
    with pytest.raises(ModelFileError, match="no file at"):
        resolve_spec("./missing/model.gguf")
    with pytest.raises(ModelStoreError, match="No default model"):
        resolve_spec("default")
