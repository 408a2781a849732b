"""Golden choices among quant variants: every variant planned, one picked per goal, and never
one that does not fit."""

from __future__ import annotations

import functools
import json

import pytest

from hearthside.autotune.planner import Goal
from hearthside.autotune.variants import (
    Variant,
    VariantOutcome,
    choose_variant,
    makeable_variants,
    plan_each,
    plan_variants,
    requantized_spec,
)
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.descriptor import QUANT_PROFILES
from tests.autotune.test_planner import machine

GIB = 1 << 30


def llama_70b_variants(*quants: str) -> list[Variant]:
    base = catalog_spec("llama-3.1-70b")
    return [
        Variant(q, requantized_spec(base, q), model_id=f"llama-70b-{q.lower()}") for q in quants
    ]


RTX_3090_64GB = machine(gpus=[{"model": "rtx-3090"}], memory_gb=64)
SEVENTY_B = ("F16", "Q8_0", "Q4_K_M", "Q2_K", "IQ2_XS")


@functools.cache
def seventy_b_plans(goal: Goal) -> tuple[VariantOutcome, ...]:
    """The 70B variants planned on the 3090 + 64 GB machine (planned once per goal: the
    choice, not the planning, is what these tests vary)."""
    return tuple(plan_each(llama_70b_variants(*SEVENTY_B), RTX_3090_64GB, goal=goal))


def test_fastest_picks_the_quant_that_fits_wholly_on_the_gpu() -> None:
    choice = choose_variant(seventy_b_plans("fastest"), "fastest")
    assert choice.chosen.variant.label == "IQ2_XS"  # 20 GB: the only one all on the 24 GB GPU
    assert choice.plan.fits and choice.plan.config.n_gpu_layers == -1
    others = {outcome.variant.label: outcome for outcome in choice.runners_up}
    assert all(0 <= o.plan.config.n_gpu_layers < 81 for o in others.values())
    assert choice.chosen.decode_tps > 3 * max(o.decode_tps for o in others.values())
    assert "fastest" in choice.reason


@pytest.mark.parametrize(
    ("floor", "expected"),
    [(10.0, "IQ2_XS"), (2.0, "Q2_K"), (0.4, "Q4_K_M"), (0.1, "Q8_0")],
)
def test_quality_picks_the_most_bits_that_meet_the_speed_floor(floor: float, expected: str) -> None:
    choice = choose_variant(seventy_b_plans("quality"), "quality", min_decode_tps=floor)
    assert choice.chosen.variant.label == expected
    assert choice.chosen.decode_tps >= floor
    faster_with_more_bits = [
        o
        for o in choice.runners_up
        if o.plan.fits
        and o.decode_tps >= floor
        and o.variant.bits_per_weight > choice.chosen.variant.bits_per_weight
    ]
    assert not faster_with_more_bits
    assert f"{floor:g} tok/s" in choice.reason


def test_a_variant_that_does_not_fit_is_never_picked() -> None:
    goals: tuple[Goal, ...] = ("fastest", "quality", "balanced", "longest-context")
    for goal in goals:
        f16 = next(o for o in seventy_b_plans(goal) if o.variant.label == "F16")
        assert not f16.plan.fits  # 141 GB
        for floor in (0.0, 10.0, 1000.0):
            choice = choose_variant(seventy_b_plans(goal), goal, min_decode_tps=floor)
            assert choice.plan.fits, (goal, floor)
            assert choice.chosen.variant.label != "F16"


def test_quality_with_no_variant_fast_enough_takes_the_fastest_and_says_so() -> None:
    choice = plan_variants(
        llama_70b_variants("Q8_0", "Q4_K_M"), RTX_3090_64GB, goal="quality", min_decode_tps=50
    )
    assert choice.chosen.variant.label == "Q4_K_M"
    assert "No variant is predicted to reach 50 tok/s" in choice.reason
    assert any("smaller quant" in line for line in choice.advice)


