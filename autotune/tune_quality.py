"""Quality within a tuning run: what each KV-cache type the candidates use does to the answers.

The tuner varies the KV-cache type, never the weights, so the reference is the tuned file
itself with an f16 KV cache (`autotune/quality.py` measures; its figures go into the autotune
DB and are reused by later runs, the reference's distributions are cached on disk). A quick run
scores the first `QUICK_EVAL_CHARS` of the evaluation text (two chunks of `QUICK_EVAL_CTX`
tokens), a thorough one all of it in chunks of the chat context `quality.DEFAULT_EVAL_CTX`.
A KV type is measured only while its passes fit in the phase's time (estimated from the
measured prefill speed); one that does not keeps its prior — the model's own figure at another
text or context, else its family's on this machine (`family_quality.kv_priors`), else the
global `goals.KV_KLD_PRIORS` — and a note says which.

The model's installed quant variants (`installed_variants`: files re-quantized from the tuned
file, `hearthside models quantize`) are tried by the tuner too; `variant_quality` gives each
one's figure against the tuned file (f16 KV both): from the DB (`hearthside quality` or an
earlier tune, any text and context, the most tokens first), else measured over the same text
and context as the KV types while its pass fits, else "unmeasured" — over the budget until a
longer run measures it. The tuned file must be the family's reference (`choose_reference`):
a variant's figure is against that file, so tuning a variant tries no other variants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hearthside.autotune.family_quality import kv_priors, variant_qualities
from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.goals import (
    RunQuality,
    kv_prior,
    kv_quality_text,
    measured_quality,
    reference_quality,
    unmeasured_quality,
)
from hearthside.autotune.quality import (
    DEFAULT_EVAL_CTX,
    REFERENCE_KV,
    Candidate,
    EvalText,
    QualityError,
    choose_reference,
    default_cache_dir,
    is_requantized,
    load_eval_text,
    measure_quality,
    reference_cache_path,
)
from hearthside.autotune.tune_budget import ENGINE_LOAD_S, PhaseNote
from hearthside.autotune.wisdom import Rigor, WisdomDB
from hearthside.core.engine.worker_engine import EngineLoader, WorkerEngine
from hearthside.core.errors import EngineError
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir

QUICK_EVAL_CTX = 512
QUICK_EVAL_CHARS = 4000  # the prose: about 1,100 tokens, two chunks of 512
CHARS_PER_TOKEN = 3.5  # the evaluation text's, for a time estimate before it is tokenized
SCORING_SLOWDOWN = 1.5  # a pass also soft-maxes every scored row: slower than a bare prefill
QualityListener = Callable[[str, RunQuality], None]  # (KV type, its quality)


@dataclass(frozen=True)
class KvQuality:
    reference: str  # the reference's name in words, e.g. "gemma-3-270m.Q4_K_M.gguf, f16 KV"
    by_kv: dict[str, RunQuality]
    notes: tuple[PhaseNote, ...] = ()
    priors: Mapping[str, RunQuality] = field(default_factory=dict)  # own or family figures

    def of(self, kv_type: str) -> RunQuality:
        return self.by_kv.get(kv_type) or kv_prior(kv_type, self.priors)


def eval_context(rigor: Rigor) -> int:
    return DEFAULT_EVAL_CTX if rigor == "thorough" else QUICK_EVAL_CTX


def eval_text(rigor: Rigor) -> EvalText:
    text = load_eval_text()
    return text if rigor == "thorough" else text.head(QUICK_EVAL_CHARS)


def kv_quality(
    model_path: Path,
    kv_types: Iterable[str],
    db: WisdomDB,
    *,
    rigor: Rigor,
    seconds_left: Callable[[], float],
    prefill_tps: float | None,
    listener: QualityListener | None = None,
    text: EvalText | None = None,
    n_ctx: int | None = None,
    cache_dir: Path | None = None,
    fingerprint: str | None = None,
    load: EngineLoader = WorkerEngine,
) -> KvQuality:
    """The quality of each of `kv_types` on `model_path` against its f16-KV self: from the DB,
    or measured while `seconds_left()` holds its passes, or else its prior (`fingerprint`:
    the file's, when the caller has it)."""
    text = text or eval_text(rigor)
    n_ctx = n_ctx or eval_context(rigor)
    info = validate_gguf(model_path)
    label = info.quant_name or model_path.name
    reference = Candidate(model_path, label, REFERENCE_KV)
    fingerprint = fingerprint or model_fingerprint(model_path)
    priors = kv_priors(db, info.architecture, fingerprint)
    cache = reference_cache_path(cache_dir or default_cache_dir(), fingerprint, text, n_ctx)
    pass_s = _pass_s(text, prefill_tps)
    by_kv = {REFERENCE_KV: reference_quality()}
    notes = []
    for kv_type in sorted(set(kv_types) - {REFERENCE_KV}):
        stored = db.quality(fingerprint, fingerprint, kv_type, text.sha256, n_ctx)
        needed_s = 0.0 if stored else pass_s * (1 if cache.exists() else 2)
        if needed_s > seconds_left():
            notes.append(_not_measured(kv_type, needed_s, seconds_left(), priors))
            continue
        try:
            report = measure_quality(
                reference,
                [Candidate(model_path, label, kv_type)],
                db,
                text=text,
                n_ctx=n_ctx,
                cache_dir=cache.parent,
                load=load,
            )
        except (EngineError, QualityError) as exc:
            stands_in = kv_quality_text(kv_type, kv_prior(kv_type, priors))
            notes.append(
                PhaseNote(
                    "quality",
                    f"{kv_type} KV not measured: {exc.message}; {stands_in} stands in",
                )
            )
            continue
        by_kv[kv_type] = measured_quality(report.results[0].record)
        if listener is not None:
            listener(kv_type, by_kv[kv_type])
    return KvQuality(f"{model_path.name} with an f16 KV cache", by_kv, tuple(notes), priors)


def _pass_s(text: EvalText, prefill_tps: float | None) -> float:
    """About how long one pass over the text takes: a load and a slowed-down prefill."""
    tokens = len(text.text) / CHARS_PER_TOKEN
    return ENGINE_LOAD_S + tokens / max(prefill_tps or 0.0, 1.0) * SCORING_SLOWDOWN


def _not_measured(
    kv_type: str, needed_s: float, left_s: float, priors: Mapping[str, RunQuality]
) -> PhaseNote:
    stands_in = kv_quality_text(kv_type, kv_prior(kv_type, priors))
    return PhaseNote(
        "quality",
        f"{kv_type} KV not measured: it needs about {needed_s:.0f} s, {max(left_s, 0):.0f} s "
        f"were left; {stands_in} stands in until a longer run measures it",
    )


# ---- the model's installed quant variants ---------------------------------------------------


@dataclass(frozen=True)
class QuantVariant:
    """An installed re-quantization of the tuned file."""

    label: str  # its quant, e.g. "Q4_0"
    path: Path
    model_id: str = ""  # its id in the model store ("" for a file not registered)


def installed_variants(
    model_path: Path, store_root: Path | None = None
) -> tuple[tuple[QuantVariant, ...], tuple[PhaseNote, ...]]:
    """The installed variants re-quantized from `model_path`'s model, when `model_path` is
    that model's reference (its most precise original); else none, with a note why."""
    with ModelStore(store_root or data_dir()) as store:
        record = _registered(store.list(), model_path)
        family = store.family(record) if record is not None else []
    variants = [r for r in family if is_requantized(r) and r.path.is_file()]
    if record is None or not variants:
        return (), ()
    try:
        reference = choose_reference(family)
    except QualityError:
        return (), ()
    if reference.id != record.id:
        why = (
            f"not tried: {record.id} is re-quantized from {reference.id}, the file its "
            f"variants are measured against; tune {reference.id} to compare them"
        )
        return (), (PhaseNote("variants", why),)
    return tuple(QuantVariant(r.quant or r.id, r.path, r.id) for r in variants), ()


def _registered(records: Iterable[ModelRecord], model_path: Path) -> ModelRecord | None:
    wanted = model_path.resolve()
    return next((r for r in records if r.path.resolve() == wanted), None)


def variant_quality(
    reference_path: Path,
    variant: QuantVariant,
    db: WisdomDB,
    *,
    rigor: Rigor,
    seconds_left: Callable[[], float],
    prefill_tps: float | None,
    text: EvalText | None = None,
    n_ctx: int | None = None,
    cache_dir: Path | None = None,
    load: EngineLoader = WorkerEngine,
) -> tuple[RunQuality, PhaseNote | None]:
    """`variant`'s quality against `reference_path` (f16 KV both): stored, else measured while
    its passes fit `seconds_left()`, else unmeasured with a note."""
    stored = variant_qualities(db, reference_path, {variant.label: variant.path})
    if variant.label in stored:
        return stored[variant.label], None
    text = text or eval_text(rigor)
    n_ctx = n_ctx or eval_context(rigor)
    cache_dir = cache_dir or default_cache_dir()
    fingerprint = model_fingerprint(reference_path)
    cached = reference_cache_path(cache_dir, fingerprint, text, n_ctx).exists()
    needed_s = _pass_s(text, prefill_tps) * (1 if cached else 2)
    if needed_s > seconds_left():
        why = (
            f"{variant.label} quality not measured: it needs about {needed_s:.0f} s, "
            f"{max(seconds_left(), 0):.0f} s were left; it counts as over the quality budget "
            f"until measured (`hearthside quality MODEL --variants {variant.label}`)"
        )
        return unmeasured_quality(), PhaseNote("variants", why)
    label = validate_gguf(reference_path).quant_name or reference_path.name
    try:
        report = measure_quality(
            Candidate(reference_path, label),
            [Candidate(variant.path, variant.label)],
            db,
            text=text,
            n_ctx=n_ctx,
            cache_dir=cache_dir,
            load=load,
        )
    except (EngineError, QualityError) as exc:
        why = f"{variant.label} quality not measured: {exc.message}; it counts as over budget"
        return unmeasured_quality(), PhaseNote("variants", why)
    return measured_quality(report.results[0].record), None
