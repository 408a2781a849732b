"""`hearthside engine ...`: show what the installed llama.cpp can drive and how its build
proved itself (`engine info [--json]`), self-test it again (`engine selftest`), and rebuild it
for this machine (`engine rebuild [--dry-run] [--backend ...]`), climbing the build ladder
until a build passes its self-test (core/probe/engine_ladder.py)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from hearthside.core.paths import data_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.engine import built_backend
from hearthside.core.probe.engine import probe as probe_engine
from hearthside.core.probe.engine_build import (
    BACKENDS,
    EngineBuild,
    GpuTarget,
    build_ladder,
    quick_gpu_scan,
    read_cpu_flags,
    shell_command,
)
from hearthside.core.probe.engine_ladder import (
    AS_INSTALLED,
    Attempt,
    EngineRecord,
    EngineUnusableError,
    SelfTest,
    install_build,
    library_identity,
    prove_engine,
    read_record,
    record_rows,
    run_self_test,
    write_record,
)
from hearthside.core.probe.profile import GpuInfo

# Vendor probe modules (hearthside.core.probe.<vendor>); each reports that vendor's GPUs.
GPU_PROBE_VENDORS = ("nvidia", "amd", "apple")
EXIT_OK = 0
EXIT_FAILED = 1

Installer = Callable[[EngineBuild], bool]


def add_engine_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    engine = subparsers.add_parser(
        "engine",
        help="show or rebuild the llama.cpp engine",
        description="Inspect the installed llama.cpp engine or rebuild it for this machine.",
    )
    commands = engine.add_subparsers(dest="engine_command", metavar="COMMAND", required=True)
    info = commands.add_parser(
        "info", help="show the engine's backends, devices, build flags and self-test"
    )
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(handler=_show_info)
    selftest = commands.add_parser(
        "selftest", help="load the default model in a child process and decode a few tokens"
    )
    selftest.set_defaults(handler=_self_test)
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
    record = read_record(data_dir())
    if args.json:
        print(json.dumps(info_payload(engine, record), indent=2))
        return EXIT_OK if engine is not None else EXIT_FAILED
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
    for line in build_lines(record):
        print(line)
    for error in result.errors:
        print(f"warning: {error.message}", file=sys.stderr)
    return EXIT_OK if engine is not None else EXIT_FAILED


def info_payload(engine: object, record: EngineRecord | None) -> dict[str, object]:
    """`engine info --json`: the engine probe plus the build record and whether it is current."""
    from dataclasses import asdict, is_dataclass

    return {
        "engine": asdict(engine) if is_dataclass(engine) and not isinstance(engine, type) else None,
        "build": record.to_dict() if record is not None else None,
        "self_test_current": record is not None and self_test_is_current(record),
    }


def self_test_is_current(record: EngineRecord) -> bool:
    """The record's self-test was run on the libraries installed now."""
    return bool(record.self_test.library) and record.self_test.library == library_identity()


def build_lines(record: EngineRecord | None) -> list[str]:
    """How the installed build was chosen and proved itself, for people."""
    current = record is not None and self_test_is_current(record)
    return [f"{label.lower()}: {text}" for label, text in record_rows(record, current)]


def _self_test(args: argparse.Namespace) -> int:
    """Test the installed build as it is, and record the outcome (no rebuild)."""
    record = read_record(data_dir())
    build = record.build if record is not None else AS_INSTALLED
    print("Testing the engine on this machine …", flush=True)
    result = run_self_test(sys.executable, self_test_model())
    print(f"The engine ({build.summary}) {result.in_words()}.")
    if not result.passed:
        for line in result.log_tail[-10:]:
            print(f"  {line}", file=sys.stderr)
        print("`hearthside engine rebuild` builds it with safer flags.", file=sys.stderr)
    attempts = (*(record.attempts if record else ()), Attempt(build, result))
    write_record(
        data_dir(), EngineRecord(build, result, f"Self-test: {result.in_words()}.", attempts)
    )
    return EXIT_OK if result.passed else EXIT_FAILED


def self_test_model() -> Path:
    from hearthside.core.models.default_model import cached_default_model_file

    return cached_default_model_file()


def _rebuild(args: argparse.Namespace) -> int:
    return rebuild(args.backend, dry_run=args.dry_run)


def rebuild(
    backend: str = "auto",
    *,
    dry_run: bool = False,
    ctx: ProbeContext | None = None,
    install: Installer | None = None,
    self_test: Callable[[], SelfTest] | None = None,
) -> int:
    """Choose the build, print why and the command; unless `dry_run`, compile it, self-test
    it, and fall back along the ladder until a build passes. The outcome is recorded."""
    ctx = ctx or ProbeContext()
    ladder = build_ladder(
        detect_gpu_targets(ctx),
        platform=ctx.platform,
        machine=ctx.machine,
        backend=backend,
        cpu_flags=read_cpu_flags(ctx.root),
    )
    _print_plan(ladder[0])
    if dry_run:
        return EXIT_OK
    try:
        record = prove_engine(
            ladder,
            install=install or (lambda build: install_build(build, sys.executable, say=print)),
            self_test=self_test or (lambda: run_self_test(sys.executable, self_test_model())),
            say=lambda text: print(text, flush=True),
        )
    except EngineUnusableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    write_record(data_dir(), record)
    print(f"Rebuilt llama-cpp-python: {record.build.summary}. Restart Hearthside to use it.")
    return EXIT_OK


def _print_plan(build: EngineBuild) -> None:
    print(f"Engine build: {build.backend}")
    for reason in build.reasons:
        print(f"  {reason}")
    for warning in build.warnings:
        print(f"  warning: {warning}")
    print("Command:")
    print(f"  {shell_command(build, sys.executable)}")
