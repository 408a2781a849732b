"""`hearthside plan MODEL`: the settings Hearthside would load a model with, and why.

MODEL is anything `resolve_spec` takes (an installed id, a .gguf path, a catalog id, a
descriptor .json); the hardware is this machine, a recorded profile (`--hardware`) or a what-if
spec (`--hardware-spec`). Nothing is loaded: this is the planner's estimate.

When MODEL is an installed model with installed quant variants (`variant_of` in the store),
every variant is planned — and so are the quants that could be made from the one with the
most bits, marked "can be made" — and the goal picks among them (`autotune/variants.py`), by the
mean KLD `hearthside quality MODEL --variants ...` stored where there is one. The KV-cache types
count at what was measured on this model, else on its family, else the global priors
(`autotune/family_quality.py`); the reasons say which.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import get_args

from hearthside.app.cli_support import parallel_requests, printable
from hearthside.app.probe_cli import load_profile
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.family_quality import kv_priors_of, variant_qualities
from hearthside.autotune.goals import RunQuality, quality_words
from hearthside.autotune.memory import WeightPiece, pieces_from_gguf, pieces_from_spec
from hearthside.autotune.planner import (
    Goal,
    Plan,
    cpu_expert_layers,
    decode_limit_words,
    describe_slots,
    plan,
    usability_verdict,
)
from hearthside.autotune.variants import (
    DEFAULT_MIN_DECODE_TPS,
    Variant,
    VariantChoice,
    VariantOutcome,
    makeable_variants,
    plan_variants,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import ModelSpec
from hearthside.core.models.store import DB_FILE_NAME, DEFAULT_REF, ModelStore, registered_file
from hearthside.core.paths import data_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import GIB

NOTHING_FITS = 3  # exit status: the plan says what would fit instead


def add_plan_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="show the settings a model would load with on this (or another) machine, and why",
    )
    parser.add_argument("model", help="installed id, .gguf path, catalog id or descriptor .json")
    hardware = parser.add_mutually_exclusive_group()
    hardware.add_argument(
        "--hardware",
        type=Path,
        metavar="PROFILE.json",
        help="a HardwareProfile saved with `hearthside probe --json`",
    )
    hardware.add_argument(
        "--hardware-spec",
        type=Path,
        metavar="SPEC.json",
        help="a what-if hardware spec (see `hearthside probe --from-spec`)",
    )
    parser.add_argument("--goal", choices=get_args(Goal), default="balanced")
    parser.add_argument(
        "--ctx", type=int, default=None, help="context length to plan for (per request)"
    )
    parser.add_argument(
        "--parallel",
        type=parallel_requests,
        default=None,
        metavar="N",
        help="requests answered at once, each with its own context, 1 to 64 (default: the "
        "planner's choice, up to 4 where memory allows)",
    )
    parser.add_argument(
        "--keep-free-gb",
        type=float,
        default=2.0,
        help="memory to leave for other programs (default 2 GB)",
    )
    parser.add_argument(
        "--min-tps",
        type=float,
        default=DEFAULT_MIN_DECODE_TPS,
        help="with quant variants: the decode speed the quality goal must reach "
        f"(default {DEFAULT_MIN_DECODE_TPS:g} tok/s)",
    )
    parser.add_argument(
        "--installed-only",
        action="store_true",
        help="with quant variants: leave out the quants that could be made locally",
    )
    parser.add_argument("--json", action="store_true", help="print only the Plan as JSON")
    parser.add_argument(
        "--measure-types",
        action="store_true",
        help="first measure on this CPU the model's weight types the calibration did not "
        "(a short synthetic probe of each, kept in the autotune DB), instead of estimating "
        "them from a measured type",
    )
    parser.set_defaults(handler=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    profile = _profile(args)
    if args.measure_types:
        _measure_types(args.model, profile)
    variants = installed_variants(args.model)
    if len(variants) > 1:
        if not args.installed_only:
            variants += makeable_variants(variants)
        choice = plan_variants(
            variants,
            profile,
            goal=args.goal,
            n_ctx=args.ctx,
            free_margin_bytes=int(args.keep_free_gb * GIB),
            calibration=_calibration(profile),
            min_decode_tps=args.min_tps,
            n_parallel=args.parallel,
            qualities=measured_variant_qualities(args.model, variants),
            kv_priors=_kv_priors(args.model, variants[0].spec),
        )
        result = choice.plan
        if args.json:
            document = {**result.to_dict(), "variants": choice.to_dict()}
            sys.stdout.write(json.dumps(document, indent=1) + "\n")
        else:
            print(describe_choice(choice))
    else:
        spec = variants[0].spec if variants else resolve_spec(args.model)
        result = plan(
            spec,
            profile,
            goal=args.goal,
            n_ctx=args.ctx,
            free_margin_bytes=int(args.keep_free_gb * GIB),
            calibration=_calibration(profile),
            pieces=_file_pieces(args.model),
            n_parallel=args.parallel,
            kv_priors=_kv_priors(args.model, spec),
        )
        if args.json:
            sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
        else:
            print(describe_plan(result))
    return 0 if result.fits or result.streams_from_disk else NOTHING_FITS


def _measure_types(ref: str, profile: HardwareProfile) -> None:
    """Measure the model's weight types this machine's calibration lacks; report on stderr."""
    from hearthside.autotune.type_costs import (
        describe_type_cost,
        measure_type_costs,
        model_weight_types,
    )

    pieces = _file_pieces(ref) or pieces_from_spec(resolve_spec(ref))
    with WisdomDB() as wisdom:
        costs = measure_type_costs(model_weight_types(pieces), profile, wisdom)
    for cost in costs:
        print(printable(describe_type_cost(cost)), file=sys.stderr)
    if not costs:
        print("every weight type of the model is measured on this machine", file=sys.stderr)


def _file_pieces(ref: str) -> list[WeightPiece] | None:
    """A GGUF file's own tensors, so each is costed at its own type (a spec groups them)."""
    path = Path(ref)
    if not (ref.lower().endswith(".gguf") and path.is_file()):
        return None
    return pieces_from_gguf(validate_gguf(path))


