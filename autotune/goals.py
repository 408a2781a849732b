"""What each goal trades, as a rule over measured runs: speed, and quality as mean KL divergence
from the reference (`autotune/quality.py`).

- "fastest": the fastest run whose mean KLD stays within `KLD_BUDGET`; runs within the noise
  of that speed (`SAME_SPEED_BAND`) count as equally fast, and the closest to the reference
  among them wins: a gain inside the noise is no reason to quantize the KV cache;
- for every goal, a gain inside the noise is no reason to leave llama.cpp's defaults either:
  when they are as good as the pick and as fast within the band, they are the pick (on the
  Qwen3-30B-A3B-shaped MoE a tune picked batch 512 for such a gain, and natively it decoded
  0.94x the defaults' 2048);
- "balanced": the lowest KLD among the runs within the budget that reach `BALANCED_FLOOR` of
  that speed (and a slow first token counts against a run, `speed`);
- "quality": the lowest KLD among the runs within the budget that reach `QUALITY_FLOOR` of it;
- "longest-context": as "balanced" (the tuner has already planned the longest context).
When no run is within the budget, the goal chooses among those closest to the reference.

A run's quality is measured when the autotune DB has it for its weights and KV-cache type. Until
then a KV type counts at a prior, best first: the model's own measurement (another text or
context), then one measured on another model of the same family on this machine ("q4_0 KV: KLD
0.30 measured on gemma-3-270m (same family, gemma3)", `autotune/family_quality.py` reads them),
then the global `KV_KLD_PRIORS`; each is marked with its source. A quant variant has no prior:
until its quality is measured it counts as over any budget (`unmeasured_quality`). What the
budget cost — the fastest run over the chosen one — is in `Choice.budget_cost`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hearthside.autotune.records import QualityRecord, RunRecord

if TYPE_CHECKING:  # the planner applies the priors: it imports this module
    from hearthside.autotune.planner import Goal

# About what Q4_K_M costs a 7-8B model: llama.cpp's KLD tables put Q4_K_M at 0.01 (Mistral 7B,
# llama.cpp#4739) to ~0.03 (Llama 3 8B, whose perplexity it raises 2.8%, llama.cpp#6936).
# Above 0.05 nats per token the most likely next token differs noticeably more often.
KLD_BUDGET = 0.05
# Decode speed-ups inside this band are measurement noise, not a difference (the verdict says
# "about as fast"): on the Llama 3.1 8B shape one `tune` run picked a q8_0 KV cache for 1.02x
# that natively decoded like f16 (7.44 vs 7.19 and 7.45 tok/s, benchmarks/realistic_models.py).
SAME_SPEED_BAND = (0.95, 1.05)
# the goals that rank runs by decode speed alone (`speed`)
DECODE_ONLY_GOALS = ("fastest", "quality")
BALANCED_FLOOR = 0.95
QUALITY_FLOOR = 0.80
# The priors for a KV cache not measured yet, from `hearthside quality --ctx 512` on the shipped
# models: q8_0 KV 0.025 (Gemma 3 270M Q4_K_M) and 0.006 (SmolLM2 135M Q4_1), q4_0 KV 0.30 and
# 0.087 (perplexity +26% and +6%). q8_0 stays within the budget, q4_0 does not.
KV_KLD_PRIORS: Mapping[str, float] = {"f16": 0.0, "bf16": 0.0, "q8_0": 0.02, "q4_0": 0.2}
UNKNOWN_KV_PRIOR = 0.1  # a KV type without a prior counts as over budget until measured


@dataclass(frozen=True)
class RunQuality:
    """A run's quality against the reference: measured, the reference itself, measured on
    another model of the same family ("family"), the global prior, or not known at all
    ("unmeasured": an infinite KLD, over any budget)."""

    mean_kld: float
    source: str  # "measured", "reference", "family", "prior" or "unmeasured"
    top1_agreement: float | None = None
    perplexity: float | None = None
    measured_on: str | None = None  # for "family": the model it was measured on
    family: str | None = None  # for "family": the architecture both share, e.g. "gemma3"

    @property
    def measured(self) -> bool:
        """Measured on this model (a family figure is a prior here)."""
        return self.source in ("measured", "reference")

    def to_dict(self) -> dict[str, object]:
        return {
            "mean_kld": self.mean_kld if math.isfinite(self.mean_kld) else None,
            "source": self.source,
            "top1_agreement": self.top1_agreement,
            "perplexity": self.perplexity,
            "measured_on": self.measured_on,
            "family": self.family,
        }


def measured_quality(record: QualityRecord) -> RunQuality:
    return RunQuality(record.mean_kld, "measured", record.top1_agreement, record.perplexity)


def family_quality(record: QualityRecord) -> RunQuality:
    """A figure measured on another model of the family, standing in as this one's prior."""
    return RunQuality(
        record.mean_kld,
        "family",
        record.top1_agreement,
        record.perplexity,
        measured_on=model_name(record.reference),
        family=record.architecture,
    )


def reference_quality(perplexity: float | None = None) -> RunQuality:
    return RunQuality(0.0, "reference", 1.0, perplexity)


def unmeasured_quality() -> RunQuality:
    """A quant variant whose quality was not measured: over the budget until it is."""
    return RunQuality(math.inf, "unmeasured")


def prior_quality(kv_type: str) -> RunQuality:
    return RunQuality(KV_KLD_PRIORS.get(kv_type, UNKNOWN_KV_PRIOR), "prior")


