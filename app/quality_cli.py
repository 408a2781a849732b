"""`hearthside quality MODEL`: how much each quant variant and KV-cache type changes what the
model predicts, measured against its most precise file (`autotune/quality.py`).

The candidates are the reference file with each `--kv` type, then each installed variant
(`--variants`, default all) with an f16 KV cache. Figures already in the autotune DB for the
same files, text and context are shown again without measuring.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hearthside.app.cli_support import printable, text_table
from hearthside.app.progress import ProgressLine
from hearthside.autotune.quality import (
    DEFAULT_EVAL_CTX,
    REFERENCE_KV,
    Candidate,
    QualityError,
    QualityReport,
    choose_reference,
    measure_quality,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import KV_CACHE_TYPES
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.store import DEFAULT_REF, ModelRecord, ModelStore, resolve_model_path
from hearthside.core.paths import data_dir

DEFAULT_KV = ("f16", "q8_0", "q4_0")
MIN_CTX = 32


def add_quality_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "quality",
        help="measure how much quant variants and KV-cache types change a model's predictions "
        "(KL divergence, top-1 agreement, perplexity vs its most precise file)",
    )
    parser.add_argument("model", nargs="?", default=DEFAULT_REF, help="installed id or .gguf path")
    parser.add_argument(
        "--kv",
        type=kv_types,
        default=DEFAULT_KV,
        metavar="TYPES",
        help="KV-cache types to try on the reference file (default f16,q8_0,q4_0)",
    )
    parser.add_argument(
        "--variants",
        type=quant_names,
        default=None,
        metavar="QUANTS",
        help="installed variants to measure, e.g. Q4_0,Q8_0 (default: every installed one)",
    )
    parser.add_argument(
        "--ctx",
        type=eval_context,
        default=DEFAULT_EVAL_CTX,
        help=f"tokens per evaluation chunk (default {DEFAULT_EVAL_CTX})",
    )
    parser.add_argument("--json", action="store_true", help="print only the figures as JSON")
    parser.set_defaults(handler=_run_quality)


def kv_types(text: str) -> tuple[str, ...]:
    """argparse's type for `--kv f16,q8_0`: known KV-cache types only."""
    names = tuple(name.strip().lower() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KV_CACHE_TYPES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown KV-cache type {', '.join(unknown) or repr(text)}; "
            f"use one or more of {', '.join(KV_CACHE_TYPES)}"
        )
    return names


def quant_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip().upper() for name in text.split(",") if name.strip())
    if not names:
        raise argparse.ArgumentTypeError("name at least one quant, e.g. Q4_0,Q8_0")
    return names


def eval_context(text: str) -> int:
    value = int(text) if text.strip().isdigit() else 0
    if value < MIN_CTX:
        raise argparse.ArgumentTypeError(f"the context is a whole number of at least {MIN_CTX}")
    return value


def _run_quality(args: argparse.Namespace) -> int:
    reference, variants = _reference_and_variants(args.model, args.variants)
    candidates = [Candidate(reference.path, reference.label, kv) for kv in args.kv]
    candidates += [Candidate(v.path, v.label, REFERENCE_KV) for v in variants]
    with WisdomDB() as db, ProgressLine("Measuring quality") as line:
        report = measure_quality(
            reference,
            candidates,
            db,
            n_ctx=args.ctx,
            progress=lambda what, done, total: line.show(f"{what}: chunk {done}/{total}"),
        )
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=1) + "\n")
    else:
        print(describe_report(report))
    return 0


def _reference_and_variants(
    ref: str, wanted: Sequence[str] | None
) -> tuple[Candidate, list[Candidate]]:
    """The reference file and the variants to measure: for an installed model its family's
    most precise original and the other members; for a file given by path, that file."""
    with ModelStore(data_dir()) as store:
        path = resolve_model_path(store, ref)
        registered = ref == DEFAULT_REF or store.find(ref) is not None
        family = store.family(store.resolve(ref)) if registered else []
    if not family:
        if wanted:
            raise QualityError(
                f"{Path(ref).name} is not an installed model, so it has no variants.",
                hint="Add it with `hearthside models add FILE`, then make variants with "
                "`hearthside models quantize ID TYPE`.",
            )
        return Candidate(path, validate_gguf(path).quant_name or path.name), []
    chosen = choose_reference(family)
    others = [record for record in family if record.id != chosen.id]
    return _candidate(chosen), [_candidate(r) for r in _wanted(others, wanted, chosen)]


def _wanted(
    others: Sequence[ModelRecord], wanted: Sequence[str] | None, reference: ModelRecord
) -> list[ModelRecord]:
    if wanted is None:
        return list(others)
    by_quant = {(record.quant or "").upper(): record for record in others}
    missing = [quant for quant in wanted if quant not in by_quant]
    if missing:
        raise QualityError(
            f"{reference.id} has no installed {', '.join(missing)} variant "
            f"(installed: {', '.join(sorted(q for q in by_quant if q)) or 'none'}).",
            hint=f"Make one with `hearthside models quantize {reference.id} {missing[0]}`.",
        )
    return [by_quant[quant] for quant in wanted]


def _candidate(record: ModelRecord) -> Candidate:
    return Candidate(record.path, record.quant or record.id)


def describe_report(report: QualityReport) -> str:
    reference = report.reference
    first = report.results[0].record if report.results else None
    lines = [f"Reference: {printable(reference.path.name)} with an f16 KV cache"]
    if first is not None:
        lines[0] += (
            f", perplexity {first.reference_perplexity:.3f} over {first.n_tokens} tokens "
            f"(chunks of {first.n_ctx})"
        )
    rows = [["candidate", "mean KLD", "KLD p99", "top-1", "PPL", "PPL vs ref", ""]]
    for result in report.results:
        record = result.record
        rows.append(
            [
                printable(result.candidate.name),
                f"{record.mean_kld:.4f}",
                f"{record.kld_p99:.4f}",
                f"{record.top1_agreement:.1%}",
                f"{record.perplexity:.3f}",
                f"{record.perplexity / record.reference_perplexity - 1:+.1%}",
                "(stored)" if result.reused else "",
            ]
        )
    return "\n".join([*lines, text_table(rows)])
