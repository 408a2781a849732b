"""Choosing among a model's quant variants: plan each, then pick one per goal.

A model often exists in several quantizations (Q8_0, Q4_K_M, Q2_K, ...): registered files, or
ones `core/models/quantize.py` can make from a higher-bit file. `plan_variants` plans every
variant with the planner and picks, per goal, among the plans that fit. Quality is the mean KL
divergence against the model's reference (`autotune/quality.py`) where the autotune DB has it
for a variant (`hearthside quality MODEL --variants ...`; the caller reads it with
`family_quality.variant_qualities`); a variant never measured keeps bits per weight as its
stand-in, and its reason says so:

- fastest: the highest predicted decode speed among the variants within `goals.KLD_BUDGET`
  (an unmeasured one counts as within); when every measured one is over it and none is
  unmeasured, the closest to the reference.
- quality: the lowest KLD whose predicted decode meets the speed floor (`min_decode_tps`);
  an unmeasured variant wins only with more bits than that one; when none meets the floor,
  the fastest, and the reason says so.
- balanced: among the variants that meet the floor and keep near-full quality (measured within
  the budget; unmeasured: at least `BALANCED_MIN_BITS` bits per weight, about Q4), the closest
  to the reference of those within `goals.BALANCED_FLOOR` of the fastest — with no measurement
  among them, simply the fastest: past ~4.5 bits the quality gained per extra bit is small
  while decode time grows with every byte. Below that, the quality rule.
- longest-context: the longest context that fits; ties go to the finer KV cache, then to
  more bits.

A faster variant passed over for its measured quality is named in the reason ("Q4_0: 1.15×
faster, KLD 0.21 — answers noticeably differ; not chosen"). A variant whose plan does not fit
is never picked; when none fits, one that streams from disk is, and when none does either, the
advice names what would.

Like the planner this is pure: specs, profile, calibration and measured qualities come in, a
`VariantChoice` goes out. `makeable_variants` builds the what-if specs of variants that could
be made locally.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hearthside.autotune.goals import (
    BALANCED_FLOOR,
    KLD_BUDGET,
    RunQuality,
    kld_text,
    quality_words,
)
from hearthside.autotune.planner import (
    DEFAULT_FREE_MARGIN_BYTES,
    Goal,
    Plan,
    plan,
)
from hearthside.core.models.descriptor import QUANT_PROFILES, QuantProfile
from hearthside.core.models.spec import LayerSpec, ModelSpec, TensorGroup
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import GIB

DEFAULT_MIN_DECODE_TPS = 10.0  # a reply reads at about this pace; slower feels like waiting
BALANCED_MIN_BITS = 4.3  # IQ4_XS and above: the 4-bit class, where quality loss stays small
# What Hearthside offers to make by re-quantizing a higher-bit file (core/models/quantize.py).
MAKEABLE_TYPES = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "Q3_K_M", "Q2_K")
KV_QUALITY = {"f16": 2, "q8_0": 1, "q4_0": 0}


@dataclass(frozen=True)
class Variant:
    """One quantization of a model, installed or makeable."""

    label: str  # the quant, e.g. "Q4_K_M"; unique among the variants planned together
    spec: ModelSpec
    model_id: str | None = None  # the registered id, when installed
    made_from: str | None = None  # for a makeable variant: the id (or label) it is made from

    @property
    def can_be_made(self) -> bool:
        return self.made_from is not None

    @property
    def bits_per_weight(self) -> float:
        return bits_of(self.spec)


@dataclass(frozen=True)
class VariantOutcome:
    """A variant and the plan the planner made for it."""

    variant: Variant
    plan: Plan
    quality: RunQuality | None = None  # measured against the reference; None: not measured

    @property
    def usable(self) -> bool:
        return self.plan.fits or self.plan.streams_from_disk

    @property
    def decode_tps(self) -> float:
        return self.plan.speed.decode_tps

    def summary(self) -> dict[str, Any]:
        variant = self.variant
        return {
            "variant": variant.label,
            "model_id": variant.model_id,
            "can_be_made": variant.can_be_made,
            "made_from": variant.made_from,
            "bits_per_weight": round(variant.bits_per_weight, 2),
            "size_bytes": variant.spec.size_bytes,
            "fits": self.plan.fits,
            "streams_from_disk": self.plan.streams_from_disk,
            "n_gpu_layers": self.plan.config.n_gpu_layers,
            "n_ctx": self.plan.config.n_ctx,
            "type_k": self.plan.config.type_k,
            "decode_tps": round(self.plan.speed.decode_tps, 1),
            "prefill_tps": round(self.plan.speed.prefill_tps, 1),
            "quality": self.quality.to_dict() if self.quality else None,
        }


@dataclass(frozen=True)
class VariantChoice:
    goal: Goal
    chosen: VariantOutcome  # when nothing is usable: the closest, with `plan.fits` False
    runners_up: tuple[VariantOutcome, ...]  # the other variants, best first for the goal
    reason: str
    min_decode_tps: float
    advice: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        return self.chosen.plan

    def to_dict(self) -> dict[str, Any]:
        return {
            "goal": self.goal,
            "chosen": self.chosen.summary(),
            "reason": self.reason,
            "min_decode_tps": self.min_decode_tps,
            "runners_up": [outcome.summary() for outcome in self.runners_up],
            "advice": list(self.advice),
        }


def plan_variants(
    variants: Sequence[Variant] | Mapping[str, ModelSpec],
    profile: HardwareProfile,
    *,
    goal: Goal = "balanced",
    n_ctx: int | None = None,
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES,
    calibration: dict[str, float] | None = None,
    min_decode_tps: float = DEFAULT_MIN_DECODE_TPS,
    n_parallel: int | None = None,
    qualities: Mapping[str, RunQuality] | None = None,
    kv_priors: Mapping[str, RunQuality] | None = None,
) -> VariantChoice:
    """Plan every variant (a mapping is label → spec of installed variants) and pick one for
    `goal`; see the module docstring for the rule per goal. `qualities`: each measured
    variant's quality by label; `kv_priors`: as the planner's."""
    outcomes = plan_each(
        variants,
        profile,
        goal=goal,
        n_ctx=n_ctx,
        free_margin_bytes=free_margin_bytes,
        calibration=calibration,
        n_parallel=n_parallel,
        qualities=qualities,
        kv_priors=kv_priors,
    )
    return choose_variant(outcomes, goal, min_decode_tps)


def plan_each(
    variants: Sequence[Variant] | Mapping[str, ModelSpec],
    profile: HardwareProfile,
    *,
    goal: Goal = "balanced",
    n_ctx: int | None = None,
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES,
    calibration: dict[str, float] | None = None,
    n_parallel: int | None = None,
    qualities: Mapping[str, RunQuality] | None = None,
    kv_priors: Mapping[str, RunQuality] | None = None,
) -> list[VariantOutcome]:
    """The planner's plan for every variant, in the order given (`n_parallel` and
    `kv_priors` as `plan`'s), with its measured quality from `qualities` (by label)."""
    chosen_from = _as_variants(variants)
    if not chosen_from:
        raise ValueError("plan_variants needs at least one variant")
    measured = qualities or {}
    return [
        VariantOutcome(
            variant,
            plan(
                variant.spec,
                profile,
                goal=goal,
                n_ctx=n_ctx,
                free_margin_bytes=free_margin_bytes,
                calibration=calibration,
                n_parallel=n_parallel,
                kv_priors=kv_priors,
            ),
            measured.get(variant.label),
        )
        for variant in chosen_from
    ]


