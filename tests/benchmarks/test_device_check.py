"""benchmarks/device_check.sh without a GPU: its dry mode runs every step's plumbing here, and
the real mode stops at once, saying why, instead of measuring nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device_check.sh"
H200_GOLDEN = REPO / "tests" / "fixtures" / "probe" / "gpu" / "h200" / "golden.json"
CUDA_BUILDS = REPO / "tests" / "fixtures" / "cuda_build"  # recorded here, 2026-12-05
# nvidia-smi's answer to device_check's query, in its own format (CSV, no units), with the
# memory the device machine's H200 reports (143771 MiB, docs/gpu.md)
H200_NVIDIA_SMI = "NVIDIA H200, 143771, 9.0, 570.124.06, 4\n"

needs_no_gpu = pytest.mark.skipif(
    shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi"
)


def device_check() -> object:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import device_check as module

    return module


def run_script(tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHON": sys.executable}
    env.pop("DRY", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
        check=False,
    )


@needs_no_gpu
def test_without_a_gpu_the_device_run_stops_at_once_and_says_why(tmp_path: Path) -> None:
    done = run_script(tmp_path)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "no NVIDIA GPU here" in done.stdout + done.stderr
    assert "--dry" in done.stdout + done.stderr  # and what to do instead
    assert not (tmp_path / "out" / "device-check.json").exists()


@needs_no_gpu
def test_the_dry_run_goes_through_every_step(tmp_path: Path) -> None:
    done = run_script(tmp_path, "--dry")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "out" / "device-check.json").read_text())
    parts = report["parts"]
    assert report["dry"] and parts["preflight"]["gpus"] == []
    assert parts["engine"]["self_test"]["status"] == "passed"  # the installed build, here
    assert parts["engine"]["engine_info"]["status"] == "ok"
    assert parts["probe"]["profile"]["cpu"]["logical_cores"]
    rows = {(row["model"], row["setting"]): row for row in parts["plan"]["rows"]}
    full = rows[("moe", "full offload")]["predicted"]["devices_mib"]
    experts_out = rows[("moe", "experts on the CPU")]["predicted"]["devices_mib"]
    assert full["CUDA0"] > experts_out["CUDA0"] and experts_out["CPU"] > full["CPU"]
    assert all(row["measured"] is None for row in rows.values())
    assert parts["tune"]["status"] == "skipped"
    assert "n/a" in done.stdout  # the ratio table, with nothing measured


def test_the_probe_is_compared_with_nvidia_smi_field_by_field() -> None:
    module = device_check()
    profile = json.loads(H200_GOLDEN.read_text())
    rows = module.nvidia_smi_rows(lambda command: H200_NVIDIA_SMI)
    checks = module.compare_probe(profile, rows)
    assert {check["field"] for check in checks} == {"name", "memory_mib", "arch", "driver"}
    assert all(check["agrees"] for check in checks), checks
    newer_driver = module.nvidia_smi_rows(lambda command: H200_NVIDIA_SMI.replace("570.", "580."))
    disagree = [c["field"] for c in module.compare_probe(profile, newer_driver) if not c["agrees"]]
    assert disagree == ["driver"]


def test_a_wheel_is_carried_only_for_the_architecture_it_holds(tmp_path: Path) -> None:
    module = device_check()
    folder = tmp_path / "engine-wheels" / "0.3.36-cuda-abc"
    folder.mkdir(parents=True)
    (folder / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl").write_bytes(b"")
    shutil.copy(CUDA_BUILDS / "v100-sm70.json", folder / "cuda-build.json")
    assert module.find_cuda_wheel("90", [tmp_path / "engine-wheels"]) is None
    found = module.find_cuda_wheel("70", [tmp_path / "engine-wheels"])
    assert found is not None and found[0].parent == folder


def fake_cuda_wheel(path: Path) -> Path:
    """A wheel laid out as llama-cpp-python's CUDA build is: each library under three names in
    llama_cpp/lib and again in CMake's lib/, headers in include/, and a RECORD of them all."""
    import zipfile

    names = ["llama_cpp/__init__.py", "include/llama.h", "llama_cpp_python-0.3.36.dist-info/WHEEL"]
    for library, version in (
        ("libggml-cuda", "0.25.3"),
        ("libggml", "0.25.3"),
        ("libllama", "0.5.0"),
    ):
        for folder in ("llama_cpp/lib", "lib"):
            names += [f"{folder}/{library}.so{suffix}" for suffix in ("", ".0", f".{version}")]
    record = "llama_cpp_python-0.3.36.dist-info/RECORD"
    with zipfile.ZipFile(path, "w") as wheel:
        for name in names:
            wheel.writestr(name, b"x" * 4096)
        wheel.writestr(
            record, "".join(f"{name},sha256=abc,4096\n" for name in names) + f"{record},,\n"
        )
    return path


def test_a_carried_cuda_wheel_keeps_one_copy_of_each_library_under_the_name_it_is_loaded_by(
    tmp_path: Path,
) -> None:
    """The sm_90 wheel built here is 256 MiB, each library six times over; the device run
    carries 64 MiB. `import llama_cpp` opens libllama.so by path and the rest by soname."""
    import zipfile

    module: Any = device_check()
    cache = tmp_path / "cache" / "0.3.36-cuda-abc"
    cache.mkdir(parents=True)
    fake_cuda_wheel(cache / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    shutil.copy(CUDA_BUILDS / "h200-sm90.json", cache / "cuda-build.json")
    volta = tmp_path / "cache" / "0.3.36-cuda-def"  # another architecture's stays behind
    volta.mkdir()
    fake_cuda_wheel(volta / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl")
    shutil.copy(CUDA_BUILDS / "v100-sm70.json", volta / "cuda-build.json")
    carry = tmp_path / "carry"
    assert module.carry_cuda_wheels(tmp_path / "cache", carry) == 0
    assert sorted(path.name for path in carry.iterdir()) == ["0.3.36-cuda-abc"]
    slim = carry / "0.3.36-cuda-abc" / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(slim) as wheel:
        kept = set(wheel.namelist())
        record = {line.split(",")[0] for line in wheel.read(
            "llama_cpp_python-0.3.36.dist-info/RECORD").decode().splitlines()}  # fmt: skip
    libraries = {name for name in kept if name.startswith("llama_cpp/lib/")}
    assert libraries == {
        "llama_cpp/lib/libllama.so",
        "llama_cpp/lib/libllama.so.0",
        "llama_cpp/lib/libggml.so.0",
        "llama_cpp/lib/libggml-cuda.so.0",
    }
    assert not any(name.startswith(("lib/", "include/")) for name in kept)
    assert record == kept  # pip checks what it installs against RECORD
    assert (carry / "0.3.36-cuda-abc" / "cuda-build.json").exists()
    assert module.carry_cuda_wheels(tmp_path / "nothing", carry) == 1
