"""Quant variants are chosen by their measured quality where the autotune DB has it: "fastest"
stays within the KLD budget, "quality" takes the lowest KLD that is fast enough, and a variant
never measured keeps bits per weight and says how to measure it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from hearthside.app.cli import main
from hearthside.autotune.family_quality import variant_qualities
from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.goals import RunQuality, reference_quality
from hearthside.autotune.planner import Goal
from hearthside.autotune.variants import (
    Variant,
    VariantOutcome,
    choose_variant,
    plan_each,
    requantized_spec,
)
from hearthside.autotune.wisdom import QualityRecord, WisdomDB
from hearthside.core.models.catalog import catalog_spec
from tests.autotune.test_planner import machine
from tests.fixtures.synthetic_gguf import write_synthetic_gguf
from tests.gguf_samples import register_tiny_variants

pytestmark = pytest.mark.beside

QUANTS = ("Q8_0", "Q6_K", "Q4_K_M", "Q4_0", "Q2_K")
# What `hearthside quality` reported for Gemma 3 270M's variants, rounded: the shape of real
# figures (fewer bits, more divergence; Q4_0 well over the budget, Q2_K far over it).
MEASURED_KLD = {"Q6_K": 0.004, "Q4_K_M": 0.03, "Q4_0": 0.21, "Q2_K": 0.9}
SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"


def measured(kld: float) -> RunQuality:
    return RunQuality(kld, "measured", 0.9, 10.0)


@functools.cache
def eight_b_plans(goal: Goal) -> tuple[VariantOutcome, ...]:
    """Llama 3.1 8B's variants planned on a 32 GB CPU-only machine: fewer bits, faster."""
    spec = catalog_spec("llama-3.1-8b")
    variants = [Variant(q, requantized_spec(spec, q), model_id=f"l8-{q.lower()}") for q in QUANTS]
    return tuple(plan_each(variants, machine(memory_gb=32), goal=goal))


def with_quality(
    outcomes: tuple[VariantOutcome, ...], klds: dict[str, float]
) -> list[VariantOutcome]:
    def quality(label: str) -> RunQuality | None:
        if label == "Q8_0":
            return reference_quality()
        return measured(klds[label]) if label in klds else None

    return [
        VariantOutcome(outcome.variant, outcome.plan, quality(outcome.variant.label))
        for outcome in outcomes
    ]


def test_fastest_is_the_fastest_variant_within_the_budget_and_names_what_it_passed_over() -> None:
    outcomes = with_quality(eight_b_plans("fastest"), MEASURED_KLD)
    speed = {o.variant.label: o.decode_tps for o in outcomes}
    assert speed["Q2_K"] > speed["Q4_0"] > speed["Q4_K_M"]  # by bits alone Q2_K would win

    choice = choose_variant(outcomes, "fastest")

    assert choice.chosen.variant.label == "Q4_K_M"
    assert "within the quality budget" in choice.reason
    assert "Q4_K_M vs Q8_0: KLD 0.030" in choice.reason
    ratio = speed["Q4_0"] / speed["Q4_K_M"]
    assert f"Q4_0: {ratio:.2f}× faster, KLD 0.21 — answers noticeably differ; not chosen." in (
        choice.reason
    )
    assert "Q2_K: " in choice.reason and "KLD 0.90 — answers noticeably differ" in choice.reason
    assert choice.to_dict()["chosen"]["quality"]["mean_kld"] == 0.03


def test_quality_takes_the_lowest_kld_that_meets_the_speed_floor() -> None:
    outcomes = with_quality(eight_b_plans("quality"), MEASURED_KLD)
    speed = {o.variant.label: o.decode_tps for o in outcomes}
    floor = (speed["Q8_0"] + speed["Q6_K"]) / 2  # the reference is too slow, Q6_K is not

    choice = choose_variant(outcomes, "quality", min_decode_tps=floor)

    assert choice.chosen.variant.label == "Q6_K"
    assert "closest to the reference (mean KLD 0.0040)" in choice.reason
    everything = choose_variant(outcomes, "quality", min_decode_tps=0.1)
    assert everything.chosen.variant.label == "Q8_0"
    assert "Q8_0 is the reference" in everything.reason


