"""`hearthside engine ...` through a real argparse parser; the real rebuild never runs here."""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from hearthside.app import engine_cli
from hearthside.app.engine_cli import add_engine_parser, detect_gpu_targets, rebuild
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.engine_build import (
    EngineBuild,
    GpuTarget,
    installed_llama_cpp_version,
)
from hearthside.core.probe.engine_ladder import read_record
from tests.core.probe.test_engine_ladder import AMX_CRASH, PASSED

pytestmark = pytest.mark.beside


def run_engine(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_engine_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["engine", *argv])
    return int(args.handler(args))


def no_tools(command: Sequence[str]) -> str | None:
    return None


def test_dry_run_on_this_machine_prints_a_cpu_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_engine("rebuild", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "Engine build: cpu" in out
    command = (
        f"{sys.executable} -m pip install --force-reinstall --no-cache-dir --no-deps "
        f"--no-binary=llama-cpp-python llama-cpp-python=={installed_llama_cpp_version()}"
    )
    assert command in out
    if platform.machine() in ("x86_64", "AMD64"):
        assert "no AMX." in out and "-DGGML_NATIVE=OFF" in out and "-DGGML_AMX_TILE=OFF" in out


def test_dry_run_with_a_forced_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_engine("rebuild", "--dry-run", "--backend", "vulkan") == 0
    assert "CMAKE_ARGS=-DGGML_VULKAN=on" in capsys.readouterr().out


def test_info_shows_the_cpu_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_engine("info") == 0
    out = capsys.readouterr().out
    assert "backends: CPU (built for cpu)" in out
    assert "GPU offload: no" in out


def test_rebuild_climbs_the_ladder_after_a_crash_and_records_it(
    capsys: pytest.CaptureFixture[str], hearthside_home: Path
) -> None:
    installed: list[EngineBuild] = []
    outcomes = iter([AMX_CRASH, PASSED])

    def install(build: EngineBuild) -> bool:
        installed.append(build)
        return True

    ctx = ProbeContext(root=Path("/nonexistent"), run_command=no_tools, platform="linux")
    assert rebuild(ctx=ctx, install=install, self_test=lambda: next(outcomes)) == 0
    assert [build.rung for build in installed] == ["native", "no-simd"]
    out = capsys.readouterr().out
    assert "crashed in its self-test (SIGSEGV, a segmentation fault)" in out
    assert "Restart Hearthside" in out
    record = read_record(hearthside_home)
    assert record is not None and record.build.rung == "no-simd"
    assert [attempt.result.status for attempt in record.attempts] == ["crashed", "passed"]


def test_rebuild_stops_with_a_clear_error_when_nothing_compiles(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = ProbeContext(root=Path("/nonexistent"), run_command=no_tools, platform="linux")
    assert rebuild(ctx=ctx, install=lambda build: False, self_test=lambda: PASSED) == 1
    assert "No build of the engine works on this machine" in capsys.readouterr().err


def test_info_json_reports_the_flags_the_reason_and_the_self_test(
    capsys: pytest.CaptureFixture[str], hearthside_home: Path, chat_model_file: Path
) -> None:
    assert run_engine("selftest") == 0
    assert "passed its self-test" in capsys.readouterr().out
    assert run_engine("info", "--json") == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["engine"]["backends"] == ["CPU"]
    assert payload["build"]["self_test"]["status"] == "passed"
    assert payload["build"]["self_test"]["text"].strip()
    assert payload["build"]["build"]["reasons"]
    assert payload["self_test_current"] is True
    assert run_engine("info") == 0
    assert "self-test: passed its self-test" in capsys.readouterr().out


def test_vendor_probes_fall_back_to_the_quick_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_cli, "_probe_vendor", lambda vendor, ctx: None)

    def smi(command: Sequence[str]) -> str | None:
        return "NVIDIA GeForce RTX 3090, 8.6, 24576\n" if command[0] == "nvidia-smi" else None

    ctx = ProbeContext(root=Path("/nonexistent"), run_command=smi, platform="linux")
    assert detect_gpu_targets(ctx) == [
        GpuTarget("nvidia", "sm_86", "NVIDIA GeForce RTX 3090", 24 * 2**30)
    ]
