"""The probe runner: sources are isolated; the child-process probe survives hangs and crashes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from hearthside.core.probe import runner
from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.profile import CpuInfo, HardwareProfile


def test_a_missing_source_module_is_an_error_entry_not_a_crash() -> None:
    result = runner.run_source("no_such_vendor", ProbeContext())
    assert result.errors and result.errors[0].source == "no_such_vendor"


def test_a_source_that_raises_is_an_error_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    class Exploding:
        @staticmethod
        def probe(ctx: ProbeContext) -> ProbeResult:
            raise OSError("driver wedged")

    monkeypatch.setattr(runner.importlib, "import_module", lambda name: Exploding)
    result = runner.run_source("nvidia", ProbeContext())
    assert result.errors[0].message == "OSError: driver wedged"


def test_results_merge_into_one_profile_with_advice(monkeypatch: pytest.MonkeyPatch) -> None:
    class Cpu:
        @staticmethod
        def probe(ctx: ProbeContext) -> ProbeResult:
            return ProbeResult(cpu=CpuInfo(arch="x86_64", physical_cores=6, flags=("avx2",)))

    monkeypatch.setattr(runner.importlib, "import_module", lambda name: Cpu)
    profile = runner.probe_hardware(ProbeContext(), sources=("cpu",))
    assert profile.cpu.physical_cores == 6
    assert profile.os == "linux"


def test_the_child_process_probe_returns_this_machines_profile(tmp_path: Path) -> None:
    started = time.monotonic()
    profile = runner.probe_in_subprocess(models_dir=tmp_path)
    assert time.monotonic() - started < 10
    assert isinstance(profile, HardwareProfile)
    assert profile.cpu.arch


def test_a_hanging_child_becomes_an_error_entry() -> None:
    hang = [sys.executable, "-c", "import time; time.sleep(30)"]
    started = time.monotonic()
    profile = runner.probe_in_subprocess(command=hang, timeout_s=1.0)
    assert time.monotonic() - started < 5
    assert "did not finish within 1 s" in profile.errors[0].message


def test_a_crashing_child_becomes_an_error_entry() -> None:
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    profile = runner.probe_in_subprocess(command=crash)
    assert "crashed (signal 11)" in profile.errors[0].message


def test_a_child_printing_garbage_becomes_an_error_entry() -> None:
    profile = runner.probe_in_subprocess(command=[sys.executable, "-c", "print('hello')"])
    assert "printed no profile" in profile.errors[0].message
