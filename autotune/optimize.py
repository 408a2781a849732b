"""The one entry point to tuning: what `hearthside tune`, `calibrate` and `plan` and the Optimize
wizard call, without Qt. It joins the three parts of `autotune/` (see `autotune/__init__.py`):
the plan (pure), the measure part (the engines) and the store (`wisdom.db`).

- This machine: `machine_context(profile)` reads its `MachineContext` (profile, calibration
  figures, fingerprints) once; callers pass it on.
- Planning (`hearthside plan`): `plan_model(ModelPlanRequest)` gathers what the planner needs
  from the store (calibration, the model's quant variants and their measured quality, the KV
  types' quality) and plans the model or picks among its variants; `measure_weight_types`
  measures the weight types the calibration lacks first.
- Measuring: `measure(request, cancel, post)` calibrates this machine when asked (`calibrate`),
  then tunes the chosen model (`autotune/tuner.py`), reporting each step as a `MeasureUpdate`
  through `post`; it returns the `TuneResult`. `calibrate(CalibrationRequest, post)` is the
  calibration alone, the same steps for the wizard and `hearthside calibrate`: it stores the
  report in the autotune DB and returns it. `apply_tuning` stores the winner.
- Around them are the facts the wizard's pages show (the `model_choices`, a catalog model's
  plan) and the words of its result (`verdict` — "the defaults are already the best here"
  only when every candidate predicted to beat them was measured, else `coverage_text`'s
  "Measured N of M — about X more minutes would test the rest" —, `settings_rows`, `quality_row`,
  `measured_reasons`, `audit_text`, and for the model's quant variants `variant_text` /
  `variant_pick_text`).

The wizard (`app/gui/wizard.py`) keeps only its pages and a runner that calls `measure` as an
engine job. A recorded run to replay for screenshots lives with the screenshots
(`app/gui/screenshot_recording.py`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hearthside.autotune.busy import busy_from_others, busy_text, joined
from hearthside.autotune.calibration import read_machine_context, store_calibration
from hearthside.autotune.family_quality import kv_priors_of, variant_qualities
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.goals import SAME_SPEED_BAND as SAME_SPEED_BAND
from hearthside.autotune.goals import RunQuality, kld_text
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.memory import WeightPiece, pieces_from_gguf, pieces_from_spec
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, Goal, Plan, Reason, plan
from hearthside.autotune.records import Rigor, RunRecord, config_key
from hearthside.autotune.speed_limit import SpeedOfLight
from hearthside.autotune.tune_wait import (
    WORTH_MEASURING,
    TuneCosts,
    budget_measuring,
    expected_wait,
)

# The tuner's result and events, for the callers of `measure` (the CLI, the wizard).
from hearthside.autotune.tuner import TUNING_CONTEXT as TUNING_CONTEXT
from hearthside.autotune.tuner import NotMeasured as NotMeasured
from hearthside.autotune.tuner import TuneEvent as TuneEvent
from hearthside.autotune.tuner import TuneResult as TuneResult
from hearthside.autotune.tuner import VariantRun as VariantRun
from hearthside.autotune.tuner import llama_cpp_defaults as llama_cpp_defaults
from hearthside.autotune.tuner import save_tuned_defaults, tune, tuning_costs
from hearthside.autotune.type_costs import (
    describe_type_cost,
    measure_type_costs,
    model_weight_types,
)
from hearthside.autotune.variants import (
    DEFAULT_MIN_DECODE_TPS,
    Variant,
    VariantChoice,
    makeable_variants,
    plan_variants,
)
from hearthside.autotune.wisdom import WisdomDB, default_wisdom_path
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError, ModelFileError
from hearthside.core.models.catalog import (
    catalog_entry,
    catalog_ids,
    catalog_spec,
    resolve_spec,
)
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import ModelSpec
from hearthside.core.models.store import (
    DB_FILE_NAME,
    DEFAULT_REF,
    ModelRecord,
    ModelStore,
    registered_file,
)
from hearthside.core.paths import data_dir
from hearthside.core.probe.cpu_use import cpu_use_now, others_cores
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import format_bytes, format_duration
from hearthside.kernels import calibrate as calibration_kernels
from hearthside.kernels.calibrate import run_calibration
from hearthside.kernels.results import CalibrationReport

CALIBRATION_BUDGET_S = calibration_kernels.DEFAULT_BUDGET_S  # a whole one: the probes too
MAX_SUGGESTIONS = 6
GOAL_NAMES: dict[Goal, str] = {
    "fastest": "fastest",
    "balanced": "balanced",
    "quality": "best quality",
    "longest-context": "longest context",
}


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelChoice:
    ref: str  # the registered id, or the catalog id
    name: str
    detail: str
    path: Path | None  # None: a catalog model, nothing to measure
    available: bool = True  # False: registered, but its file is gone
    is_default: bool = False

    @property
    def installed(self) -> bool:
        return self.path is not None


@dataclass(frozen=True)
class MeasureRequest:
    model_path: Path | None  # None: calibrate only (a catalog model gets a plan afterwards)
    profile: HardwareProfile
    goal: Goal
    budget_s: float
    calibrate: bool
    rigor: Rigor = "quick"
    save_default: bool = False  # the wizard saves on Apply; `hearthside tune` at once


@dataclass(frozen=True)
class CalibrationRequest:
    """A calibration of this machine: `hearthside calibrate`, or the wizard's first step."""

    profile: HardwareProfile
    model_path: Path | None  # the engine's run; None: the store's default model, if any
    budget_s: float
    quick: bool = False  # the shipped model alone, no speed probes


