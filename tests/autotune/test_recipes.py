"""Curated recipes: they parse, they apply where they should, and the planner follows them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.planner import plan
from hearthside.autotune.recipes import applies, matching, shipped_recipes
from hearthside.autotune.wisdom import WisdomDB, sync_recipes
from hearthside.core.models.catalog import catalog_ids, catalog_spec
from hearthside.core.probe.spec import expand_spec, load_spec

pytestmark = pytest.mark.beside

SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"


def machine(**spec: object):  # noqa: ANN201
    spec.setdefault("cpu", {"cores": 8, "threads": 16, "flags": ["avx2", "fma"]})
    return expand_spec({"schema": 1, **spec})


def test_every_recipe_has_a_reason_and_known_conditions() -> None:
    recipes = shipped_recipes()
    assert len(recipes) >= 6
    profiles = [load_spec(path) for path in SPECS.glob("*.json")]
    for recipe in recipes:
        assert len(recipe.rationale) > 40
        for model in catalog_ids():
            for profile in profiles:
                applies(recipe, catalog_spec(model), profile)  # raises on an unknown condition


def test_a_quality_sensitive_moe_keeps_a_fine_kv_cache() -> None:
    spec = catalog_spec("qwen3-30b-a3b")
    result = plan(spec, machine(gpus=[{"model": "rtx-3090"}], memory_gb=64), goal="fastest")
    assert result.config.type_k in ("f16", "q8_0")
    assert any(r.value == "kv-f16-for-sensitive-moe" for r in result.reasons)


def test_the_preference_yields_when_nothing_else_fits() -> None:
    """Qwen3 30B-A3B at 40960 tokens on a CPU: with 21 GB only a q4_0 KV cache fits beside the
    weights, and the plan takes it (and says what it costs) rather than streaming from disk;
    with 1 GB more the recipe's q8_0 fits and is kept."""
    spec = catalog_spec("qwen3-30b-a3b")
    tight, roomier = machine(memory_gb=21), machine(memory_gb=22)
    preferred_only = plan(spec, tight, n_ctx=40960, kv_types=("f16", "q8_0"))
    assert not preferred_only.fits  # the premise: the recipe's KV types alone do not fit

    yielded = plan(spec, tight, n_ctx=40960)
    assert yielded.fits and not yielded.streams_from_disk
    assert (yielded.config.type_k, yielded.config.type_v) == ("q4_0", "q4_0")
    (kv_reason,) = [r for r in yielded.reasons if r.setting == "type_k/type_v"]
    assert kv_reason.value == "q4_0" and "fit" in kv_reason.why  # said: it was taken to fit
    assert "kv-f16-for-sensitive-moe" in {r.value for r in yielded.reasons}

    kept = plan(spec, roomier, n_ctx=40960)
    assert kept.fits and (kept.config.type_k, kept.config.type_v) == ("q8_0", "q8_0")


def test_a_multi_socket_machine_spreads_over_its_numa_nodes() -> None:
    profile = machine(memory_gb=256)
    two_nodes = replace(profile, cpu=replace(profile.cpu, numa_nodes=2, sockets=2))
    assert plan(catalog_spec("llama-3.1-8b"), two_nodes).config.numa == "distribute"
    assert plan(catalog_spec("llama-3.1-8b"), profile).config.numa == "off"


def test_recipes_apply_to_their_hardware_only() -> None:
    v100 = machine(gpus=[{"model": "v100-32gb"}], memory_gb=64)
    ids = {recipe.id for recipe in matching(catalog_spec("llama-3.1-8b"), v100)}
    assert "volta-no-bf16" in ids and "kv-f16-for-sensitive-moe" not in ids
    mac = load_spec(SPECS / "mac-m3-ultra.json")
    assert "apple-metal-working-set" in {r.id for r in matching(catalog_spec("qwen3-8b"), mac)}


def test_recipes_are_loaded_into_the_autotune_db(tmp_path: Path) -> None:
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        sync_recipes(wisdom)
        assert [r.id for r in wisdom.recipes()] == sorted(r.id for r in shipped_recipes())


def test_disk_streaming_is_a_reason_only_when_the_model_is_bigger_than_ram() -> None:
    def streaming_reason(model: str) -> bool:
        result = plan(catalog_spec(model), machine(memory_gb=32))
        return any(r.value == "mmap-stream-bigger-than-ram" for r in result.reasons)

    assert streaming_reason("llama-3.1-405b")
    assert not streaming_reason("llama-3.1-8b")
