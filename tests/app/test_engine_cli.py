"""`hearthside engine ...` through a real argparse parser; the real rebuild never runs here."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from hearthside.app import engine_cli
from hearthside.app.engine_cli import add_engine_parser, detect_gpu_targets, rebuild
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.engine_build import GpuTarget, installed_llama_cpp_version


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
    expected = (
        f"CMAKE_ARGS=-DGGML_NATIVE=on {sys.executable} -m pip install --force-reinstall "
        f"--no-cache-dir --no-deps --no-binary=llama-cpp-python "
        f"llama-cpp-python=={installed_llama_cpp_version()}"
    )
    assert expected in out


def test_dry_run_with_a_forced_backend(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_engine("rebuild", "--dry-run", "--backend", "vulkan") == 0
    assert "CMAKE_ARGS=-DGGML_VULKAN=on" in capsys.readouterr().out


def test_info_shows_the_cpu_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_engine("info") == 0
    out = capsys.readouterr().out
    assert "backends: CPU (built for cpu)" in out
    assert "GPU offload: no" in out


def test_rebuild_runs_pip_with_cmake_args_and_says_restart(
    capsys: pytest.CaptureFixture[str],
) -> None:
    calls: list[tuple[list[str], dict[str, str]]] = []

    def fake_pip(command: Sequence[str], env: Mapping[str, str]) -> int:
        calls.append((list(command), dict(env)))
        return 0

    ctx = ProbeContext(root=Path("/nonexistent"), run_command=no_tools, platform="linux")
    assert rebuild(ctx=ctx, run_pip=fake_pip) == 0
    ((command, env),) = calls
    assert command[1:4] == ["-m", "pip", "install"]
    assert env == {"CMAKE_ARGS": "-DGGML_NATIVE=on"}
    assert "Restart Hearthside" in capsys.readouterr().out
    assert rebuild(ctx=ctx, run_pip=lambda command, env: 1) == 1


def test_vendor_probes_fall_back_to_the_quick_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_cli, "_probe_vendor", lambda vendor, ctx: None)

    def smi(command: Sequence[str]) -> str | None:
        return "NVIDIA GeForce RTX 3090, 8.6, 24576\n" if command[0] == "nvidia-smi" else None

    ctx = ProbeContext(root=Path("/nonexistent"), run_command=smi, platform="linux")
    assert detect_gpu_targets(ctx) == [
        GpuTarget("nvidia", "sm_86", "NVIDIA GeForce RTX 3090", 24 * 2**30)
    ]