@dataclass(frozen=True)
class MeasureUpdate:
    """What the measuring job reports, from the engine thread."""

    kind: Literal["started", "calibrating", "calibrated", "candidate"]
    text: str = ""
    fraction: float | None = None
    event: TuneEvent | None = None  # with its run's memory, or the kind of its failure


@dataclass(frozen=True)
class AppliedTuning:
    """What Apply saved: `config` measured best for `model_id`, now its default here (the
    window reloads `model_id`, which picks the saved settings up)."""

    model_id: str
    model_name: str
    config: EngineConfig
    speedup: float | None


@dataclass(frozen=True)
class SettingRow:
    name: str
    default: str
    chosen: str

    @property
    def changed(self) -> bool:
        return self.default != self.chosen


# ---- facts, pure or blocking (worker threads) -------------------------------------------------


def machine_context(profile: HardwareProfile) -> MachineContext:
    """This machine's context (`MachineContext`): read it once, pass it on."""
    with WisdomDB() as db:
        return read_machine_context(profile, db)


def wisdom_path() -> Path:
    """Where the autotune DB is (the CLI names it)."""
    return default_wisdom_path()


def model_choices(profile: HardwareProfile, calibration: Mapping[str, float]) -> list[ModelChoice]:
    """The registered models, then catalog models the planner says fit, fastest first."""
    with ModelStore(data_dir()) as store:
        records = store.list()
    choices = [_registered_choice(record) for record in records]
    return choices + catalog_suggestions(profile, dict(calibration))


def _registered_choice(record: ModelRecord) -> ModelChoice:
    parts = [format_bytes(record.size_bytes), record.quant, record.architecture]
    detail = " · ".join(part for part in parts if part)
    if record.is_default:
        detail += " · default"
    if not record.path.is_file():
        missing = "file missing: add it again on the Models page"
        return ModelChoice(record.id, record.name, missing, record.path, available=False)
    return ModelChoice(record.id, record.name, detail, record.path, is_default=record.is_default)


def catalog_suggestions(
    profile: HardwareProfile, calibration: dict[str, float]
) -> list[ModelChoice]:
    fitting = []
    for model_id in catalog_ids():
        planned = plan(catalog_spec(model_id), profile, calibration=calibration)
        if planned.fits:
            fitting.append((planned.speed.decode_tps, model_id))
    fitting.sort(reverse=True)
    return [_catalog_choice(model_id, speed) for speed, model_id in fitting[:MAX_SUGGESTIONS]]


