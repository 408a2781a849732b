"""`hearthside plan MODEL`: the settings Hearthside would load a model with, and why.

MODEL is anything `resolve_spec` takes (an installed id, a .gguf path, a catalog id, a
descriptor .json); the hardware is this machine, a recorded profile (`--hardware`) or a what-if
spec (`--hardware-spec`). Nothing is loaded: this is the planner's estimate.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import get_args

from hearthside.app.probe_cli import _load as load_profile
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.planner import Goal, Plan, cpu_expert_layers, plan
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.errors import HearthsideError
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.probe.profile import HardwareProfile

GIB = 1024**3
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
    parser.add_argument("--ctx", type=int, default=None, help="context length to plan for")
    parser.add_argument(
        "--keep-free-gb",
        type=float,
        default=2.0,
        help="memory to leave for other programs (default 2 GB)",
    )
    parser.add_argument("--json", action="store_true", help="print only the Plan as JSON")
    parser.set_defaults(handler=_run_plan)


def _run_plan(args: argparse.Namespace) -> int:
    profile = _profile(args)
    result = plan(
        resolve_spec(args.model),
        profile,
        goal=args.goal,
        n_ctx=args.ctx,
        free_margin_bytes=int(args.keep_free_gb * GIB),
        calibration=_calibration(profile),
    )
    if args.json:
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
    else:
        print(describe_plan(result))
    return 0 if result.fits or result.streams_from_disk else NOTHING_FITS


def _calibration(profile: HardwareProfile) -> dict[str, float]:
    """This machine's calibration; a what-if profile finds none (its fingerprint differs)."""
    with WisdomDB() as wisdom:
        return calibration_for(profile, wisdom)


def _profile(args: argparse.Namespace) -> HardwareProfile:
    if args.hardware is not None:
        try:
            return HardwareProfile.from_json(args.hardware.read_text("utf-8"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HearthsideError(
                f"{args.hardware} is not a hardware profile ({exc}).",
                hint="Save one with `hearthside probe --json > profile.json`.",
            ) from exc
    return load_profile(args.hardware_spec)


def describe_plan(result: Plan) -> str:
    config = result.config
    verdict = (
        "fits"
        if result.fits
        else "streams from disk"
        if result.streams_from_disk
        else "does not fit"
    )
    lines = [
        f"{result.model}: {verdict} (goal {result.goal}, {result.confidence})",
        f"Settings  GPU layers {'all' if config.n_gpu_layers == -1 else config.n_gpu_layers}"
        + (
            f", experts of the first {cpu_expert_layers(config)} layers on the CPU"
            if config.tensor_overrides
            else ""
        )
        + f", KV {config.type_k}, flash attention {'on' if config.flash_attn else 'off'}, "
        f"context {config.n_ctx}",
        f"Speed     ~{result.speed.decode_tps:.1f} tok/s decode (bound by "
        f"{result.speed.decode_bound_by}), ~{result.speed.prefill_tps:.0f} tok/s prefill, "
        f"first token after a 512-token prompt in ~{result.speed.ttft_s:.1f} s",
        "Memory    device     weights      KV  compute    used / usable",
    ]
    for device in result.devices:
        lines.append(
            f"          {device.device:8} {device.weights_bytes / GIB:7.1f}G "
            f"{device.kv_bytes / GIB:6.1f}G {device.compute_bytes / GIB:7.1f}G "
            f"{device.used_bytes / GIB:7.1f}G / {device.capacity_bytes / GIB:.1f}G"
        )
    lines += [
        f"Why       {reason.setting} = {reason.value}: {reason.why}" for reason in result.reasons
    ]
    lines += [f"Advice    {line}" for line in result.advice]
    return "\n".join(lines)
