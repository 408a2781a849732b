"""Model names come from model files: the window shows them as text, never as rich text.

Qt labels render anything that looks like HTML as rich text by default, so a GGUF named
`<b>x</b><img src=…>` would show bold text and try to load an image.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel
from pytestqt.qtbot import QtBot

from hearthside.app.gui.models_page import ModelsPage
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.app.gui.window_helpers import open_window
from tests.gguf_samples import write_tiny_gguf

pytestmark = [pytest.mark.gui, pytest.mark.beside]

MARKUP_NAME = "<b>x</b><img src='file:///etc/passwd'>"


def shows_the_markup_as_text(label: QLabel) -> bool:
    """True when `label` lays out the markup's characters, not a bold x and an image."""
    label.adjustSize()
    raw_width = label.fontMetrics().horizontalAdvance(label.text())
    return label.textFormat() == Qt.TextFormat.PlainText and label.width() >= raw_width * 0.9


def add_markup_model(tmp_path: Path) -> str:
    model = write_tiny_gguf(tmp_path / "markup.gguf", seed=5, loadable=True, name=MARKUP_NAME)
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()
        record = store.add(model)
        store.set_default(record.id)
    return record.id


def test_the_models_page_shows_a_markup_name_as_text(
    qtbot: QtBot, tmp_path: Path, hearthside_home: Path
) -> None:
    add_markup_model(tmp_path)
    page = ModelsPage()
    qtbot.addWidget(page)
    page.resize(1100, 700)
    page.show()
    assert MARKUP_NAME in page.details_title.text()
    assert shows_the_markup_as_text(page.details_title)


def test_the_status_bar_shows_the_loaded_models_markup_name_as_text(
    tmp_path: Path, hearthside_home: Path
) -> None:
    model_id = add_markup_model(tmp_path)
    with open_window(hearthside_home, model_id) as window:
        assert window.model_label.text() == MARKUP_NAME
        assert shows_the_markup_as_text(window.model_label)


def test_tooltips_show_model_text_as_written() -> None:
    from PySide6.QtGui import QTextDocument

    from hearthside.app.gui.labels import plain_tooltip

    document = QTextDocument()
    document.setHtml(plain_tooltip(f"{MARKUP_NAME}\n/models/a.gguf"))
    assert document.toPlainText() == f"{MARKUP_NAME}\n/models/a.gguf"
