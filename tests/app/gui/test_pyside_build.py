"""The installed PySide6 must not leak references to None/True (6.12.0 on Python 3.11 did:
every void call and every emit dropped one, and the process aborted after a few thousand)."""

from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

pytestmark = pytest.mark.beside


class _Emitter(QObject):
    fired = Signal()


def test_qt_calls_keep_none_and_true_alive(qtbot: QtBot) -> None:
    label = QLabel()
    qtbot.addWidget(label)
    emitter = _Emitter()
    none_before, true_before = sys.getrefcount(None), sys.getrefcount(True)
    for _ in range(1000):
        label.setText("x")
        emitter.fired.emit()
    assert abs(sys.getrefcount(None) - none_before) < 50
    assert abs(sys.getrefcount(True) - true_before) < 50
