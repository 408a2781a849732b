"""The engine build ladder: which builds to try, what a self-test's exit means, what to do next
(pure, on recorded outcomes), and the real self-test on the real build."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.core.probe.engine_build import (
    EngineBuild,
    GpuTarget,
    build_ladder,
    cpu_build_ladder,
    read_cpu_flags,
)
from hearthside.core.probe.engine_ladder import (
    AS_INSTALLED,
    Attempt,
    EngineRecord,
    EngineUnusableError,
    SelfTest,
    next_ladder_step,
    prove_engine,
    read_record,
    run_self_test,
    self_test_outcome,
    write_record,
)

pytestmark = pytest.mark.beside

REPO_ROOT = Path(__file__).resolve().parents[3]
CPU_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "probe" / "cpu"
SAPPHIRE_RAPIDS = read_cpu_flags(CPU_FIXTURES / "sapphire-rapids-amx")
DESKTOP_AVX2 = read_cpu_flags(CPU_FIXTURES / "desktop-avx2-6core")
ARM_SERVER = read_cpu_flags(CPU_FIXTURES / "arm-sve-server")
RTX_3090 = GpuTarget("nvidia", "sm_86", "NVIDIA GeForce RTX 3090", 24 * 2**30)

# What the self-test child left behind when ggml's AMX matmul crashed (llama.cpp #20824):
# killed by SIGSEGV, faulthandler's stack last on stderr.
AMX_CRASH = SelfTest(
    "crashed",
    "SIGSEGV",
    -11,
    (
        "llama_context:        CPU compute buffer size is    98.25 MiB",
        "Fatal Python error: Segmentation fault",
        '  File "llama_cpp/llama.py", line 652 in eval',
    ),
    1.8,
)
PASSED = SelfTest("passed", exit_code=0, seconds=0.9, text=" Paris.", decode_tok_s=98.0)


def ladder_of(flags: frozenset[str], machine: str = "x86_64") -> list[str]:
    return [build.rung for build in cpu_build_ladder(flags, machine)]


def switches(build: EngineBuild) -> dict[str, str]:
    pairs = (arg.removeprefix("-D").split("=", 1) for arg in build.cmake_args)
    return {key: value for key, value in pairs}


def test_sapphire_rapids_gets_its_own_instruction_sets_without_amx_then_avx2_then_none() -> None:
    ladder = cpu_build_ladder(SAPPHIRE_RAPIDS, "x86_64")
    assert [build.rung for build in ladder] == ["cpu-features", "avx2", "no-simd"]
    first, avx2, none = (switches(build) for build in ladder)
    assert first["GGML_NATIVE"] == "OFF"  # NATIVE turns AMX on wherever the CPU has it
    assert first["GGML_AVX512"] == first["GGML_AVX512_BF16"] == first["GGML_AVX_VNNI"] == "ON"
    assert all(switches(build)[f"GGML_AMX_{kind}"] == "OFF" for build in ladder
               for kind in ("TILE", "INT8", "BF16"))  # fmt: skip
    assert avx2["GGML_AVX2"] == avx2["GGML_FMA"] == "ON" and avx2["GGML_AVX512"] == "OFF"
    assert {key for key, value in none.items() if value == "ON"} == set()
    assert "no AMX" in ladder[0].summary and "AVX-512" in ladder[0].summary


def test_an_avx2_desktop_skips_the_avx2_rung_its_first_build_already_is() -> None:
    assert ladder_of(DESKTOP_AVX2) == ["cpu-features", "no-simd"]


def test_arm_uses_native_then_the_generic_target() -> None:
    assert ladder_of(ARM_SERVER, "aarch64") == ["native", "generic"]
    assert ladder_of(frozenset(), "x86_64") == ["native", "no-simd"]  # flags unknown (macOS)


def test_a_gpu_build_falls_back_to_the_cpu_ladder() -> None:
    ladder = build_ladder([RTX_3090], platform="linux", machine="x86_64", cpu_flags=DESKTOP_AVX2)
    assert [build.rung for build in ladder] == ["cuda", "cpu-features", "no-simd"]
    cpu_only = build_ladder([], platform="linux", machine="x86_64", cpu_flags=DESKTOP_AVX2)
    assert cpu_only[0].reasons[0] == "No NVIDIA, AMD or Apple GPU found."


def test_a_crash_climbs_to_the_next_rung_and_says_why_in_plain_words() -> None:
    ladder = cpu_build_ladder(SAPPHIRE_RAPIDS, "x86_64")
    step = next_ladder_step(ladder, [Attempt(ladder[0], AMX_CRASH)])
    assert step.action == "build" and step.build == ladder[1]
    assert "crashed in its self-test (SIGSEGV, a segmentation fault)" in step.message
    assert "Rebuilding it for an AVX2 baseline" in step.message

    kept = next_ladder_step(ladder, [Attempt(ladder[0], AMX_CRASH), Attempt(ladder[1], PASSED)])
    assert (kept.action, kept.build) == ("keep", ladder[1])
    assert "passed its self-test" in kept.message


def test_nothing_left_gives_up_naming_every_try() -> None:
    ladder = cpu_build_ladder(DESKTOP_AVX2, "x86_64")
    hung = SelfTest("timeout", seconds=180)
    attempts = [Attempt(ladder[0], AMX_CRASH), Attempt(ladder[1], hung)]
    step = next_ladder_step(ladder, attempts)
    assert step.action == "give_up" and step.build is None
    assert "SIGSEGV" in step.message
    assert "hung in its self-test (no answer in 180 s)" in step.message


def test_a_build_that_does_not_compile_counts_as_tried() -> None:
    ladder = cpu_build_ladder(SAPPHIRE_RAPIDS, "x86_64")
    step = next_ladder_step(ladder, [Attempt(ladder[0], SelfTest("build_failed"))])
    assert step.build == ladder[1] and "failed to compile" in step.message


def test_an_old_install_is_tested_first_and_kept_when_it_passes() -> None:
    ladder = cpu_build_ladder(DESKTOP_AVX2, "x86_64")
    installed: list[EngineBuild] = []
    record = prove_engine(
        ladder,
        install=lambda build: installed.append(build) or True,
        self_test=lambda: PASSED,
        say=lambda text: None,
        installed=AS_INSTALLED,
    )
    assert installed == [] and record.build == AS_INSTALLED


def test_the_loop_rebuilds_after_recorded_crashes_until_one_passes() -> None:
    ladder = cpu_build_ladder(SAPPHIRE_RAPIDS, "x86_64")
    outcomes = iter([AMX_CRASH, PASSED])
    installed: list[str] = []
    said: list[str] = []
    record = prove_engine(
        ladder,
        install=lambda build: installed.append(build.rung) or True,
        self_test=lambda: next(outcomes),
        say=said.append,
        installed=ladder[0],
    )
    assert installed == ["avx2"]
    assert record.build.rung == "avx2" and record.self_test.passed
    assert [a.result.status for a in record.attempts] == ["crashed", "passed"]
    assert any("SIGSEGV" in line for line in said)

    with pytest.raises(EngineUnusableError, match="No build of the engine works"):
        prove_engine(
            ladder,
            install=lambda build: True,
            self_test=lambda: AMX_CRASH,
            say=lambda text: None,
        )


@pytest.mark.parametrize(
    ("returncode", "stderr", "status", "signal"),
    [
        (-11, "Fatal Python error: Segmentation fault\n", "crashed", "SIGSEGV"),
        (-4, "", "crashed", "SIGILL"),
        (134, "ggml.c:1234: GGML_ASSERT(hparams.n_layer > 0) failed\n", "crashed", "SIGABRT"),
        (1, "ValueError: Failed to load model from file\n", "failed", None),
    ],
)
def test_exit_statuses_mean_what_they_say(
    returncode: int, stderr: str, status: str, signal: str | None
) -> None:
    result = self_test_outcome(returncode, "", stderr, 1.0)
    assert (result.status, result.signal) == (status, signal)
    assert result.log_tail == tuple(line for line in stderr.splitlines() if line)


def test_a_passing_child_reports_what_it_decoded() -> None:
    stdout = "noise\n" + json.dumps({"status": "passed", "text": " Paris", "decode_tok_s": 90.5})
    result = self_test_outcome(0, stdout, "", 0.7)
    assert result.passed and result.text == " Paris" and result.decode_tok_s == 90.5


def test_records_round_trip_through_the_data_folder(tmp_path: Path) -> None:
    ladder = cpu_build_ladder(SAPPHIRE_RAPIDS, "x86_64")
    record = EngineRecord(
        ladder[1],
        PASSED,
        "kept",
        (Attempt(ladder[0], AMX_CRASH), Attempt(ladder[1], PASSED)),
        llama_cpp_version="0.3.36",
    )
    write_record(tmp_path / "data", record)
    assert read_record(tmp_path / "data") == record
    (tmp_path / "data" / "engine-build.json").write_text("{not json")
    assert read_record(tmp_path / "data") is None


def test_a_child_killed_by_a_real_signal_is_a_crash(tmp_path: Path) -> None:
    crashing_python = tmp_path / "python"
    crashing_python.write_text("#!/bin/sh\necho 'about to crash' >&2\nkill -SEGV $$\n")
    crashing_python.chmod(0o755)
    result = run_self_test(str(crashing_python), tmp_path / "any.gguf")
    assert (result.status, result.signal) == ("crashed", "SIGSEGV")
    assert result.log_tail == ("about to crash",)
    assert "segmentation fault" in result.in_words()


def test_the_self_test_offloads_every_layer(tmp_path: Path) -> None:
    """A CUDA build without code for this GPU fails only once layers run on the GPU; a CPU
    build ignores the request (the real self-test below passes with it)."""
    echoing_python = tmp_path / "python"
    echoing_python.write_text('#!/bin/sh\necho "$@" >&2\nexit 1\n')
    echoing_python.chmod(0o755)
    result = run_self_test(str(echoing_python), tmp_path / "any.gguf")
    assert result.status == "failed"
    assert result.log_tail[-1].endswith("--gpu-layers -1")


@pytest.mark.slow
def test_the_real_self_test_passes_on_the_real_build(chat_model_file: Path) -> None:
    result = run_self_test(sys.executable, chat_model_file)
    assert result.passed, result.log_tail
    assert result.text.strip() and result.decode_tok_s and result.decode_tok_s > 0
    assert "AVX" in result.system_info or "NEON" in result.system_info
    assert "libllama" in result.library


def test_runs_as_a_plain_script_without_hearthside() -> None:
    """bootstrap.py runs it before Hearthside is installed: stdlib and engine_build.py only."""
    script = REPO_ROOT / "core" / "probe" / "engine_ladder.py"
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(script), "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert "install" in result.stdout and "prove" in result.stdout
