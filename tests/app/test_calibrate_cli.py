"""`hearthside calibrate` as a user runs it: JSON on stdout that round-trips and is stored."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.app.calibrate_cli import describe, describe_params
from hearthside.app.cli import main
from hearthside.kernels.calibrate import DEFAULT_BUDGET_S
from hearthside.kernels.results import CALIBRATION_FILE_NAME, CalibrationReport, load_calibration
from tests.kernels.reports import cpu_measurements, h200_machine, measured, report_with

CLI = [sys.executable, "-m", "hearthside.app.cli"]


def test_quick_json_is_only_the_report_and_is_saved(
    default_model_file: Path, hearthside_home: Path
) -> None:
    result = subprocess.run(
        [*CLI, "calibrate", "--json", "--quick", "--model", str(default_model_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)  # stdout holds the JSON and nothing else
    report = CalibrationReport.from_dict(data)
    assert report.to_dict() == data
    # --quick is far shorter than a whole calibration, even on a busy machine
    assert report.duration_s < DEFAULT_BUDGET_S
    assert load_calibration() == report
    assert (hearthside_home / CALIBRATION_FILE_NAME).is_file()
    assert f"Saved to {hearthside_home / CALIBRATION_FILE_NAME}" in result.stderr
    kinds = {m.kind for m in report.measurements if m.ok}
    assert {"memory_read", "engine_prefill", "engine_decode"} <= kinds


def test_the_table_shows_values_specs_and_what_was_not_measured() -> None:
    h200 = [
        measured("memory_read", "cuda:0", 4150.0, gpu="NVIDIA H200"),
        measured(
            "h2d",
            "cuda:0",
            13.1,
            gpu="NVIDIA H200",
            pinned=True,
            pcie_width_now=4,
            pcie_width_max=16,
            pcie_generation_max=5,
        ),
    ]
    report = report_with(cpu_measurements() + h200, h200_machine())
    text = describe(report)
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("kind"))
    assert header.split() == ["kind", "device", "params", "value", "spread", "spec"]
    gpu_read = next(line for line in lines if line.startswith("memory_read") and "cuda:0" in line)
    assert "4,150.0 GB/s" in gpu_read and "4,800.0 GB/s" in gpu_read
    assert any("pinned" in line and "63.0 GB/s" in line for line in lines)
    assert "gpu: h2d — no GPU" in text


# a run of the shipped model at another thread count than the probes'
AT_ONE = {"model": "g", "n_prompt": 128, "threads": 1, "thread_variant": True}


@pytest.mark.parametrize(
    ("measurement", "text"),
    [
        (measured("memory_read", "cpu", 9.6, threads=1), "1 thread"),
        (measured("memory_copy", "cpu", 9.6, threads=2), "2 threads"),
        (
            measured(
                "matmul",
                "cpu",
                9.7,
                "GFLOP/s",
                library="numpy",
                dtype="fp32",
                m=1,
                n=4096,
                k=4096,
                weights_gb_s=19.4,
            ),
            "numpy fp32 1x4096x4096, weights 19.4 GB/s",
        ),
        (measured("engine_decode", "cpu", 70.0, "tok/s", model="gemma", n_gen=32), "gemma tg32"),
        (measured("engine_prefill", "cpu", 90.0, "tok/s", **AT_ONE), "g pp128, 1 thread(s)"),
    ],
)
def test_params_read_as_a_few_words(measurement, text: str) -> None:
    assert describe_params(measurement) == text


def test_a_budget_of_nothing_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--budget-s", "0"]) == 2
    assert "error: The time budget must be more than 0 seconds." in capsys.readouterr().err
