"""The window holds one MachineContext (this machine's profile, calibration figures and
fingerprints) and tells its pages when it changes: after the wizard's calibration the Hardware
and Plan pages show the new figures without "Probe again", Apply or not."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QLabel, QWidget
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import HARDWARE_PAGE, PLAN_PAGE, MainWindow
from hearthside.app.gui.plan_content import CONFIDENCE_TEXT
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.optimize import MeasureUpdate
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.measurement import Measurement, Samples
from hearthside.kernels.results import CalibrationReport

pytestmark = [pytest.mark.gui, pytest.mark.beside]
WAIT_MS = 30_000
CALIBRATED = f"Confidence: calibrated — {CONFIDENCE_TEXT['calibrated']}."


def texts(widget: QWidget) -> str:
    return "\n".join(label.text() for label in widget.findChildren(QLabel))


def a_calibration() -> CalibrationReport:
    """What a calibration of this machine stores: its RAM, compute and disk speeds."""

    def measured(kind: str, device: str, unit: str, value: float, **params: object) -> Measurement:
        samples = Samples(values=(value, value, value), runs=3)
        return Measurement.from_samples(
            kind, device, unit, samples, method="recorded", params=params
        )

    return CalibrationReport(
        schema=1,
        created_at="2026-06-01T09:30:00+00:00",
        hearthside_version="0.1.0",
        machine={},
        measurements=(
            measured("memory_read", "cpu", "GB/s", 21.5, threads=2),
            measured("matmul", "cpu", "GFLOP/s", 140.0, dtype="fp32", m=512, n=1024, k=1024),
            measured("disk_read", "disk:/dev/vda", "GB/s", 1.8),
        ),
        anomalies=(),
        duration_s=40.0,
    )


def test_a_calibration_in_the_wizard_reaches_the_hardware_and_plan_pages(qtbot: QtBot) -> None:
    window = MainWindow(None)
    qtbot.addWidget(window)
    window.show()
    window.hardware_page.show_profile(probe_hardware())
    card = window.hardware_page.calibration_card
    assert card is not None
    qtbot.waitUntil(lambda: card.loaded, timeout=WAIT_MS)
    assert "Not calibrated yet" in texts(window.hardware_page)
    window.show_page(PLAN_PAGE)
    qtbot.waitUntil(lambda: window.plan_page.view is not None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: not window.plan_page.busy, timeout=WAIT_MS)
    assert "Confidence: calibrated" not in window.plan_page.confidence_label.text()
    assert window.machine.context is not None and not window.machine.context.calibrated

    window.optimize_action.trigger()  # the wizard, opened on the window's context
    wizard = window.optimize_wizard
    assert wizard is not None and wizard.found is window.machine.context
    profile = window.machine.context.profile
    with WisdomDB() as wisdom:  # what the wizard's calibration job stores, then reports
        store_calibration(a_calibration(), profile, wisdom)
    with qtbot.waitSignal(window.machine.changed, timeout=WAIT_MS):
        wizard.runner.update.emit(MeasureUpdate("calibrated", fraction=1.0))
    wizard.reject()  # closed without Apply: the calibration is stored all the same

    context = window.machine.context
    assert context is not None and context.calibrated
    assert context.calibration["cpu_read_bytes_per_s"] == pytest.approx(21.5e9)
    qtbot.waitUntil(
        lambda: window.plan_page.confidence_label.text() == CALIBRATED,
        timeout=WAIT_MS,
    )
    view = window.plan_page.view
    assert view is not None and view.calibration["cpu_flops"] == pytest.approx(140e9)
    window.show_page(HARDWARE_PAGE)
    qtbot.waitUntil(
        lambda: "Measured 2026-06-01 09:30 UTC" in texts(window.hardware_page), timeout=WAIT_MS
    )
    assert "Not calibrated yet" not in texts(window.hardware_page)
    assert window.hardware_page.profile is profile  # no "Probe again": the same probe
    window.shutdown()