def choose_variant(
    outcomes: Sequence[VariantOutcome],
    goal: Goal,
    min_decode_tps: float = DEFAULT_MIN_DECODE_TPS,
) -> VariantChoice:
    """The variant `goal` picks among planned `outcomes` (planned for the same goal)."""
    fitting = [outcome for outcome in outcomes if outcome.plan.fits]
    pool = fitting or [outcome for outcome in outcomes if outcome.usable]
    if not pool:
        return _nothing_fits(goal, outcomes, min_decode_tps)
    best, reason = _pick(goal, pool, min_decode_tps)
    reason = " ".join([reason, _quality_note(best, pool), *_passed_over(best, pool)])
    if not fitting:
        reason += " No variant fits in memory; this one streams its weights from disk."
    others = sorted(
        (outcome for outcome in outcomes if outcome is not best),
        key=lambda outcome: (outcome.usable, outcome.decode_tps),
        reverse=True,
    )
    return VariantChoice(
        goal=goal,
        chosen=best,
        runners_up=tuple(others),
        reason=reason,
        min_decode_tps=min_decode_tps,
        advice=tuple(_advice(best, outcomes, min_decode_tps)),
    )


def _as_variants(variants: Sequence[Variant] | Mapping[str, ModelSpec]) -> list[Variant]:
    if isinstance(variants, Mapping):
        return [Variant(label, spec, model_id=spec.ref) for label, spec in variants.items()]
    return list(variants)


