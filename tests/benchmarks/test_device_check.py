"""benchmarks/device_check.sh without a GPU: its dry mode runs every step's plumbing here, and
the real mode stops at once, saying why, instead of measuring nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device_check.sh"
H200_GOLDEN = REPO / "tests" / "fixtures" / "probe" / "gpu" / "h200" / "golden.json"
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
    (folder / "cuda-build.json").write_text(json.dumps({"archs_found": ["70"]}))
    assert module.find_cuda_wheel("90", [tmp_path / "engine-wheels"]) is None
    found = module.find_cuda_wheel("70", [tmp_path / "engine-wheels"])
    assert found is not None and found[0].parent == folder
