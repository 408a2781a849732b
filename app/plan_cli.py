"""`hearthside plan MODEL`: the settings Hearthside would load a model with, and why.

MODEL is anything `resolve_spec` takes (an installed id, a .gguf path, a catalog id, a
descriptor .json); the hardware is this machine, a recorded profile (`--hardware`) or a what-if
spec (`--hardware-spec`). Nothing is loaded: this is the planner's estimate.

The facts come through `autotune/optimize.py` (`plan_model`). When MODEL is an installed model
with installed quant variants (`variant_of` in the store), every variant is planned — and so
are the quants that could be made from the one with the most bits, marked "can be made" — and
the goal picks among them (`autotune/variants.py`), by the mean KLD `hearthside quality MODEL
--variants ...` stored where there is one. The KV-cache types
count at what was measured on this model, else on its family, else the global priors
(`autotune/family_quality.py`); the reasons say which.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import get_args

from hearthside.app.cli_support import parallel_requests, printable
from hearthside.app.probe_cli import load_profile
from hearthside.autotune.goals import quality_words
from hearthside.autotune.optimize import ModelPlanRequest, measure_weight_types, plan_model
from hearthside.autotune.planner import (
    Goal,
    Plan,
    cpu_expert_layers,
    decode_limit_words,
    describe_slots,
    usability_verdict,
)
from hearthside.autotune.variants import DEFAULT_MIN_DECODE_TPS, VariantChoice, VariantOutcome
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
    planned = plan_model(
        ModelPlanRequest(
            args.model,
            profile,
            goal=args.goal,
            n_ctx=args.ctx,
            free_margin_bytes=int(args.keep_free_gb * GIB),
            n_parallel=args.parallel,
            min_decode_tps=args.min_tps,
            installed_only=args.installed_only,
        )
    )
    result = planned.plan if isinstance(planned, VariantChoice) else planned
    if args.json:
        document = result.to_dict()
        if isinstance(planned, VariantChoice):
            document["variants"] = planned.to_dict()
        sys.stdout.write(json.dumps(document, indent=1) + "\n")
    elif isinstance(planned, VariantChoice):
        print(describe_choice(planned))
    else:
        print(describe_plan(planned))
    return 0 if result.fits or result.streams_from_disk else NOTHING_FITS


def _measure_types(ref: str, profile: HardwareProfile) -> None:
    """Measure the model's weight types this machine's calibration lacks; report on stderr."""
    measured = measure_weight_types(ref, profile)
    for line in measured:
        print(printable(line), file=sys.stderr)
    if not measured:
        print("every weight type of the model is measured on this machine", file=sys.stderr)


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