def _pick(goal: Goal, pool: Sequence[VariantOutcome], floor: float) -> tuple[VariantOutcome, str]:
    if goal == "fastest":
        return _fastest(pool)
    if goal == "longest-context":
        best = max(
            pool,
            key=lambda o: (
                o.plan.config.n_ctx,
                KV_QUALITY[o.plan.config.type_k],
                o.variant.bits_per_weight,
                o.decode_tps,
            ),
        )
        return best, (
            f"{_name(best)} holds the longest context that fits ({best.plan.config.n_ctx} "
            f"tokens, {best.plan.config.type_k} KV cache), with the finest KV cache and then "
            "the most bits among those that do."
        )
    if goal == "balanced":
        balanced = _balanced(pool, floor)
        if balanced is not None:
            return balanced
    return _highest_quality(pool, floor)


def _fastest(pool: Sequence[VariantOutcome]) -> tuple[VariantOutcome, str]:
    allowed = [o for o in pool if o.quality is None or o.quality.mean_kld <= KLD_BUDGET]
    if not allowed:
        best = _closest(pool)
        return best, (
            f"Every variant measured is over the quality budget (mean KLD ≤ {KLD_BUDGET}); "
            f"{_name(best)} is the closest to the reference ({best.decode_tps:.1f} tok/s decode)."
        )
    best = max(allowed, key=lambda o: (o.decode_tps, o.variant.bits_per_weight))
    checked = any(o.quality and o.quality.source != "reference" for o in pool)
    within = " within the quality budget" if checked else ""
    return best, (
        f"{_name(best)} is predicted fastest{within} ({best.decode_tps:.1f} tok/s decode)."
    )


def _balanced(pool: Sequence[VariantOutcome], floor: float) -> tuple[VariantOutcome, str] | None:
    near_lossless = [o for o in pool if _near_lossless(o) and o.decode_tps >= floor]
    if not near_lossless:
        return None
    if not any(o.quality for o in near_lossless):
        best = max(near_lossless, key=lambda o: (o.decode_tps, o.variant.bits_per_weight))
        return best, (
            f"{_name(best)} is the fastest variant with at least {BALANCED_MIN_BITS:g} bits "
            f"per weight ({best.decode_tps:.1f} tok/s decode, floor {floor:g}): more bits "
            "would cost speed for little quality, fewer would cost quality."
        )
    top = max(o.decode_tps for o in near_lossless)
    best = _closest([o for o in near_lossless if o.decode_tps >= top * BALANCED_FLOOR])
    return best, (
        f"{_name(best)} is the closest to the reference among the variants within the quality "
        f"budget that decode within {1 - BALANCED_FLOOR:.0%} of the fastest of them "
        f"({best.decode_tps:.1f} tok/s decode, floor {floor:g})."
    )


def _near_lossless(outcome: VariantOutcome) -> bool:
    """Within the KLD budget where measured; at least about Q4's bits where not."""
    if outcome.quality is not None:
        return outcome.quality.mean_kld <= KLD_BUDGET
    return outcome.variant.bits_per_weight >= BALANCED_MIN_BITS


def _closest(outcomes: Sequence[VariantOutcome]) -> VariantOutcome:
    """The variant nearest the reference: the lowest measured KLD, unless one not measured
    has more bits than that one (bits stand in for quality until it is measured)."""
    measured = [o for o in outcomes if o.quality is not None]
    unmeasured = [o for o in outcomes if o.quality is None]
    best = min(measured, key=lambda o: (_kld(o), -o.decode_tps), default=None)
    finest = max(unmeasured, key=lambda o: (o.variant.bits_per_weight, o.decode_tps), default=None)
    if best is None or (
        finest is not None and finest.variant.bits_per_weight > best.variant.bits_per_weight
    ):
        assert finest is not None
        return finest
    return best