def test_balanced_takes_the_closest_within_the_budget_near_the_fastest_of_them() -> None:
    outcomes = with_quality(eight_b_plans("balanced"), MEASURED_KLD)
    choice = choose_variant(outcomes, "balanced", min_decode_tps=0.1)
    assert choice.chosen.variant.label == "Q4_K_M"  # Q4_0 and Q2_K are over the budget
    harmless = with_quality(eight_b_plans("balanced"), {**MEASURED_KLD, "Q4_0": 0.02})
    assert choose_variant(harmless, "balanced", min_decode_tps=0.1).chosen.variant.label == "Q4_0"


def test_an_unmeasured_variant_keeps_the_bits_rule_and_says_how_to_measure_it() -> None:
    without_q4_0 = {k: v for k, v in MEASURED_KLD.items() if k != "Q4_0"}
    outcomes = with_quality(eight_b_plans("fastest"), without_q4_0)

    choice = choose_variant(outcomes, "fastest")

    assert choice.chosen.variant.label == "Q4_0"  # not measured: not held to the budget
    assert (
        "Q4_0: quality not measured (`hearthside quality l8-q4_0 --variants Q4_0` measures it)."
        in choice.reason
    )


def install_tiny_variants(folder: Path) -> dict[str, Path]:
    """A small synthetic model installed as Q8_0 with a Q4_0 variant made from it."""
    return register_tiny_variants(
        {
            quant: write_synthetic_gguf(folder / f"tiny-{quant.lower()}.gguf", "tiny-dense", quant)
            for quant in ("Q8_0", "Q4_0")
        }
    )


def variant_row(reference: Path, candidate: Path, mean_kld: float) -> QualityRecord:
    """The row `hearthside quality tiny-q8_0 --variants Q4_0` stores."""
    return QualityRecord(
        reference_model=model_fingerprint(reference),
        candidate_model=model_fingerprint(candidate),
        kv_type="f16",
        text_hash="f" * 64,
        n_ctx=1024,
        candidate="Q4_0",
        reference=reference.name,
        n_tokens=4000,
        mean_kld=mean_kld,
        kld_p99=2.0,
        top1_agreement=0.7,
        perplexity=30.0,
        reference_perplexity=20.0,
        architecture="llama",
    )


def test_hearthside_plan_reads_the_measured_variants_and_shows_their_kld(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = install_tiny_variants(tmp_path)
    command = ["plan", "tiny-q4_0", "--goal", "fastest", "--installed-only"]
    command += ["--hardware-spec", str(SPECS / "two-rtx-3090.json")]

    assert main(command) == 0
    unmeasured = capsys.readouterr().out
    with WisdomDB() as db:
        db.save_quality(variant_row(files["Q8_0"], files["Q4_0"], 0.21))
        read = variant_qualities(db, files["Q8_0"], files)
    assert main(command) == 0
    checked = capsys.readouterr().out

    assert unmeasured.startswith("Variant   Q4_0 (tiny-q4_0) chosen for goal fastest")
    assert "Q4_0: quality not measured (`hearthside quality tiny-q4_0 --variants Q4_0`" in (
        unmeasured
    )
    assert read["Q8_0"].source == "reference" and read["Q4_0"].mean_kld == 0.21
    assert checked.startswith("Variant   Q8_0 (tiny-q8_0) chosen for goal fastest")
    assert "Q8_0 is the reference" in checked
    assert "× faster, KLD 0.21 — answers noticeably differ; not chosen." in checked
    assert "Q4_0 (tiny-q4_0): " in checked and "KLD 0.21, same top token 70%" in checked
