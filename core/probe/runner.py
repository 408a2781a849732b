"""Runs the probe sources and assembles the HardwareProfile, in-process or in a child process.

Each source module is imported lazily, so a missing optional library (nvidia-ml-py, amdsmi)
disables only that vendor; a source that raises becomes an entry in `errors`. The GUI and the
server probe in a child process with a timeout, so a hanging or crashing driver cannot take
the app down.
"""

from __future__ import annotations

import importlib
import json
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from hearthside.core.probe.advice import advise
from hearthside.core.probe.base import ProbeContext, ProbeResult, merge_results, os_name
from hearthside.core.probe.profile import CpuInfo, HardwareProfile, MemoryInfo, ProbeError

SOURCES = ("cpu", "memory", "disks", "nvidia", "amd", "apple", "engine")
SUBPROCESS_TIMEOUT_S = 30.0


def run_source(name: str, ctx: ProbeContext) -> ProbeResult:
    """One source's result; its failure is data, never an exception."""
    try:
        module = importlib.import_module(f"hearthside.core.probe.{name}")
    except ImportError as exc:
        return ProbeResult(errors=(ProbeError(name, f"this probe is unavailable: {exc}"),))
    try:
        result = module.probe(ctx)
    except Exception as exc:  # a probe must never take the whole profile down
        return ProbeResult(errors=(ProbeError(name, f"{type(exc).__name__}: {exc}"),))
    if not isinstance(result, ProbeResult):
        return ProbeResult(errors=(ProbeError(name, "the probe returned no result"),))
    return result


def probe_hardware(
    ctx: ProbeContext | None = None, sources: Sequence[str] = SOURCES
) -> HardwareProfile:
    """Probe this machine (or the recorded one `ctx` points at) and add advice."""
    ctx = ctx or ProbeContext()
    results = [run_source(name, ctx) for name in sources]
    profile = merge_results(
        results,
        os=os_name(ctx.platform),
        os_version=platform.release() if ctx.root == Path("/") else None,
        machine=ctx.machine,
    )
    return with_advice(profile)


def with_advice(profile: HardwareProfile) -> HardwareProfile:
    return replace(profile, advice=advise(profile))


def probe_in_subprocess(
    models_dir: Path | None = None,
    timeout_s: float = SUBPROCESS_TIMEOUT_S,
    command: Sequence[str] | None = None,
) -> HardwareProfile:
    """The profile from `python -m hearthside.core.probe`; a hang or crash becomes an error.

    `command` replaces the child's command line (tests use it to make a child crash or hang).
    """
    if command is None:
        command = [sys.executable, "-m", "hearthside.core.probe"]
        if models_dir is not None:
            command += ["--models-dir", str(models_dir)]
    started = time.monotonic()
    try:
        completed = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return _failed_profile(f"the hardware probe did not finish within {timeout_s:g} s")
    if completed.returncode != 0:
        return _failed_profile(_describe_exit(completed.returncode, completed.stderr))
    try:
        return HardwareProfile.from_json(completed.stdout)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
        elapsed = time.monotonic() - started
        return _failed_profile(f"the hardware probe printed no profile ({elapsed:.1f} s)")


def _describe_exit(code: int, stderr: str) -> str:
    if code < 0:
        return f"the hardware probe crashed (signal {-code})"
    last_line = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return f"the hardware probe failed (exit {code}){': ' + last_line if last_line else ''}"


def _failed_profile(message: str) -> HardwareProfile:
    """What is known without probing, plus the reason the probe failed."""
    profile = HardwareProfile(
        cpu=CpuInfo(arch=platform.machine()),
        memory=MemoryInfo(),
        os=os_name(sys.platform),
        errors=(ProbeError("probe", message),),
    )
    return with_advice(profile)
