"""`hearthside engine ...`: show what the installed llama.cpp can drive, and rebuild it for
this machine's GPUs (`engine rebuild [--dry-run] [--backend ...]`)."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.engine import built_backend
from hearthside.core.probe.engine import probe as probe_engine
from hearthside.core.probe.engine_build import (
    BACKENDS,
    EngineBuild,
    GpuTarget,
    choose_build,
    pip_command,
    quick_gpu_scan,
    shell_command,
)
from hearthside.core.probe.profile import GpuInfo

# Vendor probe modules (hearthside.core.probe.<vendor>); each reports that vendor's GPUs.
GPU_PROBE_VENDORS = ("nvidia", "amd", "apple")
EXIT_OK = 0
EXIT_FAILED = 1

PipRunner = Callable[[Sequence[str], Mapping[str, str]], int]


def add_engine_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser(
        "engine",
        help="show or rebuild the llama.cpp engine",
        description="Inspect the installed llama.cpp engine or rebuild it for this machine.",
    )
    commands = engine.add_subparsers(dest="engine_command", metavar="COMMAND", required=True)
    info = commands.add_parser("info", help="show the engine's backends and devices")
    info.set_defaults(handler=_show_info)
    rebuild = commands.add_parser(
        "rebuild", help="recompile llama-cpp-python for this machine's GPUs"
    )
    rebuild.add_argument(
        "--dry-run", action="store_true", help="print the plan and the command, run nothing"
    )
    rebuild.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="the backend to build (default: chosen from the GPUs found)",
    )
    rebuild.set_defaults(handler=_rebuild)


# --- finding GPUs -----------------------------------------------------------------------------


def gpu_target(gpu: GpuInfo) -> GpuTarget:
    return GpuTarget(gpu.vendor, gpu.arch, gpu.name, gpu.vram_total_bytes)


def detect_gpu_targets(ctx: ProbeContext) -> list[GpuTarget]:
    """GPUs from the vendor probe modules; a vendor whose module is absent or fails is
    covered by the stdlib-only `quick_gpu_scan` instead."""
    targets: list[GpuTarget] = []
    uncovered: set[str] = set()
    for vendor in GPU_PROBE_VENDORS:
        gpus = _probe_vendor(vendor, ctx)
        if gpus is None:
            uncovered.add(vendor)
        else:
            targets += [gpu_target(gpu) for gpu in gpus]
    if uncovered:
        scanned = quick_gpu_scan(ctx.run_command, ctx.root, ctx.platform)
        targets += [gpu for gpu in scanned if gpu.vendor in uncovered]
    return targets


def _probe_vendor(module_name: str, ctx: ProbeContext) -> tuple[GpuInfo, ...] | None:
    try:
        module = importlib.import_module(f"hearthside.core.probe.{module_name}")
    except ImportError:
        return None
    try:
        return tuple(module.probe(ctx).gpus)
    except Exception:  # another team's probe failing must not block a rebuild
        return None


# --- commands ---------------------------------------------------------------------------------


def _show_info(args: argparse.Namespace) -> int:
    result = probe_engine(ProbeContext())
    engine = result.engine
    if engine is not None:
        print(f"llama-cpp-python {engine.package_version or 'unknown'}")
        print(
            f"backends: {', '.join(engine.backends) or 'none'} (built for {built_backend(engine)})"
        )
        print(f"GPU offload: {'yes' if engine.gpu_offload else 'no'}")
        for device in engine.devices:
            memory = (
                f", {device.memory_total_bytes / 2**30:.1f} GiB"
                if device.memory_total_bytes
                else ""
            )
            print(f"  {device.name} ({device.kind}): {device.description}{memory}")
    for error in result.errors:
        print(f"warning: {error.message}", file=sys.stderr)
    return EXIT_OK if engine is not None else EXIT_FAILED


def _rebuild(args: argparse.Namespace) -> int:
    return rebuild(args.backend, dry_run=args.dry_run)


def rebuild(
    backend: str = "auto",
    *,
    dry_run: bool = False,
    ctx: ProbeContext | None = None,
    run_pip: PipRunner | None = None,
) -> int:
    """Choose the build, print why and the exact command; unless `dry_run`, run it."""
    ctx = ctx or ProbeContext()
    build = choose_build(
        detect_gpu_targets(ctx), platform=ctx.platform, machine=ctx.machine, backend=backend
    )
    _print_plan(build)
    if dry_run:
        return EXIT_OK
    code = (run_pip or _stream_pip)(pip_command(build, sys.executable), build.env)
    if code != 0:
        print(f"error: the rebuild failed (pip exited with {code}).", file=sys.stderr)
        return EXIT_FAILED
    print(f"Rebuilt llama-cpp-python for {build.backend}. Restart Hearthside to use it.")
    return EXIT_OK


def _print_plan(build: EngineBuild) -> None:
    print(f"Engine build: {build.backend}")
    for reason in build.reasons:
        print(f"  {reason}")
    for warning in build.warnings:
        print(f"  warning: {warning}")
    print("Command:")
    print(f"  {shell_command(build, sys.executable)}")


def _stream_pip(command: Sequence[str], env: Mapping[str, str]) -> int:
    """Runs pip with its output going straight to this terminal (the build takes minutes)."""
    print("Compiling llama.cpp; this takes 5-10 minutes …", flush=True)
    return subprocess.call(list(command), env={**os.environ, **env})