def _catalog_choice(model_id: str, decode_tps: float) -> ModelChoice:
    entry = catalog_entry(model_id)
    detail = f"not installed · {entry.quant or 'GGUF'} · about {decode_tps:.0f} tok/s here"
    return ModelChoice(model_id, entry.name, detail, None)


def plan_for_catalog(choice: ModelChoice, machine: MachineContext, goal: Goal) -> Plan:
    return plan(
        catalog_spec(choice.ref), machine.profile, goal=goal, calibration=machine.calibration
    )


# ---- planning a model (`hearthside plan`) -----------------------------------------------------


@dataclass(frozen=True)
class ModelPlanRequest:
    """A model to plan (anything `resolve_spec` takes) on `profile`: this machine, a recorded
    profile or a what-if spec (which finds no calibration: its fingerprint differs)."""

    ref: str
    profile: HardwareProfile
    goal: Goal = "balanced"
    n_ctx: int | None = None
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES
    n_parallel: int | None = None
    min_decode_tps: float = DEFAULT_MIN_DECODE_TPS  # the quality goal's floor among variants
    installed_only: bool = False  # leave out the quants that could be made locally


def plan_model(request: ModelPlanRequest) -> Plan | VariantChoice:
    """The plan for the model, or, when it has installed quant variants, the goal's pick among
    them (and the quants that could be made from the one with the most bits) with its plan."""
    machine = machine_context(request.profile)
    variants = model_variants(request.ref)
    if len(variants) > 1:
        if not request.installed_only:
            variants += makeable_variants(variants)
        return plan_variants(
            variants,
            request.profile,
            goal=request.goal,
            n_ctx=request.n_ctx,
            free_margin_bytes=request.free_margin_bytes,
            calibration=machine.calibration,
            min_decode_tps=request.min_decode_tps,
            n_parallel=request.n_parallel,
            qualities=measured_variant_qualities(request.ref, variants),
            kv_priors=_kv_priors(request.ref, variants[0].spec),
        )
    spec = variants[0].spec if variants else resolve_spec(request.ref)
    return plan(
        spec,
        request.profile,
        goal=request.goal,
        n_ctx=request.n_ctx,
        free_margin_bytes=request.free_margin_bytes,
        calibration=machine.calibration,
        pieces=_file_pieces(request.ref),
        n_parallel=request.n_parallel,
        kv_priors=_kv_priors(request.ref, spec),
    )


def measure_weight_types(ref: str, profile: HardwareProfile) -> list[str]:
    """Measure the model's weight types this machine's calibration lacks (kept in the DB, so
    later plans say "measured" for them): a sentence per type measured, [] when every one was
    measured already."""
    pieces = _file_pieces(ref) or pieces_from_spec(resolve_spec(ref))
    with WisdomDB() as wisdom:
        costs = measure_type_costs(model_weight_types(pieces), profile, wisdom)
    return [describe_type_cost(cost) for cost in costs]


def _file_pieces(ref: str) -> list[WeightPiece] | None:
    """A GGUF file's own tensors, so each is costed at its own type (a spec groups them)."""
    path = Path(ref)
    if not (ref.lower().endswith(".gguf") and path.is_file()):
        return None
    return pieces_from_gguf(validate_gguf(path))


def model_variants(ref: str) -> list[Variant]:
    """The installed quant variants of the model `ref` names, itself included; [] when `ref`
    is not an installed model (a path, a catalog id, a descriptor)."""
    if Path(ref).is_file() or not (data_dir() / DB_FILE_NAME).exists():
        return []
    with ModelStore(data_dir()) as store:
        if ref != DEFAULT_REF and store.find(ref) is None:
            return []
        family = store.family(store.resolve(ref))
        labels = [record.quant or record.id for record in family]
        return [
            Variant(
                label if labels.count(label) == 1 else record.id,
                resolve_spec(record.id, store),
                model_id=record.id,
            )
            for label, record in zip(labels, family, strict=True)
        ]


