"""Measured quality from the autotune DB, in the shape the planner and the variant choice take
it (they stay pure: their callers read the DB here and pass the mappings in).

- `kv_priors`: per KV-cache type, the figure that stands in until the tuner measures it on the
  model at hand: the model's own measurement at any text or context, else one measured on
  another model of its family (its GGUF architecture) on this machine. Where several models of
  the family were measured, the highest mean KLD stands in: a prior should not promise more
  than the family has shown. Types with neither keep the global prior (`goals.kv_prior`).
- `variant_qualities`: per quant variant, its measured mean KLD against the model's reference
  with an f16 KV cache (`hearthside quality MODEL --variants ...` stores them); the reference
  itself is the reference; a variant never measured is left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.goals import (
    RunQuality,
    family_quality,
    measured_quality,
    reference_quality,
)
from hearthside.autotune.wisdom import QualityRecord, WisdomDB
from hearthside.core.models.gguf_validator import validate_gguf

REFERENCE_KV = "f16"  # as autotune/quality.py's, without importing the engine


def kv_priors(
    db: WisdomDB, architecture: str | None, fingerprint: str | None = None
) -> dict[str, RunQuality]:
    """The KV types measured on the model whose file has `fingerprint` (source "measured"),
    else on its family `architecture` (source "family"); see the module docstring."""
    if fingerprint and architecture:
        db.note_quality_architecture(fingerprint, architecture)
    own = _own_kv(db, fingerprint) if fingerprint else {}
    family = _family_kv(db, architecture, fingerprint) if architecture else {}
    priors = {kv: family_quality(record) for kv, record in family.items()}
    priors.update({kv: measured_quality(record) for kv, record in own.items()})
    return priors


def kv_priors_for_file(db: WisdomDB, path: Path) -> dict[str, RunQuality]:
    """`kv_priors` for a model file: its architecture and fingerprint read from it."""
    return kv_priors(db, validate_gguf(path).architecture, model_fingerprint(path))


def kv_priors_of(
    db: WisdomDB, architecture: str | None, model_file: Path | None
) -> dict[str, RunQuality]:
    """`kv_priors` for a model that may have no file here (a what-if model has only its
    family's figures); a quality belongs to the model, not the hardware."""
    if model_file is not None and model_file.is_file():
        return kv_priors_for_file(db, model_file)
    return kv_priors(db, architecture)


def _own_kv(db: WisdomDB, fingerprint: str) -> dict[str, QualityRecord]:
    rows = [
        record
        for record in db.qualities(fingerprint)
        if record.candidate_model == fingerprint and record.kv_type != REFERENCE_KV
    ]
    return {kv: records[0] for kv, records in _by_kv(_most_tokens_first(rows)).items()}


def _family_kv(
    db: WisdomDB, architecture: str, fingerprint: str | None
) -> dict[str, QualityRecord]:
    """Per KV type, the family member whose (best-evidenced) figure is the highest."""
    others = [r for r in db.kv_measurements(architecture) if r.reference_model != fingerprint]
    per_model: dict[tuple[str, str], QualityRecord] = {}
    for record in others:  # most tokens first: each model's best-evidenced figure
        per_model.setdefault((record.reference_model, record.kv_type), record)
    return {
        kv: max(records, key=lambda record: record.mean_kld)
        for kv, records in _by_kv(per_model.values()).items()
    }


def _by_kv(records: Iterable[QualityRecord]) -> dict[str, list[QualityRecord]]:
    grouped: dict[str, list[QualityRecord]] = {}
    for record in records:
        grouped.setdefault(record.kv_type, []).append(record)
    return grouped


def _most_tokens_first(records: Iterable[QualityRecord]) -> list[QualityRecord]:
    return sorted(records, key=lambda r: (r.n_tokens, r.created_at), reverse=True)


def variant_qualities(
    db: WisdomDB, reference: Path, variants: Mapping[str, Path]
) -> dict[str, RunQuality]:
    """Per variant label (label → its file), its measured quality against `reference` with an
    f16 KV cache, over the most tokens measured; unmeasured variants are left out."""
    reference_model = model_fingerprint(reference)
    measured = _most_tokens_first(
        record for record in db.qualities(reference_model) if record.kv_type == REFERENCE_KV
    )
    qualities: dict[str, RunQuality] = {}
    for label, path in variants.items():
        candidate_model = model_fingerprint(path)
        if candidate_model == reference_model:
            qualities[label] = reference_quality()
            continue
        record = next((r for r in measured if r.candidate_model == candidate_model), None)
        if record is not None:
            qualities[label] = measured_quality(record)
    return qualities