def installed_variants(ref: str) -> list[Variant]:
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
    with ModelStore(data_dir()) as store:
        if ref == DEFAULT_REF or store.find(ref) is not None:
            return store.resolve(ref).path
    return None


def _calibration(profile: HardwareProfile) -> dict[str, float]:
    """This machine's calibration; a what-if profile finds none (its fingerprint differs)."""
    with WisdomDB() as wisdom:
        return calibration_for(profile, wisdom)


def _profile(args: argparse.Namespace) -> HardwareProfile:
    return load_profile(spec_path=args.hardware_spec, profile_path=args.hardware)


def describe_choice(choice: VariantChoice) -> str:
    lines = [
        f"Variant   {_variant_name(choice.chosen)} chosen for goal {choice.goal}: {choice.reason}"
    ]
    lines += [f"  other   {_variant_line(outcome)}" for outcome in choice.runners_up]
    lines += [f"Advice    {printable(line)}" for line in choice.advice]
    return "\n".join(lines) + "\n" + describe_plan(choice.plan)


def _variant_name(outcome: VariantOutcome) -> str:
    return printable(_plain_variant_name(outcome))


def _plain_variant_name(outcome: VariantOutcome) -> str:
    variant = outcome.variant
    if variant.can_be_made:
        return f"{variant.label} (can be made from {variant.made_from})"
    return f"{variant.label} ({variant.model_id})" if variant.model_id else variant.label


def _variant_line(outcome: VariantOutcome) -> str:
    plan_ = outcome.plan
    verdict = "fits" if plan_.fits else "streams" if plan_.streams_from_disk else "does not fit"
    quality = _variant_quality(outcome)
    return (
        f"{_variant_name(outcome)}: {outcome.variant.bits_per_weight:.2f} bits, {verdict}, "
        f"~{plan_.speed.decode_tps:.1f} tok/s decode, context {plan_.config.n_ctx}, {quality}"
    )


def _variant_quality(outcome: VariantOutcome) -> str:
    if outcome.quality is None:
        return "quality not measured"
    if outcome.quality.source == "reference":
        return "the reference (the most precise file)"
    return quality_words(outcome.quality)


def describe_plan(result: Plan) -> str:
    config = result.config
    verdict = usability_verdict(result)
    lines = [
        f"{printable(result.model)}: {verdict} (goal {result.goal}, {result.confidence})",
        f"Settings  GPU layers {'all' if config.n_gpu_layers == -1 else config.n_gpu_layers}"
        + (
            f", experts of the first {cpu_expert_layers(config)} layers on the CPU"
            if config.tensor_overrides
            else ""
        )
        + f", KV {config.type_k}, flash attention {'on' if config.flash_attn else 'off'}, "
        f"context {config.n_ctx}",
        f"Speed     ~{result.speed.decode_tps:.1f} tok/s decode (bound by "
        f"{decode_limit_words(result.speed)}), ~{result.speed.prefill_tps:.0f} tok/s prefill, "
        f"first token after a 512-token prompt in ~{result.speed.ttft_s:.1f} s",
        f"Slots     {describe_slots(result)}",
        "Memory    device     weights      KV  compute    used / usable",
    ]
    for device in result.devices:
        lines.append(
            f"          {printable(device.device):8} {device.weights_bytes / GIB:7.1f}G "
            f"{device.kv_bytes / GIB:6.1f}G {device.compute_bytes / GIB:7.1f}G "
            f"{device.used_bytes / GIB:7.1f}G / {device.capacity_bytes / GIB:.1f}G"
        )
    lines += [
        printable(f"Why       {reason.setting} = {reason.value}: {reason.why}")
        for reason in result.reasons
    ]
    lines += [f"Advice    {printable(line)}" for line in result.advice]
    return "\n".join(lines)
