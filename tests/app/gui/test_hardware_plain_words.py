"""The Hardware page in plain words: what the machine is good for (from the real planner's
predictions, with and without a calibration), what each processor feature means, and the
calibration's short summary with the raw figures behind "Details"."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from hearthside.app.gui import hardware_page
from hearthside.app.gui.hardware_page import (
    DISTURBED,
    NOT_CALIBRATED,
    HardwarePage,
    feature_rows,
    good_for_text,
    predict_sizes,
    speed_words,
)
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.measurement import Measurement, Samples
from hearthside.kernels.results import CalibrationReport
from tests.app.gui.test_hardware_page import (
    golden,
    printing,
    probed_page,
    recorded_report,
    rtx_3090_desktop,
)

pytestmark = [pytest.mark.gui, pytest.mark.beside]
BUSY_FLAG = (
    "Other programs kept 1.0 of 2 cores busy while measuring: the figures may be low; "
    "measure again when the computer is idle."
)
UNSTEADY_FLAG = (
    "3 of 5 measurements varied by more than 15% between repetitions (memory_read (cpu)): "
    "predictions from them are less certain; measuring again may give steadier figures."
)


def shown_texts(widget: object) -> list[str]:
    return [label.text() for label in widget.findChildren(QLabel) if label.isVisibleTo(widget)]  # type: ignore[attr-defined]


def test_speeds_are_said_as_a_reader_feels_them() -> None:
    assert speed_words(40.0) == "about 30 words a second, faster than you read"
    assert speed_words(6.0) == "about 4 words a second, as fast as you read"
    assert speed_words(2.4) == "about 2 words a second, slower than you read"
    assert speed_words(0.3) == "about one word every 4 seconds: too slow to chat"


def test_the_summary_comes_from_the_planner_and_follows_the_calibration() -> None:
    profile = rtx_3090_desktop()  # a CPU-only engine: the RTX 3090 cannot be used
    typical = predict_sizes(profile, {})
    assert [p.size for p in typical] == ["1B", "3B", "8B", "14B", "32B", "70B"]
    speeds = [p.decode_tps for p in typical if p.fits]
    assert speeds == sorted(speeds, reverse=True) and speeds[0] > 0  # bigger is slower
    text = good_for_text(profile, typical)
    assert text.startswith("6 cores with AVX2 and ")
    assert "GiB of memory, NVIDIA GeForce RTX 3090: " in text
    # A measured memory speed 4× higher: every size the planner fits writes faster.
    faster = predict_sizes(profile, {"cpu_read_bytes_per_s": 40e9})
    slower = predict_sizes(profile, {"cpu_read_bytes_per_s": 10e9})
    assert all(f.decode_tps > s.decode_tps for f, s in zip(faster, slower, strict=True) if f.fits)


def test_each_processor_feature_says_what_it_means_and_amx_is_off_on_purpose() -> None:
    spr: HardwareProfile = golden("cpu", "sapphire-rapids-amx")
    rows = dict(feature_rows(spr.cpu.flags))
    assert {"AVX2", "AVX-512", "VNNI", "AMX"} <= set(rows)
    assert "left off on purpose" in rows["AMX"] and "crashes" in rows["AMX"]
    desktop = dict(feature_rows(rtx_3090_desktop().cpu.flags))
    assert "AMX" not in desktop and "AVX-512" not in desktop


def test_the_page_says_what_the_machine_is_good_for_before_the_details(
    qtbot: QtBot, tmp_path: Path
) -> None:
    profile = rtx_3090_desktop()
    page, _ = probed_page(qtbot, printing(profile, tmp_path))
    card = page.good_for_card
    assert card is not None
    assert card.headline.text() == good_for_text(profile, predict_sizes(profile, {}))
    qtbot.waitUntil(lambda: "8B models" in shown_texts(card))  # layouts show children queued
    shown = shown_texts(card)
    assert "70B models" in shown
    assert any(text.startswith("Estimated from typical figures") for text in shown)
    calibration = page.calibration_card
    assert calibration is not None and calibration.status.text() == NOT_CALIBRATED
    assert calibration.measure_button.text() == "Measure this machine"
    content = page.scroll_area.widget().layout()
    assert content.itemAt(0).widget() is card  # first on the page


def disturbed_report() -> CalibrationReport:
    base = recorded_report(anomalies=(BUSY_FLAG,))
    disk = Measurement.from_samples(
        "disk_read", "disk:/dev/vda", "GB/s", Samples((1.6, 1.6, 1.7), 3), method="read"
    )
    return replace(base, measurements=(*base.measurements, disk))


def test_the_calibration_is_a_short_summary_with_the_raw_figures_behind_details(
    qtbot: QtBot, tmp_path: Path
) -> None:
    with WisdomDB() as wisdom:
        store_calibration(disturbed_report(), rtx_3090_desktop(), wisdom)
    page, _ = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    card = page.calibration_card
    assert card is not None and card.view is not None and card.view.calibrated
    assert card.status.text() == DISTURBED and card.status.isVisibleTo(card)
    qtbot.waitUntil(lambda: "38 GB/s: how fast a model writes" in shown_texts(card))
    shown = shown_texts(card)
    assert any(text.startswith("1.6 GB/s: a 4 GiB model loads in about") for text in shown)
    assert "writes 72 tokens a second" in shown
    assert not any("threads=6" in text for text in shown)  # the raw rows wait behind Details
    card.details_button.click()
    qtbot.waitUntil(lambda: any("threads=6" in text for text in shown_texts(card)))
    shown = shown_texts(card)
    assert any("38.2 GB/s ±2%   threads=6" in text for text in shown)
    assert BUSY_FLAG in shown
    assert card.measure_button.text() == "Measure again"
    good_for = page.good_for_card
    assert good_for is not None
    assert any(t.startswith("Predicted from this machine's own") for t in shown_texts(good_for))


def test_repeats_that_varied_are_no_claim_that_other_programs_were_busy() -> None:
    """An idle 2-vCPU VM's repeats vary by more than 15% (17-29 of 53 measurements): only the
    CPU time other programs used says they were busy."""
    unsteady = hardware_page.report_view(recorded_report(anomalies=(UNSTEADY_FLAG,)))
    assert not unsteady.disturbed and UNSTEADY_FLAG in unsteady.notes
    busy = hardware_page.report_view(recorded_report(anomalies=(BUSY_FLAG, UNSTEADY_FLAG)))
    assert busy.disturbed


def test_measure_without_an_engine_says_so(qtbot: QtBot, tmp_path: Path) -> None:
    page, _ = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    assert isinstance(page, HardwarePage) and page.service is None
    card = page.calibration_card
    assert card is not None
    card.measure_button.click()
    assert "The engine is still starting." in card.status.text()
    assert hardware_page.MEASURING not in card.status.text()


def test_an_untested_engine_gets_a_button_not_a_command(qtbot: QtBot, tmp_path: Path) -> None:
    page, _ = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    rows = dict(hardware_page.build_rows())
    assert rows == {"Build": "not tested on this machine yet: “Test the engine” tests it"}
    assert page.selftest_button is not None and page.selftest_button.text() == "Test the engine"


@pytest.mark.slow  # loads the default model in a child process
def test_the_engine_test_runs_and_the_card_shows_its_record(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_file: Path
) -> None:
    page, _ = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    monkeypatch.setattr(
        hardware_page.QMessageBox,
        "question",
        lambda *_args: hardware_page.QMessageBox.StandardButton.Yes,
    )
    assert page.selftest_button is not None
    page.selftest_button.click()
    qtbot.waitUntil(lambda: page.process is None, timeout=300_000)
    assert page.log_title.text() == "Finished: the engine passed its test."
    assert page.selftest_button is None  # the card was read again: a current record now
    assert "passed its self-test" in " ".join(t for t in shown_texts(page))