def kv_prior(kv_type: str, priors: Mapping[str, RunQuality] | None = None) -> RunQuality:
    """A KV type's quality before it is measured here: `priors` (the model's own or its
    family's figures, `family_quality.kv_priors`), else the global prior."""
    return (priors or {}).get(kv_type) or prior_quality(kv_type)


def model_name(file_name: str) -> str:
    """A model's name from its file's: "gemma-3-270m-Q4_K_M.gguf" → "gemma-3-270m"."""
    stem = re.sub(r"\.gguf$", "", file_name, flags=re.IGNORECASE)
    return re.sub(r"[-._](I?Q\d\w*|F16|BF16|F32)$", "", stem, flags=re.IGNORECASE) or stem


def kld_text(mean_kld: float) -> str:
    """A mean KLD at the precision that tells budgets apart: 0.30, 0.025, 0.0060."""
    places = 2 if mean_kld >= 0.1 else 3 if mean_kld >= 0.01 else 4
    return f"{mean_kld:.{places}f}"


def source_text(quality: RunQuality) -> str:
    """Where a figure comes from, in words."""
    if quality.source == "family":
        return f"measured on {quality.measured_on} (same family, {quality.family})"
    return {
        "measured": "measured on this model",
        "reference": "(the reference)",
        "unmeasured": "not measured yet (counts as over the budget)",
    }.get(quality.source, "(a prior, not measured yet)")


def kv_quality_text(kv_type: str, quality: RunQuality) -> str:
    """E.g. "q4_0 KV: KLD 0.30 measured on gemma-3-270m (same family, gemma3)"."""
    return f"{kv_type} KV: KLD {kld_text(quality.mean_kld)} {source_text(quality)}"


def quality_words(quality: RunQuality) -> str:
    """A run's quality in a few words, for a chart or a table cell: the source shows in the
    words, so a family figure never reads as measured on this model."""
    if quality.source == "reference":
        return "the reference (f16 KV)"
    if quality.source == "unmeasured":
        return "quality not measured (counts as over the budget)"
    kld = kld_text(quality.mean_kld)
    if quality.source == "family":
        return f"KLD ~{kld} (measured on {quality.measured_on}, {quality.family} family)"
    if quality.source == "prior":
        return f"KLD ~{kld} (prior, not measured yet)"
    agreement = quality.top1_agreement
    same_top = f", same top token {agreement:.0%}" if agreement is not None else ""
    return f"KLD {kld}{same_top}"


@dataclass(frozen=True)
class Choice:
    best: RunRecord | None
    fastest: RunRecord | None  # the fastest run whatever its quality
    over_budget: tuple[RunRecord, ...]  # faster than `best` but over the KLD budget

    @property
    def budget_cost(self) -> float | None:
        """How much faster the fastest run was than the pick (1.0: the budget cost nothing)."""
        if not (self.best and self.fastest and self.best.decode_tps and self.fastest.decode_tps):
            return None
        return self.fastest.decode_tps / self.best.decode_tps


def speed(run: RunRecord, goal: Goal) -> float:
    """What a goal calls fast: decode, and for the balanced goals a slow first token too."""
    decode = run.decode_tps or 0.0
    if goal in DECODE_ONLY_GOALS:
        return decode
    return decode + (run.prefill_tps or 0.0) / 20


def choose(
    runs: Sequence[RunRecord],
    quality: Callable[[RunRecord], RunQuality],
    goal: Goal,
    budget: float = KLD_BUDGET,
    defaults: RunRecord | None = None,
) -> Choice:
    """The goal's pick among the measured (`ok`) runs, by the rule in the module docstring;
    `defaults` is llama.cpp's defaults' run, kept when the pick's gain over it is noise."""
    measured = [run for run in runs if run.outcome == "ok" and run.decode_tps]
    fastest = max(measured, key=lambda run: speed(run, goal), default=None)
    within = [run for run in measured if quality(run).mean_kld <= budget] or _closest(
        measured, quality
    )
    top = max((speed(run, goal) for run in within), default=0.0)
    floor = top * {"fastest": 1 / SAME_SPEED_BAND[1], "quality": QUALITY_FLOOR}.get(
        goal, BALANCED_FLOOR
    )
    fast_enough = [run for run in within if speed(run, goal) >= floor]
    best = min(
        fast_enough, key=lambda run: (quality(run).mean_kld, -speed(run, goal)), default=None
    )
    if best is not None and defaults in fast_enough and _as_good(defaults, best, quality, goal):
        best = defaults
    chosen_speed = speed(best, goal) if best is not None else 0.0
    over = tuple(
        run
        for run in measured
        if quality(run).mean_kld > budget and speed(run, goal) > chosen_speed
    )
    return Choice(best, fastest, over)


def _as_good(
    run: RunRecord, best: RunRecord, quality: Callable[[RunRecord], RunQuality], goal: Goal
) -> bool:
    """Whether `run` is as close to the reference as `best` and as fast within the noise."""
    as_close = quality(run).mean_kld <= quality(best).mean_kld
    return as_close and speed(run, goal) * SAME_SPEED_BAND[1] >= speed(best, goal)


def _closest(
    runs: Sequence[RunRecord], quality: Callable[[RunRecord], RunQuality]
) -> list[RunRecord]:
    """When no run is within the budget: those closest to the reference."""
    least = min((quality(run).mean_kld for run in runs), default=0.0)
    return [run for run in runs if quality(run).mean_kld == least]