def measured_variant_qualities(ref: str, variants: Sequence[Variant]) -> dict[str, RunQuality]:
    """Each installed variant's quality against the model's reference, where the autotune DB
    has it (`hearthside quality MODEL --variants ...` measures them)."""
    from hearthside.autotune.quality import QualityError, choose_reference  # loads the engine

    with ModelStore(data_dir()) as store:
        family = store.family(store.resolve(ref))
    try:
        reference = choose_reference(family)
    except QualityError:
        return {}  # every file was re-quantized from one that is gone: nothing to compare
    files = {record.id: record.path for record in family if record.path.is_file()}
    paths = {v.label: files[v.model_id] for v in variants if v.model_id in files}
    if not reference.path.is_file():
        return {}
    with WisdomDB() as wisdom:
        return variant_qualities(wisdom, reference.path, paths)


def _kv_priors(ref: str, spec: ModelSpec) -> dict[str, RunQuality]:
    """The KV types' quality measured on this model, else on its family, on this machine."""
    with WisdomDB() as wisdom:
        return kv_priors_of(wisdom, spec.architecture, registered_file(ref))


# ---- the wait, said before it starts -------------------------------------------------------


def tune_costs(
    model_path: Path,
    profile: HardwareProfile,
    goal: Goal,
    *,
    calibrate_first: bool,
    rigor: Rigor = "quick",
) -> TuneCosts:
    """What tuning `model_path` costs here, said before it starts (`autotune/tune_wait.py`).
    Blocking (reads the model and the autotune DB)."""
    with WisdomDB() as db:
        return tuning_costs(
            model_path,
            profile,
            db,
            goal=goal,
            rigor=rigor,
            calibration_s=CALIBRATION_BUDGET_S if calibrate_first else 0.0,
        )


@dataclass(frozen=True)
class WaitText:
    text: str
    too_short: bool  # the budget misses llama.cpp's defaults or the two ranked best
    better_budget_s: float | None  # the shortest budget that measures them, when one does


def wait_text(budget_s: float, costs: TuneCosts, *, step_s: float, max_s: float) -> WaitText:
    """What a person waits in all for `budget_s` and what that measures, before starting.
    When it cannot measure llama.cpp's defaults and the two settings the predictions rank
    best, it says so, and which budget (in steps of `step_s`, up to `max_s`) would."""
    wait = expected_wait(budget_s, costs)
    head = f"You wait about {format_duration(wait.total_s)}"
    if costs.calibration_s:
        head += (
            f": about {format_duration(costs.calibration_s)} calibrating, then "
            f"{format_duration(budget_s)} measuring"
        )
    wanted = min(WORTH_MEASURING, costs.candidates)
    if wait.measured >= wanted:
        others = wait.measured - 1
        text = (
            f"{head}. That measures llama.cpp's defaults and about {others} of the "
            f"{costs.candidates - 1} other settings, those predicted fastest first."
        )
        return WaitText(text, False, budget_s)
    one = f"one setting takes about {format_duration(costs.candidate_s)} here"
    needed = budget_measuring(costs, wanted, step_s=step_s, max_s=max_s)
    if needed is None:
        tail = (
            f"even {format_duration(max_s)} would not reach the next setting predicted "
            f"fastest ({one})"
        )
    else:
        tail = (
            f"{format_duration(needed)} would also measure the next setting predicted "
            f"fastest ({one})"
        )
    rest = wait.measured - 1
    measured_too = f"{rest} other setting{'s' if rest != 1 else ''}"
    text = f"{head}, which measures only llama.cpp's defaults and {measured_too}: {tail}."
    return WaitText(text, True, needed)


# ---- the result's words ------------------------------------------------------------------------


def settings_rows(chosen: Mapping[str, Any], default: Mapping[str, Any]) -> list[SettingRow]:
    """The settings a person can judge, chosen vs llama.cpp's defaults."""
    fields = (
        ("Context", lambda c: f"{c.get('n_ctx')} tokens"),
        ("Decode threads", lambda c: _threads(c.get("n_threads"), "physical cores")),
        ("Prompt threads", lambda c: _threads(c.get("n_threads_batch"), "every core")),
        ("Batch / micro-batch", lambda c: f"{c.get('n_batch')} / {c.get('n_ubatch')}"),
        ("Flash attention", lambda c: "on" if c.get("flash_attn") else "off"),
        ("KV cache", lambda c: f"{c.get('type_k')} / {c.get('type_v')}"),
        ("Layers on the GPU", lambda c: _gpu_layers(c.get("n_gpu_layers"))),
    )
    return [SettingRow(name, show(default), show(chosen)) for name, show in fields]


