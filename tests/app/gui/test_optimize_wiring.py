"""The window opens the Optimize wizard from the banner and the toolbar."""

from __future__ import annotations

import pytest
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import MainWindow
from hearthside.app.gui.wizard import OptimizeWizard
from hearthside.core.probe.runner import probe_hardware

pytestmark = pytest.mark.beside


def test_the_banner_opens_the_wizard_and_is_gone_for_good(qtbot: QtBot) -> None:
    window = MainWindow(None)
    qtbot.addWidget(window)
    window.hardware_page.profile = probe_hardware()
    window.show()

    window.banner.accepted.emit()

    assert isinstance(window.optimize_wizard, OptimizeWizard)
    qtbot.waitUntil(
        lambda: window.optimize_wizard is not None and window.optimize_wizard.isVisible()
    )
    assert window.banner.isHidden()
    window.optimize_wizard.reject()


def test_the_toolbar_action_opens_a_fresh_wizard(qtbot: QtBot) -> None:
    window = MainWindow(None)
    qtbot.addWidget(window)
    window.hardware_page.profile = probe_hardware()
    window.show()

    window.optimize_action.trigger()
    first = window.optimize_wizard
    first.reject()
    window.optimize_action.trigger()

    assert window.optimize_wizard is not first
    assert window.optimize_wizard.isVisible()
    window.optimize_wizard.reject()
    window.shutdown()
