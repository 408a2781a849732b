"""`hearthside recipe vllm|llama-server MODEL`: a command line to serve a model on bigger hardware.

`recipe vllm MODEL --hardware-spec SPEC.json` plans vLLM across the GPUs and nodes the spec
describes (tensor/pipeline parallel sizes, checkpoint format, KV-cache dtype, context length,
expert parallelism, speculative decoding) and prints the `vllm serve` command, the Ray set-up for
several nodes, the memory per GPU and the reasons. `recipe llama-server MODEL` does the same for
llama.cpp's server on one machine (this one, `--hardware PROFILE.json` or `--hardware-spec`),
from the same plan `hearthside plan` shows. `--json` prints the whole plan and the command.
Every printed command has passed the check against the tool's recorded options.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hearthside.app.cli_support import reports_errors, text_table
from hearthside.app.probe_cli import load_profile
from hearthside.autotune.planner import Reason
from hearthside.autotune.serving import (
    ClusterSetup,
    LlamaServerRecipe,
    ServingPlan,
    llama_server_command,
    llama_server_recipe,
    plan_vllm,
    shell_groups,
    vllm_command,
)
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import ClusterSpec, load_cluster_spec
from hearthside.core.units import format_bytes

NOTHING_FITS = 3  # exit status: the recipe gives advice instead of a command


def add_recipe_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "recipe", help="print a command that serves a model with vLLM or llama-server, and why"
    )
    engines = parser.add_subparsers(dest="engine", metavar="ENGINE", required=True)
    _add_vllm_parser(engines)
    _add_llama_server_parser(engines)


def _add_vllm_parser(engines: argparse._SubParsersAction) -> None:
    parser = engines.add_parser("vllm", help="vLLM across GPUs and nodes (what-if hardware)")
    parser.add_argument("model", help="catalog id, installed id, .gguf path or descriptor .json")
    parser.add_argument(
        "--hardware-spec",
        type=Path,
        required=True,
        metavar="SPEC.json",
        help="the GPUs, nodes and links (see assets/hardware-example-*.json)",
    )
    parser.add_argument(
        "--checkpoint", help="Hugging Face repo to serve instead of the planned one"
    )
    parser.add_argument("--max-model-len", type=int, help="ask for this context length")
    parser.add_argument("--json", action="store_true", help="print the plan and command as JSON")
    parser.set_defaults(handler=reports_errors(_run_vllm))


def _add_llama_server_parser(engines: argparse._SubParsersAction) -> None:
    parser = engines.add_parser("llama-server", help="llama.cpp's server on one multi-GPU machine")
    parser.add_argument("model", help="catalog id, installed id, .gguf path or descriptor .json")
    hardware = parser.add_mutually_exclusive_group()
    hardware.add_argument(
        "--hardware",
        type=Path,
        metavar="PROFILE.json",
        help="a HardwareProfile saved with `hearthside probe --json` (default: this machine)",
    )
    hardware.add_argument(
        "--hardware-spec", type=Path, metavar="SPEC.json", help="a what-if hardware spec"
    )
    parser.add_argument("--ctx", type=int, default=None, help="context length to plan for")
    parser.add_argument("--port", type=int, default=8080, help="port llama-server listens on")
    parser.add_argument("--json", action="store_true", help="print the plan and command as JSON")
    parser.set_defaults(handler=reports_errors(_run_llama_server))


# --- vLLM -------------------------------------------------------------------------------------


def _run_vllm(args: argparse.Namespace) -> int:
    cluster = load_cluster_spec(args.hardware_spec)
    spec = resolve_spec(args.model)
    serving = plan_vllm(spec, cluster, checkpoint=args.checkpoint, max_model_len=args.max_model_len)
    command = vllm_command(serving) if serving.fits else None
    if args.json:
        data = {**serving.to_dict(), "command": command}
        data["command_line"] = shlex.join(command) if command else None
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    else:
        print(describe_vllm(serving, command))
    return 0 if serving.fits else NOTHING_FITS


def describe_vllm(serving: ServingPlan, command: Sequence[str] | None) -> str:
    if not serving.fits or command is None:
        lines = [f"{serving.model} on {serving.hardware}: does not fit, so no command."]
        return "\n".join(lines + [f"Advice    {line}" for line in serving.advice])
    layout = f"TP={serving.tensor_parallel_size}, PP={serving.pipeline_parallel_size}"
    nodes = f" on {serving.nodes} nodes" if serving.nodes > 1 else ""
    lines = [f"{serving.model} on {serving.hardware}: {layout}{nodes}", ""]
    if serving.cluster is not None:
        lines += _cluster_lines(serving.cluster) + ["Then on the head node:"]
    else:
        lines.append("Command (paste into a shell):")
    lines += [paste_ready(command), "", *memory_table(serving), ""]
    lines += _reason_lines(serving.reasons)
    lines += [f"Advice    {line}" for line in serving.advice]
    return "\n".join(lines)


def _cluster_lines(cluster: ClusterSetup) -> list[str]:
    lines = ["On every node, in the shell that starts Ray (fill in the placeholders):"]
    for variable in cluster.environment:
        lines.append(f"  export {variable.name}={variable.value}")
        lines.append(f"    # {variable.why}")
    lines.append("On the head node:")
    lines += [f"  {shlex.join(command)}" for command in cluster.head_commands]
    lines.append("On each worker node (HEAD_IP: the head node's address on that network):")
    lines += [f"  {shlex.join(command)}" for command in cluster.worker_commands]
    lines += [f"Note      {note}" for note in cluster.notes]
    return lines


def paste_ready(argv: Sequence[str]) -> str:
    """The command shell-quoted, one flag (and its value) per line, indented, ready to paste."""
    return "  " + " \\\n    ".join(shell_groups(argv))


def memory_table(serving: ServingPlan) -> list[str]:
    rows = [["Memory", "weights", "KV cache", "overhead", "free", "total", "KV tokens"]]
    for gpu in serving.gpus:
        rows.append(
            [
                gpu.device,
                format_bytes(gpu.weights_bytes),
                format_bytes(gpu.kv_bytes),
                format_bytes(gpu.overhead_bytes),
                format_bytes(gpu.free_bytes),
                format_bytes(gpu.total_bytes),
                f"{gpu.kv_tokens:,}",
            ]
        )
    return text_table(rows).splitlines()


def _reason_lines(reasons: Sequence[Reason]) -> list[str]:
    return [f"Why       {reason.setting} = {reason.value}: {reason.why}" for reason in reasons]


# --- llama-server -----------------------------------------------------------------------------


def _run_llama_server(args: argparse.Namespace) -> int:
    hardware = _hardware(args)
    spec = resolve_spec(args.model)
    recipe = llama_server_recipe(spec, hardware, n_ctx=args.ctx)
    usable = recipe.plan.fits or recipe.plan.streams_from_disk
    command = (
        llama_server_command(recipe.plan, model_args=recipe.model_args, port=args.port)
        if usable
        else None
    )
    if args.json:
        data = {**recipe.to_dict(), "command": command}
        data["command_line"] = shlex.join(command) if command else None
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    else:
        print(describe_llama_server(recipe, command))
    return 0 if usable else NOTHING_FITS


def _hardware(args: argparse.Namespace) -> HardwareProfile | ClusterSpec:
    if args.hardware_spec is not None:
        return load_cluster_spec(args.hardware_spec)
    return load_profile(profile_path=args.hardware)


def describe_llama_server(recipe: LlamaServerRecipe, command: Sequence[str] | None) -> str:
    local = recipe.plan
    if command is None:
        lines = [f"{local.model} on {recipe.hardware}: does not fit, so no command."]
        return "\n".join(lines + [f"Advice    {line}" for line in local.advice])
    lines = [f"{local.model} on {recipe.hardware} with llama-server ({local.confidence})", ""]
    lines += ["Command (paste into a shell):", paste_ready(command), ""]
    rows = [["Memory", "weights", "KV cache", "compute", "used", "usable"]]
    for device in local.devices:
        rows.append(
            [
                device.device,
                format_bytes(device.weights_bytes),
                format_bytes(device.kv_bytes),
                format_bytes(device.compute_bytes),
                format_bytes(device.used_bytes),
                format_bytes(device.capacity_bytes),
            ]
        )
    lines += text_table(rows).splitlines() + [""]
    lines.append(
        f"Speed     ~{local.speed.decode_tps:.1f} tok/s decode, "
        f"~{local.speed.prefill_tps:.0f} tok/s prefill (estimate)"
    )
    lines += _reason_lines(recipe.reasons) + _reason_lines(local.reasons)
    lines += [f"Advice    {line}" for line in recipe.advice]
    return "\n".join(lines)