def audit_text(result: TuneResult) -> str:
    """The context check's verdict, or why there is none."""
    if result.audit is not None:
        return result.audit.message
    note = next((n.reason for n in result.notes if n.phase == "audit"), None)
    return f"{note}." if note else "not run (no winner, or measuring was stopped)."


def verdict(result: TuneResult) -> tuple[str, str]:
    """The result page's headline and the line under it (which names a winning variant), and
    how many candidates were measured when the budget cut some off."""
    headline, detail = _verdict(result)
    coverage = coverage_text(result)
    if coverage and headline != coverage:
        detail += f" {coverage}."
    return headline, detail + _pick_text(result)


def coverage_text(result: TuneResult) -> str:
    """E.g. "Measured 1 of 10 — about 2 more minutes would test the rest"; "" when the budget
    cut no candidate off."""
    if not result.not_measured:
        return ""
    measured = sum(
        1 for run in result.runs if run.outcome == "ok" and run.key.model == result.key.model
    )
    total = max(result.candidates, measured + len(result.not_measured))
    return f"Measured {measured} of {total} — {_more_time(result)} would test the rest"


def _more_time(result: TuneResult) -> str:
    seconds = result.candidate_s * len(result.not_measured)
    if seconds <= 0:  # nothing measured now to time a candidate by
        return "more time"
    minutes = math.ceil(seconds / 60)
    return f"about {minutes} more minute{'s' if minutes != 1 else ''}"


def untested_rivals(result: TuneResult) -> list[NotMeasured]:
    """The candidates cut off that might beat llama.cpp's defaults: predicted at least about
    as fast (within measurement noise: the planner cannot tell them apart), or not predicted.
    Predicted against the defaults' own prediction, so the cost model's error cancels."""
    defaults = (result.baseline.predicted or {}).get("decode_tps") if result.baseline else None
    return [
        candidate
        for candidate in result.not_measured
        if candidate.baseline == ""  # the defaults are no rival of themselves
        and (
            not defaults
            or candidate.predicted_decode_tps is None
            or candidate.predicted_decode_tps > defaults * SAME_SPEED_BAND[0]
        )
    ]


def _verdict(result: TuneResult) -> tuple[str, str]:
    best, baseline = result.best, result.baseline
    if best is None:
        return (
            "Nothing better was measured",
            "The time ran out (or you stopped) before any tuned setting was measured. "
            "Go back and give it more time.",
        )
    same = baseline is not None and config_key(best.config) == config_key(baseline.config)
    if same and result.chosen_variant is None:
        return _defaults_verdict(result)
    speedup = result.speedup
    measured = f"{best.decode_tps or 0:.1f} tok/s"
    if speedup is None or baseline is None:
        return f"Chosen: {measured}", "The defaults were not measured in this run."
    compared = (
        f"{measured} vs {baseline.decode_tps or 0:.1f} tok/s with llama.cpp's defaults "
        f"(measured now){_confirmation_text(result)}{_python_defaults_text(result)}"
    )
    if result.decode_alike:
        return (
            "About as fast as llama.cpp's defaults",
            f"Decode: {compared}. The chosen settings differ from llama.cpp's defaults only "
            "in batch sizes, which are set for reading a prompt; one run of each cannot tell "
            "their writing speeds apart on this machine, so no gain is claimed."
            + _quality_budget_text(result),
        )
    if speedup >= SAME_SPEED_BAND[1]:
        headline = f"{speedup:.2f}× faster than llama.cpp's defaults"
        unconfirmed = (
            f" Measured once each, minutes apart: {result.unconfirmed}, so it may be noise; "
            "give it more time to measure both again back to back."
            if result.unconfirmed
            else ""
        )
        return headline, f"Decode: {compared}.{unconfirmed}{_quality_budget_text(result)}"
    if speedup > SAME_SPEED_BAND[0]:
        return (
            "About as fast as llama.cpp's defaults",
            f"Decode: {compared}; chosen for its {_context_gain(best, baseline)}."
            + _quality_budget_text(result),
        )
    return (
        "llama.cpp's defaults measured faster here",
        f"Decode: {compared}. A busy computer skews measurements: close other work and "
        "measure again, or Apply only if you need the chosen settings' "
        f"{_context_gain(best, baseline)}.",
    )


