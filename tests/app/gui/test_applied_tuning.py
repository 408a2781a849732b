"""The wizard's result in plain words, and what the window does after Apply: it says what
changed (from the recorded real run's measured result) and the Hardware and Plan pages read
the new measurements without "Probe again"."""

from __future__ import annotations

import pytest
from PySide6.QtWidgets import QWizard
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import PLAN_PAGE, MainWindow
from hearthside.app.gui.wizard import applied_text, plain_reason
from hearthside.autotune.optimize import AppliedTuning
from hearthside.autotune.planner import Reason
from hearthside.core.probe.runner import probe_hardware
from tests.app.gui.test_wizard import recorded_result_page

pytestmark = [pytest.mark.gui, pytest.mark.beside]


def test_the_result_page_speaks_of_settings_not_field_names(qtbot: QtBot) -> None:
    wizard, _result = recorded_result_page(qtbot)
    reasons = wizard.result_page.reasons.text()
    assert reasons.startswith("<b>Why</b>")
    for field_talk in ("n_gpu_layers", "recipe", "n_threads", "type_k", " = ", "None"):
        assert field_talk not in reasons, field_talk
    assert plain_reason(Reason("recipe", "decode-threads-physical-cores", "a prior")) is None
    assert plain_reason(Reason("n_gpu_layers", "0", "No GPU.")) == (
        "Layers on the graphics processor",
        "none: the processor does all the work",
        "No GPU.",
    )
    wizard.reject()


def test_apply_says_what_changed_and_refreshes_the_pages(qtbot: QtBot) -> None:
    window = MainWindow(None)
    qtbot.addWidget(window)
    window.show()
    window.hardware_page.show_profile(probe_hardware())
    first_card = window.hardware_page.calibration_card
    assert first_card is not None
    qtbot.waitUntil(lambda: first_card.loaded, timeout=20_000)
    window.show_page(PLAN_PAGE)
    qtbot.waitUntil(lambda: not window.plan_page.busy, timeout=30_000)
    first_plan = window.plan_page.view
    assert first_plan is not None
    wizard, result = recorded_result_page(qtbot)
    wizard.applied.connect(window._apply_tuning)
    with qtbot.waitSignal(wizard.applied, timeout=5_000) as applied:
        wizard.button(QWizard.WizardButton.FinishButton).click()
    tuning: AppliedTuning = applied.args[0]
    assert window.message_bar.text == applied_text(tuning)
    assert tuning.speedup is not None and result.speedup == tuning.speedup
    assert f"{tuning.speedup:.1f}× faster than llama.cpp's own settings" in applied_text(tuning)
    threads = tuning.config.n_threads
    assert (f"{threads} thread" if threads else "one thread per core") in window.message_bar.text
    # this machine's context is read again, and both pages show it (no "Probe again")
    qtbot.waitUntil(lambda: window.hardware_page.calibration_card is not first_card, timeout=20_000)
    qtbot.waitUntil(lambda: window.plan_page.view is not first_plan, timeout=30_000)
    window.shutdown()
