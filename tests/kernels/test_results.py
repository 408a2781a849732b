"""CalibrationReport: JSON round-trip, `best`, and its one file in the data dir."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from hearthside.kernels.results import (
    CALIBRATION_FILE_NAME,
    CalibrationError,
    CalibrationReport,
    load_calibration,
    save_calibration,
)
from tests.kernels.reports import cpu_measurements, h200_machine, report_with


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


def test_saved_report_is_private_and_loads_back(
    report: CalibrationReport, hearthside_home: Path
) -> None:
    assert load_calibration() is None  # never calibrated
    path = save_calibration(report)
    assert path == hearthside_home / CALIBRATION_FILE_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_calibration() == report
    assert not list(hearthside_home.glob("*.part"))


def test_a_newer_or_damaged_calibration_is_refused_with_a_hint(
    report: CalibrationReport, hearthside_home: Path
) -> None:
    path = save_calibration(report)
    data = report.to_dict()
    data["schema"] = 99
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="newer Hearthside") as newer:
        load_calibration()
    assert "hearthside calibrate" in (newer.value.hint or "")
    path.write_text('{"schema": 1, "measurements": [')
    with pytest.raises(CalibrationError, match="damaged"):
        load_calibration()