def _kld(outcome: VariantOutcome) -> float:
    return outcome.quality.mean_kld if outcome.quality is not None else float("inf")


def _highest_quality(pool: Sequence[VariantOutcome], floor: float) -> tuple[VariantOutcome, str]:
    fast_enough = [o for o in pool if o.decode_tps >= floor]
    if fast_enough:
        best = _closest(fast_enough)
        closest = (
            f"is the closest to the reference (mean KLD {kld_text(best.quality.mean_kld)})"
            if best.quality is not None
            else f"has the most bits per weight ({best.variant.bits_per_weight:.2f})"
        )
        return best, (
            f"{_name(best)} {closest} among the variants predicted to decode at least "
            f"{floor:g} tok/s ({best.decode_tps:.1f} tok/s)."
        )
    best = max(pool, key=lambda o: (o.decode_tps, o.variant.bits_per_weight))
    return best, (
        f"No variant is predicted to reach {floor:g} tok/s; {_name(best)} is the fastest "
        f"({best.decode_tps:.1f} tok/s)."
    )


def _quality_note(best: VariantOutcome, pool: Sequence[VariantOutcome]) -> str:
    """What the chosen variant does to the answers, or how to measure it."""
    variant = best.variant
    if best.quality is not None:
        if best.quality.source == "reference":
            return f"{variant.label} is the reference: the model's most precise file."
        reference = next(
            (o.variant.label for o in pool if o.quality and o.quality.source == "reference"),
            "the reference",
        )
        return f"{variant.label} vs {reference}: {quality_words(best.quality)}."
    if variant.model_id:
        how = f"`hearthside quality {variant.model_id} --variants {variant.label}` measures it"
    elif variant.made_from:
        how = (
            f"make it with `hearthside models quantize {variant.made_from} {variant.label}`, "
            f"then `hearthside quality {variant.made_from} --variants {variant.label}` measures it"
        )
    else:
        how = "`hearthside quality` measures an installed variant"
    return f"{variant.label}: quality not measured ({how})."


def _passed_over(best: VariantOutcome, pool: Sequence[VariantOutcome]) -> list[str]:
    """Each faster variant whose measured quality kept it from being chosen."""
    faster = sorted(
        (o for o in pool if o is not best and o.quality and o.decode_tps > best.decode_tps),
        key=lambda o: o.decode_tps,
        reverse=True,
    )
    return [_passed_over_text(o, best) for o in faster]


def _passed_over_text(outcome: VariantOutcome, best: VariantOutcome) -> str:
    assert outcome.quality is not None
    ratio = outcome.decode_tps / best.decode_tps if best.decode_tps else float("inf")
    differ = " — answers noticeably differ" if outcome.quality.mean_kld > KLD_BUDGET else ""
    return (
        f"{outcome.variant.label}: {ratio:.2f}× faster, KLD "
        f"{kld_text(outcome.quality.mean_kld)}{differ}; not chosen."
    )


def _name(outcome: VariantOutcome) -> str:
    variant = outcome.variant
    return f"{variant.label} (can be made)" if variant.can_be_made else variant.label


def _advice(best: VariantOutcome, outcomes: Sequence[VariantOutcome], floor: float) -> list[str]:
    advice = []
    if best.variant.can_be_made:
        advice.append(
            f"{best.variant.label} is not installed: make it from {best.variant.made_from} with "
            "the Models page's “Make a quantized variant…” (it takes minutes, no download)."
        )
    if best.decode_tps < floor:
        has_smaller = any(
            o.variant.bits_per_weight < best.variant.bits_per_weight for o in outcomes
        )
        if has_smaller:
            advice.append(
                f"Even the smaller variants stay under {floor:g} tok/s here: more GPU memory, "
                "or a faster memory tier, is what would reach it."
            )
        else:
            advice.append(
                "A smaller quant (e.g. Q3_K_M or Q2_K) would read fewer bytes per token and "
                "decode faster."
            )
    return advice