def _defaults_verdict(result: TuneResult) -> tuple[str, str]:
    """llama.cpp's defaults measured fastest: the best here only when every candidate that
    might beat them was measured too."""
    rivals = untested_rivals(result)
    if not rivals:
        return (
            "llama.cpp's defaults are already the best here",
            "Hearthside keeps them; Apply stores them as this model's default."
            + _quality_budget_text(result),
        )
    some = "1 setting" if len(rivals) == 1 else f"{len(rivals)} settings"
    were = "was" if len(rivals) == 1 else "were"
    return (
        coverage_text(result),
        f"llama.cpp's defaults were the fastest of those measured, but {some} predicted to "
        f"be about as fast or faster {were} not measured, so it is not known whether the "
        "defaults are the best here. Apply stores them as this model's default; measure with "
        "more time to test the rest." + _quality_budget_text(result),
    )


def _confirmation_text(result: TuneResult) -> str:
    """The second, back-to-back measurement of a gain that may be noise, when there was one."""
    if result.confirmation is None:
        return ""
    baseline_again, best_again = result.confirmation
    return (
        f"; again back to back {best_again.decode_tps or 0:.1f} vs "
        f"{baseline_again.decode_tps or 0:.1f} tok/s, so {result.speedup or 0:.2f}×, the "
        "smaller gain of the two"
    )


def _python_defaults_text(result: TuneResult) -> str:
    ratio = result.speedup_over_python_defaults
    return f"; {ratio:.2f}× llama-cpp-python's Llama() defaults" if ratio is not None else ""


def _quality_budget_text(result: TuneResult) -> str:
    """What keeping the answers close to the reference cost, when it cost anything."""
    cost, fastest = result.budget_cost, result.fastest
    if cost is None or fastest is None or cost < SAME_SPEED_BAND[1]:
        return ""
    quality = result.quality_of(fastest)
    variant = result.variant_of(fastest)
    what = f"the {variant.label} variant" if variant else f"{fastest.config.get('type_k')} KV"
    if quality.source == "unmeasured":
        return (
            f" The fastest setting ({what}, {cost:.2f}× the chosen speed) was not chosen: "
            "its quality was not measured in time, so it counts as over the quality budget."
        )
    if quality.mean_kld <= result.kld_budget:
        chosen = result.quality_of(result.best).mean_kld if result.best else 0.0
        return (
            f" The fastest setting ({what}, {cost:.2f}× the chosen speed) was not chosen: "
            f"your goal ({GOAL_NAMES[result.goal]}) takes the answers closest to full "
            f"precision among the settings nearly as fast (mean KLD {chosen:.3f} vs "
            f"{quality.mean_kld:.3f}, both within the quality budget of {result.kld_budget})."
        )
    return (
        f" The fastest setting ({what}, {cost:.2f}× the chosen speed) was not chosen: its "
        f"mean KLD {quality.mean_kld:.3f} is over the quality budget of {result.kld_budget} — "
        "its answers noticeably differ."
    )


def _pick_text(result: TuneResult) -> str:
    pick = variant_pick_text(result)
    return f" {pick}" if pick else ""


def variant_pick_text(result: TuneResult) -> str:
    """When a quant variant won: that the pick is another file, and how to use it."""
    variant = result.chosen_variant
    if variant is None:
        return ""
    model = variant.model_id or Path(variant.path).name
    return (
        f"The pick is the {variant.label} variant ({model}), not the file you tuned: the "
        f"settings are saved as {model}'s default here, so load {model} to use them; the "
        "tuned file keeps its own best settings as its default."
    )


