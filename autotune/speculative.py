"""Speculative decoding in the tuner: the cost model, the workloads, and the search.

Cost model. A verify step evaluates the sampled token plus k drafted ones in one batch; if
each drafted token is accepted with probability α (independently, the usual model), a step
yields E = (1 − α^(k+1)) / (1 − α) tokens. It costs one batch of k + 1 tokens with logits
(`VerifyCost`, measured against a single-token decode step) plus k draft tokens (`draft_cost`:
~0 for prompt lookup, about the draft/target size ratio for a draft model, whose decode is
memory-bound like the target's). A lookup finds a draft only on some steps (`coverage`);
the others are plain decode steps. So

    speed-up = (c·E + (1 − c)) / (c·(verify(k + 1) + k·draft_cost) + (1 − c)).

Search. For each workload (chat, code edit, summarise — prompts in
`assets/speculative_prompts.json`) the tuner measures decode without speculation, then one
probe per kind of draft; the probe's acceptance gives α and coverage, the cost model picks the
k worth measuring next, and a kind is switched on only where its measured gain over the
reference exceeds `MIN_GAIN`. A draft model that could not pay even if every token were
accepted is not measured at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from typing import Any

from hearthside.autotune.records import TuningKey
from hearthside.core.engine.config import SpeculativeConfig
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.errors import HearthsideError

MIN_GAIN = 1.05  # measured decode speed-up needed to switch speculation on
DRAFT_TOKEN_CHOICES = (2, 3, 4, 6, 8, 12, 16)
PROBE_DRAFT_TOKENS = 4
PROBE_NGRAM_SIZE = 3
PROMPTS_ASSET = "speculative_prompts.json"


# ---- the cost model ------------------------------------------------------------------------


def expected_tokens_per_step(alpha: float, draft_tokens: int) -> float:
    """E[tokens per verify step] = (1 − α^(k+1)) / (1 − α): accepted drafts plus the
    target's own token."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError("alpha must be between 0 and 1")
    if alpha == 1.0:
        return float(draft_tokens + 1)
    return (1.0 - alpha ** (draft_tokens + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class VerifyCost:
    """Time to evaluate a batch of n tokens, logits at each, over one single-token step.

    `points` are measured (n, relative time) pairs; between them it interpolates, past the
    last it extends the last segment's slope.
    """

    points: tuple[tuple[int, float], ...] = ((1, 1.0),)

    def at(self, n_tokens: int) -> float:
        points = sorted(self.points)
        if n_tokens <= points[0][0] or len(points) == 1:
            slope = 0.0 if len(points) == 1 else _slope(points[0], points[1])
            return max(1.0, points[0][1] + slope * (n_tokens - points[0][0]))
        for low, high in zip(points, points[1:], strict=False):
            if n_tokens <= high[0]:
                return low[1] + _slope(low, high) * (n_tokens - low[0])
        last, before = points[-1], points[-2]
        return last[1] + _slope(before, last) * (n_tokens - last[0])

    def to_dict(self) -> dict[str, Any]:
        return {"points": [list(point) for point in self.points]}


def _slope(low: tuple[int, float], high: tuple[int, float]) -> float:
    return (high[1] - low[1]) / (high[0] - low[0]) if high[0] != low[0] else 0.0


def predicted_speedup(
    alpha: float,
    draft_tokens: int,
    *,
    verify_cost: VerifyCost,
    draft_cost: float = 0.0,
    coverage: float = 1.0,
) -> float:
    """Decode speed with speculation over decode speed without (see the module docstring)."""
    gained = expected_tokens_per_step(alpha, draft_tokens)
    step_cost = verify_cost.at(draft_tokens + 1) + draft_tokens * draft_cost
    return (coverage * gained + (1 - coverage)) / (coverage * step_cost + (1 - coverage))


def best_draft_tokens(
    alpha: float,
    *,
    verify_cost: VerifyCost,
    draft_cost: float = 0.0,
    coverage: float = 1.0,
    choices: Sequence[int] = DRAFT_TOKEN_CHOICES,
) -> tuple[int, float]:
    """The k with the highest predicted speed-up, and that speed-up."""
    scored = [
        (
            predicted_speedup(
                alpha, k, verify_cost=verify_cost, draft_cost=draft_cost, coverage=coverage
            ),
            -k,  # on a tie, fewer drafted tokens: less work wasted on a miss
        )
        for k in choices
    ]
    gain, negative_k = max(scored)
    return -negative_k, gain


def best_possible_speedup(
    *, verify_cost: VerifyCost, draft_cost: float, choices: Sequence[int] = DRAFT_TOKEN_CHOICES
) -> float:
    """The speed-up if every drafted token were accepted: an upper bound for a draft."""
    return best_draft_tokens(1.0, verify_cost=verify_cost, draft_cost=draft_cost, choices=choices)[
        1
    ]


def alpha_from_stats(stats: SpeculationStats) -> float | None:
    """α estimated from a run: accepted / (accepted + rejected drafted tokens).

    Under the model each verified drafted token is a trial; a step stops at its first
    rejection, and tokens after it are never judged.
    """
    trials = stats.accepted + stats.rejections
    return stats.accepted / trials if trials else None


def coverage_from_stats(stats: SpeculationStats) -> float:
    """The share of verify steps that had a draft at all."""
    return stats.draft_steps / stats.steps if stats.steps else 0.0


# ---- workloads ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadPrompt:
    """One representative prompt: chat messages for models with a chat template, and a raw
    continuation for base models (whose natural continuation plays the same part)."""

    completion: str
    messages: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Workload:
    id: str  # "chat" | "code_edit" | "summarise"
    title: str
    temperature: float
    max_tokens: int
    prompts: tuple[WorkloadPrompt, ...]
    seed: int = 1


def load_workloads() -> tuple[Workload, ...]:
    """The workloads shipped in `assets/speculative_prompts.json`."""
    text = resources.files("hearthside.assets").joinpath(PROMPTS_ASSET).read_text("utf-8")
    return workloads_from_dict(json.loads(text))


def workloads_from_dict(document: dict[str, Any]) -> tuple[Workload, ...]:
    if document.get("schema") != 1:
        raise HearthsideError(
            "The speculative tuning prompts have an unknown format.",
            hint="Reinstall Hearthside; the file ships with it.",
        )
    return tuple(
        Workload(
            id=item["id"],
            title=item["title"],
            temperature=float(item["temperature"]),
            max_tokens=int(item["max_tokens"]),
            seed=int(item.get("seed", 1)),
            prompts=tuple(
                WorkloadPrompt(
                    completion=prompt["completion"],
                    messages=tuple(
                        (message["role"], message["content"])
                        for message in prompt.get("messages", ())
                    ),
                )
                for prompt in item["prompts"]
            ),
        )
        for item in document["workloads"]
    )


# ---- the search -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One speculative setting measured on one workload."""

    speculative: SpeculativeConfig
    decode_tps: float
    stats: SpeculationStats | None
    predicted_gain: float | None = None
    # decode speed over plain decode in back-to-back pairs; None: compare with the reference
    gain: float | None = None

    def gain_over(self, reference_tps: float) -> float:
        return self.gain if self.gain is not None else self.decode_tps / reference_tps

    def to_dict(self) -> dict[str, Any]:
        return {
            "speculative": asdict(self.speculative),
            "decode_tps": self.decode_tps,
            "gain": self.gain,
            "stats": self.stats.to_dict() if self.stats else None,
            "predicted_gain": self.predicted_gain,
        }


@dataclass(frozen=True)
class SpeculationDecision:
    """What the tuner chose for one workload, and why."""

    workload: str
    chosen: SpeculativeConfig  # mode "off" when nothing paid
    gain: float | None  # measured decode speed-up of `chosen` (None: not measured)
    reference_decode_tps: float | None
    acceptance_rate: float | None
    mean_accepted_length: float | None
    reason: str
    trials: tuple[Trial, ...] = field(default=())

    @property
    def enabled(self) -> bool:
        return self.chosen.mode != "off"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["trials"] = [trial.to_dict() for trial in self.trials]
        return data


@dataclass(frozen=True)
class DraftOption:
    """A draft model the search may try, with its cost per drafted token relative to one
    target decode step (file size ratio when nothing better is known)."""

    path: str
    relative_cost: float


# measure(speculative config, workload) -> a Trial, or None when it could not be measured
Measure = Callable[[SpeculativeConfig, Workload], "Trial | None"]
OutOfTime = Callable[[], bool]
VerifyCostSource = Callable[[], VerifyCost]  # measured lazily: only when a probe needs it


def speculative_key(key: TuningKey, workload: str) -> TuningKey:
    """Where a workload's speculative runs and default live in the autotune DB: apart from
    the model's llama-bench runs, whose speeds come from random tokens, not real text."""
    return TuningKey(key.machine, key.engine, f"{key.model}/speculative/{workload}")


def decide_for_workload(
    workload: Workload,
    measure: Measure,
    *,
    verify_cost: VerifyCostSource,
    drafts: Sequence[DraftOption] = (),
    out_of_time: OutOfTime = lambda: False,
) -> SpeculationDecision:
    """Measure the reference and the promising speculative settings; keep the best > MIN_GAIN."""
    if out_of_time():
        return _off(workload, None, "not measured: the tuning budget ran out")
    reference = measure(SpeculativeConfig(), workload)
    if reference is None or reference.decode_tps <= 0:
        return _off(workload, None, "decode without speculation could not be measured")
    trials: list[Trial] = []
    notes: list[str] = []
    kinds: list[tuple[SpeculativeConfig, float]] = [
        (
            SpeculativeConfig(
                mode="prompt_lookup",
                draft_tokens=PROBE_DRAFT_TOKENS,
                ngram_size=PROBE_NGRAM_SIZE,
            ),
            0.0,
        )
    ]
    for draft in drafts:
        ceiling = best_possible_speedup(verify_cost=verify_cost(), draft_cost=draft.relative_cost)
        if ceiling <= MIN_GAIN:
            notes.append(
                f"draft {_name(draft.path)} not tried: at {draft.relative_cost:.2f}x the "
                f"target's cost per token it could reach only {ceiling:.2f}x even if every "
                "drafted token were accepted"
            )
            continue
        probe = SpeculativeConfig(
            mode="draft_model", draft_tokens=PROBE_DRAFT_TOKENS, draft_model_path=draft.path
        )
        kinds.append((probe, draft.relative_cost))
    for probe, draft_cost in kinds:
        if out_of_time():
            notes.append("the tuning budget ran out")
            break
        trials += _search_kind(probe, draft_cost, workload, measure, verify_cost, out_of_time)
    return _decision(workload, reference, trials, notes)


def _search_kind(
    probe: SpeculativeConfig,
    draft_cost: float,
    workload: Workload,
    measure: Measure,
    verify_cost: VerifyCostSource,
    out_of_time: OutOfTime,
) -> list[Trial]:
    """The probe, then the k the cost model predicts best from the probe's acceptance."""
    first = measure(probe, workload)
    if first is None or first.stats is None:
        return []
    trials = [first]
    alpha = alpha_from_stats(first.stats)
    if alpha is None or out_of_time():
        return trials
    coverage = coverage_from_stats(first.stats) if probe.mode == "prompt_lookup" else 1.0
    best_k, predicted = best_draft_tokens(
        alpha, verify_cost=verify_cost(), draft_cost=draft_cost, coverage=coverage
    )
    if best_k != probe.draft_tokens and predicted > MIN_GAIN:
        followed = measure(_with_draft_tokens(probe, best_k), workload)
        if followed is not None:
            trials.append(_with_prediction(followed, predicted))
    return trials


def _with_draft_tokens(config: SpeculativeConfig, draft_tokens: int) -> SpeculativeConfig:
    return SpeculativeConfig(**{**asdict(config), "draft_tokens": draft_tokens})


def _with_prediction(trial: Trial, predicted: float) -> Trial:
    return replace(trial, predicted_gain=predicted)


def _decision(
    workload: Workload, reference: Trial, trials: list[Trial], notes: list[str]
) -> SpeculationDecision:
    base = reference.decode_tps
    best = max(trials, key=lambda trial: trial.gain_over(base), default=None)
    if best is None:
        return _off(workload, base, "; ".join(notes) or "no speculative setting was measured")
    gain = best.gain_over(base)
    stats = best.stats
    if gain <= MIN_GAIN:
        why = (
            f"off: the best setting ({describe(best.speculative)}) measured {gain:.2f}x, "
            f"not above {MIN_GAIN:.2f}x"
        )
        if stats and stats.acceptance_rate is not None:
            why += f" (acceptance {stats.acceptance_rate:.0%})"
        return _off(workload, base, "; ".join([why, *notes]), tuple(trials), gain)
    why = f"on: {describe(best.speculative)} measured {gain:.2f}x"
    return SpeculationDecision(
        workload=workload.id,
        chosen=best.speculative,
        gain=gain,
        reference_decode_tps=base,
        acceptance_rate=stats.acceptance_rate if stats else None,
        mean_accepted_length=stats.mean_accepted_length if stats else None,
        reason="; ".join([why, *notes]),
        trials=tuple(trials),
    )


def _off(
    workload: Workload,
    reference_tps: float | None,
    reason: str,
    trials: tuple[Trial, ...] = (),
    best_gain: float | None = None,
) -> SpeculationDecision:
    return SpeculationDecision(
        workload=workload.id,
        chosen=SpeculativeConfig(),
        gain=None if best_gain is None else 1.0,
        reference_decode_tps=reference_tps,
        acceptance_rate=None,
        mean_accepted_length=None,
        reason=reason,
        trials=trials,
    )


def describe(config: SpeculativeConfig) -> str:
    """A short human description: "prompt lookup, k=4, n-gram 3"."""
    if config.mode == "prompt_lookup":
        return f"prompt lookup, k={config.draft_tokens}, n-gram {config.ngram_size}"
    if config.mode == "draft_model":
        return f"draft {_name(config.draft_model_path or '')}, k={config.draft_tokens}"
    return "off"


def _name(path: str) -> str:
    return path.replace("\\", "/").rsplit("/", 1)[-1]


def relative_draft_cost(draft_bytes: int, target_bytes: int) -> float:
    """A draft's cost per token over the target's: decode reads every weight once per token,
    so on a memory-bound machine the file size ratio is a fair first guess."""
    if target_bytes <= 0:
        return math.inf
    return draft_bytes / target_bytes
