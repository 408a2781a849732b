"""`hearthside probe` as a user runs it, on this machine and on a what-if spec."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hearthside.core.probe.profile import HardwareProfile

CLI = [sys.executable, "-m", "hearthside.app.cli"]
SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"
GIB = 1024**3


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60)


def test_probe_json_describes_this_machine_quickly() -> None:
    started = time.monotonic()
    result = run_cli("probe", "--json")
    assert time.monotonic() - started < 5
    assert result.returncode == 0, result.stderr
    profile = HardwareProfile.from_json(result.stdout)  # stdout is the profile and nothing else
    assert profile.cpu.logical_cores == os.cpu_count()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    for flag in ("avx2", "avx512f", "amx_tile"):
        assert profile.cpu.has(flag) == (f" {flag}" in cpuinfo)
    assert profile.memory.total_bytes is not None and profile.memory.total_bytes > GIB
    assert profile.engine is not None and "CPU" in profile.engine.backends
    assert len(profile.disks) == 1


def test_probe_prints_a_readable_summary() -> None:
    result = run_cli("probe")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("CPU ")
    assert "Memory " in result.stdout and "Engine " in result.stdout


def test_probe_from_a_spec_of_two_rtx_3090s() -> None:
    result = run_cli("probe", "--from-spec", str(SPECS / "two-rtx-3090.json"), "--json")
    assert result.returncode == 0, result.stderr
    profile = HardwareProfile.from_json(result.stdout)
    assert profile.source == "spec"
    assert [gpu.arch for gpu in profile.gpus] == ["sm_86", "sm_86"]
    assert [gpu.index for gpu in profile.gpus] == [0, 1]
    assert all(gpu.vram_total_bytes == 24 * GIB for gpu in profile.gpus)
    assert profile.memory.total_bytes == 64 * GIB


def test_a_bad_spec_is_a_clear_error(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text('{"schema": 1, "gpus": [{"model": "rtx-3099", "count": 2}], "memory_gb": 64}')
    result = run_cli("probe", "--from-spec", str(spec))
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "rtx-3090" in result.stderr
    assert "Traceback" not in result.stderr