def variant_text(result: TuneResult, variant: VariantRun) -> str:
    """E.g. "Q4_0 (variant): 1.15× faster, KLD 0.21 — over the quality budget; not chosen"."""
    run = next((r for r in result.runs if r.key.model == variant.model), None)
    head = f"{variant.label} (variant)"
    if run is None or run.outcome != "ok" or not run.decode_tps:
        outcome = run.outcome if run is not None else "not measured"
        return f"{head}: {outcome}; not chosen"
    own = result.file_best
    ratio = run.decode_tps / own.decode_tps if own and own.decode_tps else None
    speed = f"{run.decode_tps:.1f} tok/s" if ratio is None else _speed_words(ratio)
    quality = variant.quality
    if quality.source == "unmeasured":
        fit = "quality not measured — counts as over the quality budget"
    else:
        within = quality.mean_kld <= result.kld_budget
        fit = f"KLD {kld_text(quality.mean_kld)} — " + (
            "within the quality budget" if within else "over the quality budget"
        )
    chosen = "chosen" if run is result.best else "not chosen"
    return f"{head}: {speed}, {fit}; {chosen}"


def _speed_words(ratio: float) -> str:
    if ratio >= 1.0:
        return f"{ratio:.2f}× faster"
    return f"{1 / ratio:.2f}× slower"


def quality_text(result: TuneResult, run: RunRecord) -> str:
    """A run's quality in a few words: the reference itself, measured, its family's, or a prior."""
    quality = result.quality_of(run)
    if quality.source == "reference":
        return "the reference (f16 KV)"
    if quality.source == "prior":
        return f"KLD ~{quality.mean_kld:.3f} (not measured yet)"
    if quality.source == "unmeasured":
        return "not measured (counts as over the budget)"
    if quality.source == "family":
        return f"KLD ~{quality.mean_kld:.3f} ({quality.family} family)"
    agreement = quality.top1_agreement or 0.0
    return f"KLD {quality.mean_kld:.4f}, same top token {agreement:.0%}"


def quality_row(result: TuneResult) -> SettingRow | None:
    """The quality of the chosen run against the defaults' (f16 KV: the reference)."""
    if result.best is None:
        return None
    default = quality_text(result, result.baseline) if result.baseline else "the reference"
    return SettingRow("Quality (vs f16 KV)", default, quality_text(result, result.best))


def _context_gain(best: RunRecord, baseline: RunRecord) -> str:
    chosen, default = best.config.get("n_ctx") or 0, baseline.config.get("n_ctx") or 0
    if chosen > default:
        return f"{chosen // max(default, 1)}× longer context ({chosen} vs {default} tokens)"
    return "settings for your goal"


# The plan's reasons name settings; these are the config fields they speak for.
REASON_FIELDS = {
    "n_gpu_layers": "n_gpu_layers",
    "type_k/type_v": "type_k",
    "flash_attn": "flash_attn",
    "n_ctx": "n_ctx",
}
MEASURED_FIELDS = ("n_threads", "n_threads_batch", "n_ubatch")


def measured_reasons(result: TuneResult) -> list[Reason]:
    """The plan's reasons, corrected where measuring chose otherwise than the estimate, and
    what the tuner left out or cut short (its notes)."""
    left_out = [Reason("Measuring", note.phase, note.reason) for note in result.notes]
    return _chosen_reasons(result) + left_out


def _chosen_reasons(result: TuneResult) -> list[Reason]:
    if result.best is None:
        return list(result.plan.reasons)
    chosen, planned = result.best.config, result.plan.config.to_dict()
    reasons = []
    for reason in result.plan.reasons:
        field = REASON_FIELDS.get(reason.setting)
        value = _shown_value(chosen.get(field)) if field else reason.value
        if field is None or value == reason.value:
            reasons.append(reason)
        else:
            why = f"measured faster here than the planner's estimate-based pick ({reason.value})."
            reasons.append(Reason(reason.setting, value, why.capitalize()))
    for field in MEASURED_FIELDS:
        if chosen.get(field) != planned.get(field):
            pick = _shown_value(planned.get(field))
            why = f"Measured faster here than the planner's pick ({pick})."
            reasons.append(Reason(field, _shown_value(chosen.get(field)), why))
    return reasons