def test_balanced_takes_the_fastest_near_lossless_variant() -> None:
    spec = catalog_spec("llama-3.1-8b")
    variants = [Variant(q, requantized_spec(spec, q)) for q in ("Q8_0", "Q6_K", "Q4_K_M", "Q2_K")]
    choice = plan_variants(variants, machine(gpus=[{"model": "rtx-3090"}], memory_gb=32))
    assert choice.goal == "balanced"
    assert choice.chosen.variant.label == "Q4_K_M"  # Q2_K is faster but under 4.3 bits
    assert all(o.plan.fits for o in [choice.chosen, *choice.runners_up])


def test_longest_context_prefers_the_variant_that_holds_the_most() -> None:
    spec = catalog_spec("llama-3.1-8b")
    variants = [Variant(q, requantized_spec(spec, q)) for q in ("F16", "Q8_0", "Q4_K_M")]
    t4_16gb = machine(gpus=[{"model": "t4"}], memory_gb=16)
    choice = plan_variants(variants, t4_16gb, goal="longest-context")
    longest = max(o.plan.config.n_ctx for o in [choice.chosen, *choice.runners_up] if o.plan.fits)
    assert choice.plan.config.n_ctx == longest
    assert choice.chosen.variant.label != "F16"


def test_a_mapping_of_installed_specs_is_accepted() -> None:
    spec = catalog_spec("llama-3.1-8b")
    choice = plan_variants(
        {"Q8_0": requantized_spec(spec, "Q8_0"), "Q4_K_M": spec},
        machine(memory_gb=32),
        goal="fastest",
    )
    assert choice.chosen.variant.label == "Q4_K_M"  # CPU only: fewer bytes, faster
    assert not choice.chosen.variant.can_be_made


def test_makeable_variants_come_from_the_most_bits_and_only_go_down() -> None:
    spec = catalog_spec("llama-3.1-8b")
    installed = [
        Variant("Q8_0", requantized_spec(spec, "Q8_0"), model_id="l8-q8"),
        Variant("Q4_K_M", spec, model_id="l8"),
    ]
    made = makeable_variants(installed)
    labels = [variant.label for variant in made]
    assert labels == ["Q6_K", "Q5_K_M", "Q4_0", "Q3_K_M", "Q2_K"]
    assert all(variant.made_from == "l8-q8" and variant.can_be_made for variant in made)
    q2 = next(variant for variant in made if variant.label == "Q2_K")
    assert q2.spec.size_bytes is not None and spec.size_bytes is not None
    assert q2.spec.size_bytes == pytest.approx(
        spec.size_bytes * QUANT_PROFILES["Q2_K"].bits / QUANT_PROFILES["Q4_K_M"].bits, rel=0.02
    )
    assert q2.spec.output_norm == spec.output_norm  # norms stay F32


def test_a_makeable_variant_can_be_chosen_and_is_marked() -> None:
    installed = llama_70b_variants("Q8_0")
    choice = plan_variants(
        installed + makeable_variants(installed), RTX_3090_64GB, goal="quality", min_decode_tps=2
    )
    assert choice.chosen.variant.can_be_made
    assert choice.chosen.variant.made_from == "llama-70b-q8_0"
    assert any("make it from llama-70b-q8_0" in line for line in choice.advice)
    data = json.loads(json.dumps(choice.to_dict()))
    assert data["chosen"]["can_be_made"] is True
    assert {row["variant"] for row in data["runners_up"]} >= {"Q8_0"}


def test_when_no_variant_fits_the_advice_names_a_smaller_quant() -> None:
    base = catalog_spec("llama-3.1-405b")
    variants = [Variant(q, requantized_spec(base, q)) for q in ("Q8_0", "Q4_K_M")]
    small = machine(memory_gb=8)  # the KV cache of 131072 tokens alone is more than the RAM
    choice = plan_variants(variants, small, goal="fastest", n_ctx=131072)
    assert not choice.plan.fits and not choice.plan.streams_from_disk
    assert choice.chosen.variant.label == "Q4_K_M"  # the closest to fitting
    assert any("Q2_K" in line for line in choice.advice)