def _nothing_fits(goal: Goal, outcomes: Sequence[VariantOutcome], floor: float) -> VariantChoice:
    smallest = min(outcomes, key=lambda o: o.variant.spec.size_bytes or 0)
    short = -min(device.free_bytes for device in smallest.plan.devices)
    advice = [
        f"None of the variants fits: the smallest, {smallest.variant.label}, is "
        f"{short / GIB:.1f} GiB short even at its best settings.",
    ]
    if not smallest.variant.label.upper().startswith(("IQ1", "IQ2", "Q2")):
        advice.append(
            "A smaller quant (Q2_K or an IQ2 type) would be about "
            f"{_size_at(smallest.variant, 'Q2_K') / GIB:.1f} GiB; a shorter context (--ctx) or "
            "more memory may also do."
        )
    else:
        advice.append("Try a shorter context (--ctx), free memory, or a bigger machine.")
    return VariantChoice(
        goal=goal,
        chosen=smallest,
        runners_up=tuple(o for o in outcomes if o is not smallest),
        reason="Nothing fits.",
        min_decode_tps=floor,
        advice=tuple(advice),
    )


def _size_at(variant: Variant, quant: str) -> int:
    return requantized_spec(variant.spec, quant).size_bytes or 0


# --- variants that could be made locally ---------------------------------------------------


def bits_of(spec: ModelSpec) -> float:
    """Bits per weight over the whole file (what a quant costs in memory and bandwidth)."""
    if spec.bits_per_weight:
        return spec.bits_per_weight
    if spec.size_bytes and spec.total_params:
        return spec.size_bytes * 8 / spec.total_params
    profile = QUANT_PROFILES.get((spec.file_type or "").upper())
    return profile.bits if profile else 16.0


def makeable_variants(
    installed: Sequence[Variant], types: Sequence[str] = MAKEABLE_TYPES
) -> list[Variant]:
    """What-if variants of the quant types not installed, made from the installed variant
    with the most bits; only types with fewer bits than that source (more bits cannot bring
    back precision already lost)."""
    if not installed:
        return []
    source = max(installed, key=lambda variant: variant.bits_per_weight)
    have = {variant.label.upper() for variant in installed}
    made = []
    for quant in types:
        profile = QUANT_PROFILES[quant]
        if quant in have or profile.bits >= source.bits_per_weight:
            continue
        made.append(
            Variant(
                label=quant,
                spec=requantized_spec(source.spec, quant),
                made_from=source.model_id or source.label,
            )
        )
    return made


def requantized_spec(spec: ModelSpec, quant: str) -> ModelSpec:
    """`spec` as if re-quantized to `quant`: every weight group at the type's average bits per
    weight (routed experts at its expert bits), norms and other F32 tensors unchanged — the
    same arithmetic descriptors use for what-if models."""
    profile = QUANT_PROFILES[quant]
    layers = tuple(_requantized_layer(layer, profile) for layer in spec.layers)
    embeddings = _requantized(spec.embeddings, profile.bits, profile.types)
    output = _requantized(spec.output, profile.bits, profile.types)
    groups = [embeddings, output, spec.output_norm, spec.other_tensors]
    total = TensorGroup.sum([*groups, *(layer.total for layer in layers)])
    return replace(
        spec,
        name=f"{spec.name} ({quant})",
        file_type=quant,
        bits_per_weight=total.bytes * 8 / total.params if total.params else None,
        size_bytes=total.bytes,
        embeddings=embeddings,
        output=output,
        layers=layers,
        ref=None,
    )


def _requantized_layer(layer: LayerSpec, profile: QuantProfile) -> LayerSpec:
    expert_bits = profile.expert_bits or profile.bits
    expert_types = profile.expert_types or profile.types
    return replace(
        layer,
        attention=_requantized(layer.attention, profile.bits, profile.types),
        ffn=_requantized(layer.ffn, profile.bits, profile.types),
        experts=_requantized(layer.experts, expert_bits, expert_types),
        shared_experts=_requantized(layer.shared_experts, profile.bits, profile.types),
    )


def _requantized(group: TensorGroup, bits: float, types: tuple[str, ...]) -> TensorGroup:
    if not group.params or set(group.quant_types) <= {"F32"}:
        return group  # norms, biases and the router stay F32 in every llama.cpp quant
    return TensorGroup(group.params, round(group.params * bits / 8), tuple(sorted(types)))
