"""CalibrationReport: JSON round-trip, `best`, and its JSON file (an export, or the old
`calibration.json` read to import it)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from hearthside.kernels.results import (
    CalibrationError,
    CalibrationReport,
    export_calibration,
    read_calibration_file,
)
from tests.kernels.reports import cpu_measurements, h200_machine, report_with

pytestmark = pytest.mark.beside


@pytest.fixture
def report() -> CalibrationReport:
    return report_with(cpu_measurements(), h200_machine())


def test_a_report_round_trips_through_json(report: CalibrationReport) -> None:
    text = report.to_json()
    again = CalibrationReport.from_json(text)
    assert again == report
    assert json.loads(text)["measurements"][0]["params"] == {"threads": 1, "array_bytes": 268435456}


def test_best_is_the_highest_successful_figure_matching_the_params(
    report: CalibrationReport,
) -> None:
    best_read = report.best("memory_read")
    assert best_read is not None and best_read.params["threads"] == 2
    one_thread = report.best("memory_read", threads=1)
    assert one_thread is not None and one_thread.value == 9.6
    gemm = report.best("matmul", dtype="fp32", m=512)
    assert gemm is not None and gemm.value == 124.0
    assert report.best("matmul", dtype="int8") is None
    assert report.best("h2d", "gpu") is None  # present, but not measured
    disk = report.best("disk_read", "disk:/dev/vda")
    assert disk is not None and disk.value == 1.5


def test_an_exported_report_is_private_and_reads_back(
    report: CalibrationReport, tmp_path: Path
) -> None:
    path = tmp_path / "calib.json"
    assert read_calibration_file(path) is None  # nothing exported yet
    assert export_calibration(report, path) == path
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_calibration_file(path) == report
    assert not list(tmp_path.glob("*.part"))


def test_a_newer_or_damaged_file_is_refused_with_a_hint(
    report: CalibrationReport, tmp_path: Path
) -> None:
    path = export_calibration(report, tmp_path / "calibration.json")
    data = report.to_dict()
    data["schema"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="newer Hearthside") as newer:
        read_calibration_file(path)
    assert "hearthside calibrate" in (newer.value.hint or "")
    path.write_text('{"schema": 1, "measurements": [')
    with pytest.raises(CalibrationError, match="calibration.json is damaged"):
        read_calibration_file(path)
