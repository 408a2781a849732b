"""The wizard's result page when other programs were busy while measuring: it says so, offers
no Apply, and nothing is stored."""

from __future__ import annotations

from dataclasses import replace

import pytest
from PySide6.QtWidgets import QWizard
from pytestqt.qtbot import QtBot

from hearthside.app.gui.screenshot_recording import recorded_run, wizard_for_screenshots
from hearthside.app.gui.wizard import PAGE_RESULT
from hearthside.autotune.wisdom import WisdomDB

pytestmark = pytest.mark.gui

WHY = "the repetitions of 1 of 3 settings disagreed by more than 25% (up to 184%, with 2 threads)"


def test_a_busy_run_is_said_and_cannot_be_applied(qtbot: QtBot) -> None:
    recording = recorded_run()
    assert recording.result.best is not None
    busy = replace(recording, result=replace(recording.result, busy=WHY))
    wizard = wizard_for_screenshots(PAGE_RESULT, busy)
    qtbot.addWidget(wizard)
    wizard.show()
    page = wizard.result_page
    assert page.busy.isVisible()
    assert page.busy.text().startswith(
        "Other programs were busy while measuring: these figures may be off; close them and "
        "measure again. (The repetitions of 1 of 3 settings disagreed"
    )
    assert page.busy.text().endswith("Nothing from this run is stored as a default.")
    assert "Apply makes these settings" not in page.note.text()
    assert wizard.buttonText(QWizard.WizardButton.FinishButton) == "Close"
    wizard.button(QWizard.WizardButton.FinishButton).click()
    assert not wizard.isVisible() and wizard.applied_tuning is None
    with WisdomDB() as db:
        assert db.default_for(busy.result.key) is None
