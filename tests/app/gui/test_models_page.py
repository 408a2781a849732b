"""The Models page over a real model store: real GGUF files (the default model and tiny
synthetic ones), the real validator and child-process check, real copies into the models
folder, and Qt widgets offscreen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QTextDocument
from PySide6.QtWidgets import QMessageBox
from pytestqt.qtbot import QtBot

from hearthside.app.gui import models_page
from hearthside.app.gui.models_page import COLUMNS, DEFAULT_MARK, ModelsPage, QuantizeDialog
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.units import format_bytes
from tests.gguf_samples import write_tiny_gguf

pytestmark = [pytest.mark.gui, pytest.mark.beside]

ADD_TIMEOUT_MS = 60_000
LEFT = Qt.MouseButton.LeftButton


def tiny_models(tmp_path: Path, count: int) -> list[ModelRecord]:
    """`count` small loadable GGUFs registered in the store; the first one is the default."""
    with ModelStore(data_dir()) as store:
        records = [
            store.add(write_tiny_gguf(tmp_path / f"tiny-{seed}.gguf", seed=seed, loadable=True))
            for seed in range(count)
        ]
        store.set_default(records[0].id)
    return records


def make_page(qtbot: QtBot) -> ModelsPage:
    page = ModelsPage()
    qtbot.addWidget(page)
    page.resize(1100, 700)
    page.show()
    return page


def cell(page: ModelsPage, row: int, column: str) -> str:
    item = page.table.item(row, COLUMNS.index(column))
    return item.text() if item is not None else ""


def tooltip_text(tooltip: str) -> str:
    """A tooltip as people read it (tooltips with model text are escaped HTML)."""
    document = QTextDocument()
    document.setHtml(tooltip)
    return document.toPlainText()


def row_of(page: ModelsPage, model_id: str) -> int:
    tooltips = (page.table.item(row, 0).toolTip() for row in range(page.table.rowCount()))
    names = [tooltip_text(tooltip).splitlines()[0] for tooltip in tooltips]
    return names.index(model_id)


def answer_confirmations(
    monkeypatch: pytest.MonkeyPatch, answer: QMessageBox.StandardButton
) -> list[str]:
    asked: list[str] = []

    def question(_parent: object, _title: str, text: str, *_args: object) -> Any:
        asked.append(text)
        return answer

    monkeypatch.setattr(models_page.QMessageBox, "question", question)
    return asked


def drop(page: ModelsPage, *paths: Path) -> QDropEvent:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path)) for path in paths])
    event = QDropEvent(
        QPointF(20, 20), Qt.DropAction.CopyAction, mime, LEFT, Qt.KeyboardModifier.NoModifier
    )
    page.dropEvent(event)
    return event


def test_the_table_lists_models_with_size_quant_architecture_and_default(
    qtbot: QtBot, tmp_path: Path
) -> None:
    first, second = tiny_models(tmp_path, 2)
    page = make_page(qtbot)
    assert page.table.rowCount() == 2 and not page.empty_hint.isVisible()
    assert cell(page, 0, "Name") == "Tiny Test 0"
    assert cell(page, 0, "Quant") == first.quant == "F32"
    assert cell(page, 0, "Architecture") == "llama"
    assert cell(page, 0, "Size").endswith("KiB")
    assert cell(page, 0, "") == DEFAULT_MARK and cell(page, 1, "") == ""
    assert cell(page, 1, "Licence") == "—"
    assert page.selected_id() == first.id  # the default is selected to start with
    assert not page.default_button.isEnabled()  # it already is the default
    assert second.id in page.table.item(1, 0).toolTip()


def test_an_empty_store_says_how_to_add_a_model(qtbot: QtBot) -> None:
    page = make_page(qtbot)
    assert page.table.rowCount() == 0 and page.empty_hint.isVisible()
    assert not page.chat_button.isEnabled() and not page.remove_button.isEnabled()


def test_adding_the_real_default_model_copies_it_with_progress(
    qtbot: QtBot, default_model_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = make_page(qtbot)
    progress: list[int] = []
    page.progress_bar.valueChanged.connect(progress.append)
    monkeypatch.setattr(
        models_page.QFileDialog,
        "getOpenFileNames",
        lambda *_args, **_kwargs: ([str(default_model_file)], models_page.GGUF_FILTER),
    )
    with qtbot.wait_signal(page.models_changed, timeout=ADD_TIMEOUT_MS):
        qtbot.mouseClick(page.add_button, LEFT)
        assert page.busy and page.progress_row.isVisible()
        assert not page.add_button.isEnabled()
    assert not page.progress_row.isVisible() and page.add_button.isEnabled()
    assert progress[-1] == 100 and len(set(progress)) > 2
    size = format_bytes(default_model_file.stat().st_size)
    assert size.endswith(" MiB")  # 253 × 10^6 bytes: one unit on every page
    assert (
        page.message == f"Added Gemma 3 270m ({size}). Make it the default with “Set as default”."
    )
    assert page.table.rowCount() == 1
    assert cell(page, 0, "Quant") == "Q4_K_M" and cell(page, 0, "Architecture") == "gemma3"
    assert cell(page, 0, "Parameters") == "268 M"
    copied = models_dir(data_dir()) / "gemma-3-270m-q4_k_m.gguf"
    assert copied.stat().st_size == default_model_file.stat().st_size
    assert page.selected_id() == "gemma-3-270m-q4_k_m"


def test_cancelling_a_copy_keeps_nothing(qtbot: QtBot, default_model_file: Path) -> None:
    page = make_page(qtbot)
    page.add_files([default_model_file])
    # Cancel as soon as the copy reports its first block (the check before it is not stoppable).
    qtbot.waitUntil(lambda: page.progress_bar.maximum() == 100, timeout=ADD_TIMEOUT_MS)
    qtbot.mouseClick(page.cancel_button, LEFT)
    qtbot.waitUntil(lambda: not page.busy, timeout=ADD_TIMEOUT_MS)
    assert page.message == "Stopped adding gemma-3-270m-q4_k_m.gguf; nothing was kept."
    assert page.table.rowCount() == 0
    assert list(models_dir(data_dir()).iterdir()) == []  # no .part left behind


def test_a_file_that_is_not_a_model_is_refused_in_plain_words(qtbot: QtBot, tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("Remember to buy milk.\n" * 10)
    page = make_page(qtbot)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(notes))])
    enter = QDragEnterEvent(
        QPoint(20, 20), Qt.DropAction.CopyAction, mime, LEFT, Qt.KeyboardModifier.NoModifier
    )
    page.dragEnterEvent(enter)
    assert enter.isAccepted()
    assert drop(page, notes).isAccepted()
    qtbot.waitUntil(lambda: not page.busy, timeout=ADD_TIMEOUT_MS)
    assert page.message.startswith(
        "Could not add notes.txt. This is not a valid GGUF model file: it does not start with "
        'the signature "GGUF".'
    )
    assert "Traceback" not in page.message
    assert page.message_bar.property("kind") == "error"
    assert page.table.rowCount() == 0


def test_dropping_several_files_adds_them_one_after_another(qtbot: QtBot, tmp_path: Path) -> None:
    files = [
        write_tiny_gguf(tmp_path / f"drop-{seed}.gguf", seed=seed, loadable=True) for seed in (7, 8)
    ]
    page = make_page(qtbot)
    drop(page, *files)
    qtbot.waitUntil(lambda: page.table.rowCount() == 2, timeout=ADD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: not page.busy, timeout=ADD_TIMEOUT_MS)
    assert {cell(page, row, "Name") for row in range(2)} == {"Tiny Test 7", "Tiny Test 8"}


def test_remove_asks_first_and_deletes_only_on_yes(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tiny_models(tmp_path, 2)
    page = make_page(qtbot)
    page.select(second.id)
    asked = answer_confirmations(monkeypatch, QMessageBox.StandardButton.No)
    qtbot.mouseClick(page.remove_button, LEFT)
    assert "Remove Tiny Test 1?" in asked[0] and "will be deleted" in asked[0]
    assert page.table.rowCount() == 2 and second.path.exists()

    answer_confirmations(monkeypatch, QMessageBox.StandardButton.Yes)
    with qtbot.wait_signal(page.models_changed):
        qtbot.mouseClick(page.remove_button, LEFT)
    assert page.table.rowCount() == 1 and cell(page, 0, "Name") == "Tiny Test 0"
    assert not second.path.exists() and first.path.exists()
    assert page.message == "Removed Tiny Test 1."


def test_set_as_default_moves_the_mark(qtbot: QtBot, tmp_path: Path) -> None:
    first, second = tiny_models(tmp_path, 2)
    page = make_page(qtbot)
    page.select(second.id)
    with qtbot.wait_signal(page.models_changed):
        qtbot.mouseClick(page.default_button, LEFT)
    assert cell(page, row_of(page, second.id), "") == DEFAULT_MARK
    assert cell(page, row_of(page, first.id), "") == ""
    with ModelStore(data_dir()) as store:
        default = store.default()
    assert default is not None and default.id == second.id
    assert page.selected_id() == second.id and not page.default_button.isEnabled()


def test_chat_with_this_model_asks_the_window_to_load_it(qtbot: QtBot, tmp_path: Path) -> None:
    _first, second = tiny_models(tmp_path, 2)
    page = make_page(qtbot)
    page.select(second.id)
    with qtbot.wait_signal(page.load_requested) as requested:
        qtbot.mouseClick(page.chat_button, LEFT)
    assert requested.args == [second.id]
    with qtbot.wait_signal(page.load_requested) as double_clicked:
        page.table.cellDoubleClicked.emit(row_of(page, second.id), 0)
    assert double_clicked.args == [second.id]


@pytest.fixture()
def linked_default_model(default_model_file: Path) -> ModelRecord:
    with ModelStore(data_dir()) as store:
        return store.add(default_model_file, link=True)


def test_the_variant_dialog_shows_the_plan_and_refuses_the_same_type(
    qtbot: QtBot, linked_default_model: ModelRecord
) -> None:
    with ModelStore(data_dir()) as store:
        dialog = QuantizeDialog(store, linked_default_model)
        qtbot.addWidget(dialog)
        assert dialog.target() == "Q8_0"  # a Q4_K_M source: the 8-bit choice comes first
        assert "Makes “Gemma 3 270m (Q8_0)”, about" in dialog.plan_label.text()
        assert "cannot bring back the precision" in dialog.plan_label.text()
        assert dialog.ok_button.isEnabled()
        dialog.type_box.setCurrentText("Q4_K_M")
        assert "is already Q4_K_M" in dialog.plan_label.text()
        assert not dialog.ok_button.isEnabled()
        dialog.type_box.setCurrentText("Q4_0")
        assert "precision" not in dialog.plan_label.text() and dialog.ok_button.isEnabled()


def test_making_a_q4_0_variant_adds_a_smaller_model(
    qtbot: QtBot, linked_default_model: ModelRecord
) -> None:
    page = make_page(qtbot)
    progress: list[int] = []
    page.progress_bar.valueChanged.connect(progress.append)
    with qtbot.wait_signal(page.models_changed, timeout=ADD_TIMEOUT_MS):
        page.make_variant(linked_default_model.id, "Q4_0")
        assert page.busy and not page.variant_button.isEnabled()
    assert page.message.startswith("Made Gemma 3 270m (Q4_0): ")
    assert page.message.endswith(" MiB.")
    assert progress[-1] == 100 and "Quantizing" not in page.message
    variant = page.selected_id()
    assert variant == "gemma-3-270m-q4_0"
    row = row_of(page, variant)
    assert cell(page, row, "Quant") == "Q4_0" and cell(page, row, "Architecture") == "gemma3"
    assert page.table.rowCount() == 2
