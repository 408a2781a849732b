"""`hearthside calibrate` as a user runs it: progress on the terminal, JSON on stdout that
round-trips, the report stored in the autotune DB, and a JSON file only when asked."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.app.calibrate_cli import describe, describe_params
from hearthside.app.cli import main
from hearthside.autotune.calibration import latest_report
from hearthside.autotune.wisdom import WisdomDB, default_wisdom_path
from hearthside.core.paths import data_dir
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.calibrate import DEFAULT_BUDGET_S
from hearthside.kernels.results import LEGACY_FILE_NAME, CalibrationReport
from tests.kernels.reports import cpu_measurements, h200_machine, measured, report_with

CLI = [sys.executable, "-m", "hearthside.app.cli"]


def on_a_terminal(arguments: list[str], stdout_file: Path) -> tuple[int, str]:
    """Run the CLI with stderr on a pseudo-terminal, as in a person's shell: its exit code
    and what the terminal showed (stdout goes to `stdout_file`)."""
    main_end, child_end = pty.openpty()
    with stdout_file.open("w") as stdout:
        process = subprocess.Popen([*CLI, *arguments], stdout=stdout, stderr=child_end)
    os.close(child_end)
    shown = bytearray()
    while True:
        try:
            chunk = os.read(main_end, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        shown += chunk
    os.close(main_end)
    return process.wait(timeout=120), shown.decode(errors="replace")


def test_quick_json_is_only_the_report_stored_in_the_db_and_exported_when_asked(
    default_model_file: Path, tmp_path: Path
) -> None:
    export = tmp_path / "calib.json"
    arguments = ["calibrate", "--json", "--quick", "--model", str(default_model_file)]
    code, terminal = on_a_terminal([*arguments, "--export", str(export)], tmp_path / "out")
    assert code == 0, terminal
    data = json.loads((tmp_path / "out").read_text())  # stdout holds the JSON and nothing else
    report = CalibrationReport.from_dict(data)
    assert report.to_dict() == data
    # --quick is far shorter than a whole calibration, even on a busy machine
    assert report.duration_s < DEFAULT_BUDGET_S
    # the progress line follows the flow's events, kernel by kernel, to the stored report
    assert "Calibrating:   0% memory" in terminal and "Calibrating: 100% stored" in terminal
    assert f"Stored in the autotune database ({default_wisdom_path()})" in terminal
    assert f"Exported to {export}" in terminal
    assert CalibrationReport.from_json(export.read_text()) == report
    with WisdomDB() as wisdom:  # where the planner, the wizard and the Hardware page read it
        assert latest_report(probe_hardware(), wisdom) == report
    assert not (data_dir() / LEGACY_FILE_NAME).exists()
    kinds = {m.kind for m in report.measurements if m.ok}
    assert {"memory_read", "engine_prefill", "engine_decode"} <= kinds


def test_an_export_to_a_missing_folder_is_refused_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["calibrate", "--export", str(tmp_path / "nowhere" / "calib.json")]) == 2
    assert f"error: There is no folder {tmp_path / 'nowhere'}" in capsys.readouterr().err
    with WisdomDB() as wisdom:
        assert wisdom.export()["calibrations"] == []  # nothing was measured


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