def _shown_value(value: Any) -> str:
    if value is None:  # a thread count left to llama.cpp: one per core
        return "automatic"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def apply_tuning(result: TuneResult) -> None:
    """Store the winner (and the speculation it measured) as the model's default here; never
    from a run that other programs disturbed (`TuneResult.busy`)."""
    if result.busy is not None:
        raise HearthsideError("Nothing was stored.", hint=busy_text(result.busy))
    with WisdomDB() as db:
        if not save_tuned_defaults(db, result):
            raise HearthsideError("There is nothing to apply.", hint="Measure a model first.")


def tuned_speed_of_light(result: TuneResult, profile: HardwareProfile) -> SpeedOfLight | None:
    """The pick's measured decode speed against this machine's limit for it (the result
    page's speed-of-light line); None without a pick or a limit. Blocking (reads the DB)."""
    from hearthside.autotune.speed_meter import tuned_reading

    with WisdomDB() as wisdom:
        return tuned_reading(result, profile, wisdom)


# ---- the measuring job (runs on the engine thread) -------------------------------------------


def measure(
    request: MeasureRequest, cancel: threading.Event, post: Callable[[MeasureUpdate], None]
) -> TuneResult | None:
    """Calibrate if asked, then tune; every step reported through `post`. When other
    programs kept the machine busy meanwhile (their CPU time, counted around the whole run)
    or the tuner's repeats disagreed, the result says so (`TuneResult.busy`) and no default
    is stored."""
    post(MeasureUpdate("started"))
    if request.model_path is not None and not request.model_path.is_file():
        raise ModelFileError(
            f"The model file is missing ({request.model_path.name}).",
            hint="Add it again on the Models page, or choose another model.",
        )
    before = cpu_use_now()
    if request.calibrate:  # a whole calibration: the wizard never stores a quick one
        calibrate(
            CalibrationRequest(request.profile, request.model_path, CALIBRATION_BUDGET_S), post
        )
    if request.model_path is None or cancel.is_set():
        return None
    key = tuning_key(request.profile, request.model_path)
    with WisdomDB() as db:
        result = tune(
            request.model_path,
            request.profile,
            goal=request.goal,
            budget_s=request.budget_s,
            wisdom=db,
            rigor=request.rigor,
            listener=lambda event: post(MeasureUpdate("candidate", event=event)),
            cancel=cancel,
            save_default=False,  # below, once the whole run is known undisturbed
            key=key,
        )  # the winner's context check included, within the budget (its notes say if not)
        after = cpu_use_now()
        others = busy_from_others(others_cores(before, after), after.cores)
        result = replace(result, busy=joined(others, result.busy))
        if request.save_default:
            save_tuned_defaults(db, result)  # stores nothing from a busy run
    return result


def calibrate(
    request: CalibrationRequest, post: Callable[[MeasureUpdate], None]
) -> CalibrationReport:
    """Measure this machine, reporting each kernel as a "calibrating" update (its name, the
    share of the budget spent), and keep the report in the autotune DB, the one place the
    planner, the Hardware page and the wizard read it from."""
    report = run_calibration(
        quick=request.quick,
        budget_s=request.budget_s,
        model_path=request.model_path,
        profile=request.profile,
        progress=lambda step, done: post(MeasureUpdate("calibrating", step, done)),
    )
    with WisdomDB() as db:
        store_calibration(report, request.profile, db)
    post(MeasureUpdate("calibrated", fraction=1.0))
    return report


def _threads(value: Any, automatic: str) -> str:
    return f"auto ({automatic})" if value is None else str(value)


def _gpu_layers(value: Any) -> str:
    return "all" if value == -1 else str(value)
