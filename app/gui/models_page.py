"""The Models page: the registered models, adding GGUF files (picker or drag-and-drop), removing,
choosing the default, and asking the window to chat with one.

Adding validates the file, loads it once in a child process and copies it into the models
folder (the model store does all three) on a worker thread, with a progress bar and a Cancel
button; a problem is shown in plain words in a message bar above the table. "Download from the
hub…" opens `HubDialog` (hub_dialog.py); a model it downloads appears here, selected.

"Connect to a server…" opens `RemoteDialog` (remote_dialog.py): an OpenAI-compatible server
saved there is listed under "Remote servers", where the user can chat with it or remove it.
The remote list, the hub dialog and quantizing are imported when first used (the remote
modules pull in the HTTP client and the engine), so building the page stays quick.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.labels import plain_tooltip
from hearthside.app.gui.message_bar import MessageBar
from hearthside.app.gui.workers import BackgroundTask, MainThreadRelay, run_in_background
from hearthside.core.errors import HearthsideError, describe_error
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.units import format_bytes

if TYPE_CHECKING:
    from hearthside.app.gui.hub_dialog import HubDialog
    from hearthside.app.gui.remote_dialog import RemoteDialog
    from hearthside.core.engine.remotes import Remote
    from hearthside.core.probe.profile import HardwareProfile

COLUMNS = ("Name", "Size", "Quant", "Parameters", "Architecture", "Licence", "")
DEFAULT_MARK = "★ Default"
GGUF_FILTER = "GGUF models (*.gguf);;All files (*)"
# llama.cpp's quantization names as they appear in file names: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16.
QUANT_IN_NAME = re.compile(r"(?<![A-Za-z0-9])(I?Q\d_[A-Z0-9_]*[A-Z0-9]|I?Q\d|BF16|F16|F32)", re.I)
PERCENT = 100
REMOTE_NAME_ROLE = Qt.ItemDataRole.UserRole
NO_REMOTES = "No servers yet. “Connect to a server…” adds one (vLLM, llama-server, Ollama …)."

STYLE = """
QLabel#pageTitle { font-size: 16pt; font-weight: 600; }
QLabel#muted { color: gray; }
QFrame#messageBar[kind="error"] { background: #fdecea; border: 1px solid #f5c6cb;
                                   border-radius: 6px; }
QFrame#messageBar[kind="error"] QLabel { color: #611a15; }
QFrame#messageBar[kind="info"] { background: #e8f4fd; border: 1px solid #b6dcfe;
                                  border-radius: 6px; }
QFrame#messageBar[kind="info"] QLabel { color: #0d3c61; }
QPushButton#primary { font-weight: 600; }
QTableWidget::item { padding: 0 8px; }
QHeaderView::section { padding: 6px 8px; border: none;
                       border-bottom: 1px solid palette(midlight); background: palette(base); }
QFrame#card { background: palette(base); border: 1px solid palette(midlight);
              border-radius: 8px; }
QLabel#cardTitle { font-weight: 600; }
"""


class AddCancelled(HearthsideError):
    """The user cancelled adding a model; nothing was kept."""


# ---- what the table shows --------------------------------------------------------------------


def quant_label(record: ModelRecord) -> str:
    if record.quant:
        return record.quant
    match = QUANT_IN_NAME.search(record.path.name)
    return match.group(1).upper() if match else "?"


def parameters_label(count: int | None) -> str:
    if not count:
        return "?"
    if count >= 10**9:
        return f"{count / 10**9:.1f} B"
    return f"{count / 10**6:.0f} M"


def row_texts(record: ModelRecord) -> tuple[str, ...]:
    name = record.name + (" (linked)" if record.linked else "")
    return (
        name,
        format_bytes(record.size_bytes),
        quant_label(record),
        parameters_label(record.parameter_count),
        record.architecture or "?",
        record.licence or "—",
        DEFAULT_MARK if record.is_default else "",
    )


def detail_rows(record: ModelRecord) -> list[tuple[str, str]]:
    where = "linked: Hearthside never deletes it" if record.linked else "kept in the models folder"
    origin = {"default": "installed with Hearthside", "file": "added from a file"}
    added = record.added_at.replace("T", " ")
    return [
        ("File", f"{record.path}  ({where})"),
        ("Added", f"{added}, {origin.get(record.source, record.source)}"),
        ("SHA-256", record.sha256),
        ("Licence", record.licence or "No licence note is known; check where the file came from."),
    ]


def remote_row_text(remote: Remote) -> str:
    model = remote.model or "the first model it lists"
    key = ", key saved" if remote.has_key else ""
    return f"{remote.name} — {model} at {remote.base_url}  (remote{key})"


# ---- adding (worker thread) ------------------------------------------------------------------


def add_model_file(
    home: Path,
    path: Path,
    report: Callable[[tuple[int, int]], None],
    cancel: threading.Event,
) -> ModelRecord:
    """Validate, check and copy `path` into the store at `home`. Runs on a worker thread, so it
    opens its own store (one SQLite connection per thread)."""

    def progress(done_bytes: int, total_bytes: int) -> None:
        if cancel.is_set():  # the store deletes its .part file when the copy raises
            raise AddCancelled("Adding the model was cancelled.")
        report((done_bytes, total_bytes))

    with ModelStore(home) as store:
        return store.add(path, progress=progress)


def make_variant_file(
    home: Path,
    model_id: str,
    target: str,
    report: Callable[[tuple[int, int]], None],
    cancel: threading.Event,
) -> ModelRecord:
    """Quantize `model_id` to `target` (worker thread); cancelling kills llama.cpp's child."""

    def progress(done: int, total: int) -> None:
        report((done, total))

    def ignore(_warning: str) -> None:  # the dialog has shown the warnings already
        return None

    from hearthside.core.models.quantize import quantize_model

    with ModelStore(home) as store:
        return quantize_model(
            store, model_id, target, progress=progress, cancel=cancel, on_warning=ignore
        )


def local_files(urls: Iterable[Any]) -> list[Path]:
    return [Path(url.toLocalFile()) for url in urls if url.isLocalFile()]


# ---- the page --------------------------------------------------------------------------------


class ModelsPage(QWidget):
    load_requested = Signal(str)  # model id the user wants to chat with
    remote_load_requested = Signal(str)  # name of the saved remote server to chat with
    models_changed = Signal()  # added, removed or a new default

    def __init__(self, home: Path | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.home = Path(home) if home is not None else data_dir()
        self._store = ModelStore(self.home)
        self.destroyed.connect(self._store.close)
        self._records: list[ModelRecord] = []
        self._pending: list[Path] = []
        self._job: BackgroundTask[ModelRecord] | None = None
        self._cancel = threading.Event()
        self._progress_text: Callable[[int, int], str] = copy_progress_text
        self._progress_relay = MainThreadRelay(self._show_progress, self)
        self._hub_dialog: HubDialog | None = None
        self._remote_dialog: RemoteDialog | None = None
        self._remotes: list[Remote] = []
        self._remotes_read = False
        self._hardware: HardwareProfile | None = None
        self.setAcceptDrops(True)
        self.setStyleSheet(STYLE)
        self._build()
        self.reload()

    # -- public --

    def reload(self) -> None:
        """Read the registry again and redraw the table, keeping the selection."""
        chosen = self.selected_id()
        try:
            self._records = self._store.list()
        except HearthsideError as exc:
            self.show_message(describe_error(exc), error=True)
            self._records = []
        self._fill_table()
        self.select(chosen or self._default_id())
        self._update_buttons()  # the same row may stay selected with new contents

    def selected_id(self) -> str | None:
        rows = self.table.selectionModel().selectedRows()
        return self._records[rows[0].row()].id if rows else None

    def select(self, model_id: str | None) -> None:
        for row, record in enumerate(self._records):
            if record.id == model_id:
                self.table.selectRow(row)
                return
        self.table.clearSelection()
        self._update_buttons()

    def add_files(self, paths: Sequence[Path]) -> None:
        """Add these files one after another (each validated, checked and copied)."""
        self._pending.extend(paths)
        self._start_next_add()

    def cancel_job(self) -> None:
        """Stop adding (and forget the files waiting to be added) or stop making a variant."""
        self._pending.clear()
        self._cancel.set()

    @property
    def busy(self) -> bool:
        """True while a file is being added or a variant made."""
        return self._job is not None

    def show_message(self, text: str, *, error: bool = False) -> None:
        self.message_bar.show_text(text, error=error)

    @property
    def message(self) -> str:
        return self.message_bar.text

    def set_hardware_profile(self, profile: HardwareProfile) -> None:
        """The machine the hub dialog's fit badges are for (else it probes once itself)."""
        self._hardware = profile
        if self._hub_dialog is not None:
            self._hub_dialog.set_hardware(profile)

    def open_hub_dialog(self) -> HubDialog:
        """Show the hub dialog (one per page: it keeps its search while hidden)."""
        from hearthside.app.gui.hub_dialog import HubDialog

        if self._hub_dialog is None:
            self._hub_dialog = HubDialog(self.home, self, profile=self._hardware)
            self._hub_dialog.downloaded.connect(self._downloaded)
            self._hub_dialog.show_model.connect(self.select)
        self._hub_dialog.show()
        self._hub_dialog.raise_()
        self._hub_dialog.activateWindow()
        return self._hub_dialog

    def _downloaded(self, record: ModelRecord) -> None:
        self.show_message(f"Downloaded {record.name} ({format_bytes(record.size_bytes)}).")
        self._show_new_model(record)

    # -- remote servers --

    def open_remote_dialog(self) -> RemoteDialog:
        """Show "Connect to a server"; a server saved there is listed here, selected."""
        from hearthside.app.gui.remote_dialog import RemoteDialog
        from hearthside.core.engine.remotes import RemoteRegistry

        dialog = RemoteDialog(RemoteRegistry(self.home), self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self._remote_saved(dialog.saved))
        dialog.finished.connect(self._forget_remote_dialog)
        self._remote_dialog = dialog
        dialog.open()
        return dialog

    def _forget_remote_dialog(self) -> None:
        self._remote_dialog = None

    def reload_remotes(self) -> None:
        """Read the saved remote servers again and redraw their list, keeping the selection."""
        from hearthside.core.engine.remotes import RemoteRegistry

        chosen = self.selected_remote()
        self._remotes_read = True
        try:
            self._remotes = RemoteRegistry(self.home).all()
        except HearthsideError as exc:
            self.show_message(describe_error(exc), error=True)
            self._remotes = []
        self.remote_list.clear()
        for remote in self._remotes:
            item = QListWidgetItem(remote_row_text(remote))
            item.setData(REMOTE_NAME_ROLE, remote.name)
            item.setToolTip(f"remote:{remote.name}")
            self.remote_list.addItem(item)
        self.remote_list.setVisible(bool(self._remotes))
        self.remotes_empty.setVisible(not self._remotes)
        self.select_remote(chosen)

    @property
    def remote_names(self) -> list[str]:
        return [remote.name for remote in self._remotes]

    def selected_remote(self) -> str | None:
        item = self.remote_list.currentItem()
        selected = item is not None and item.isSelected()
        return str(item.data(REMOTE_NAME_ROLE)) if selected else None

    def select_remote(self, name: str | None) -> None:
        for row in range(self.remote_list.count()):
            item = self.remote_list.item(row)
            if item.data(REMOTE_NAME_ROLE) == name:
                self.remote_list.setCurrentItem(item)
                item.setSelected(True)
                return
        self.remote_list.clearSelection()
        self._update_remote_buttons()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        # Read on first show, not at build: the remote modules import the HTTP client.
        if not self._remotes_read:
            self.reload_remotes()
        super().showEvent(event)

    def _remote_saved(self, remote: Remote | None) -> None:
        if remote is None:
            return
        self.reload_remotes()
        self.select_remote(remote.name)
        self.show_message(f"Saved the server {remote.name}. Choose “Chat with it” to use it.")

    def _chat_with_remote(self) -> None:
        name = self.selected_remote()
        if name is not None:
            self.remote_load_requested.emit(name)

    def _remove_remote(self) -> None:
        from hearthside.core.engine.remotes import RemoteRegistry

        name = self.selected_remote()
        if name is None:
            return
        answer = QMessageBox.question(
            self, "Remove server", f"Forget the server {name}? Its saved key is deleted too."
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            RemoteRegistry(self.home).remove(name)
        except HearthsideError as exc:
            self.show_message(describe_error(exc), error=True)
        else:
            self.show_message(f"Removed the server {name}.")
        self.reload_remotes()

    def _update_remote_buttons(self) -> None:
        chosen = self.selected_remote() is not None
        self.remote_chat_button.setEnabled(chosen)
        self.remote_remove_button.setEnabled(chosen)

    # -- building --

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 16)
        layout.setSpacing(12)
        layout.addLayout(self._build_header())
        layout.addWidget(self._build_message_bar())
        layout.addWidget(self._build_progress_row())
        layout.addWidget(self._build_table(), 1)
        self.empty_hint = QLabel(
            "No models yet. Download one from the hub, add a GGUF file, or drop one on this page."
        )
        self.empty_hint.setObjectName("muted")
        self.empty_hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        layout.addWidget(self.empty_hint)
        layout.addWidget(self._build_details())
        layout.addLayout(self._build_actions())
        layout.addWidget(self._build_remotes())

    def _build_header(self) -> QHBoxLayout:
        header = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(2)
        title = QLabel("Models")
        title.setObjectName("pageTitle")
        subtitle = QLabel("GGUF model files Hearthside can run. Drop .gguf files here to add them.")
        subtitle.setObjectName("muted")
        titles.addWidget(title)
        titles.addWidget(subtitle)
        header.addLayout(titles, 1)
        self.hub_button = QPushButton("Download from the hub…")
        self.hub_button.clicked.connect(self.open_hub_dialog)
        self.add_button = QPushButton("Add file…")
        self.add_button.clicked.connect(self._choose_files)
        header.addWidget(self.hub_button, 0, Qt.AlignmentFlag.AlignVCenter)
        header.addWidget(self.add_button, 0, Qt.AlignmentFlag.AlignVCenter)
        return header

    def _build_message_bar(self) -> MessageBar:
        self.message_bar = MessageBar(self)
        return self.message_bar

    def _build_progress_row(self) -> QWidget:
        self.progress_row = QWidget()
        row = QHBoxLayout(self.progress_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.progress_label = QLabel()
        self.progress_label.setTextFormat(Qt.TextFormat.PlainText)
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, PERCENT)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_job)
        row.addWidget(self.progress_label)
        row.addWidget(self.progress_bar, 1)
        row.addWidget(self.cancel_button)
        self.progress_row.hide()
        return self.progress_row

    def _build_table(self) -> QTableWidget:
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.verticalHeader().hide()
        self.table.verticalHeader().setDefaultSectionSize(32)
        header = self.table.horizontalHeader()
        header.setHighlightSections(False)
        header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
        for column in range(len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(COLUMNS.index("Licence"), QHeaderView.ResizeMode.Stretch)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.cellDoubleClicked.connect(lambda _row, _col: self._chat())
        return self.table

    def _build_details(self) -> QFrame:
        self.details = QFrame()
        self.details.setObjectName("card")
        layout = QVBoxLayout(self.details)
        layout.setContentsMargins(16, 12, 16, 14)
        self.details_title = QLabel()
        self.details_title.setObjectName("cardTitle")
        self.details_title.setTextFormat(Qt.TextFormat.PlainText)  # names come from model files
        layout.addWidget(self.details_title)
        self.details_form = QFormLayout()
        self.details_form.setHorizontalSpacing(16)
        self.details_form.setVerticalSpacing(6)
        layout.addLayout(self.details_form)
        return self.details

    def _show_details(self, record: ModelRecord | None) -> None:
        self.details.setVisible(record is not None)
        while self.details_form.rowCount():
            self.details_form.removeRow(0)
        if record is None:
            return
        self.details_title.setText(f"{record.name} — {record.id}")
        for name, value in detail_rows(record):
            label = QLabel(name)
            label.setObjectName("muted")
            text = QLabel(value)
            text.setTextFormat(Qt.TextFormat.PlainText)
            text.setWordWrap(True)
            text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.details_form.addRow(label, text)

    def _build_actions(self) -> QHBoxLayout:
        actions = QHBoxLayout()
        self.chat_button = QPushButton("Chat with this model")
        self.chat_button.setObjectName("primary")
        self.chat_button.clicked.connect(self._chat)
        self.default_button = QPushButton("Set as default")
        self.default_button.clicked.connect(self._set_default)
        self.variant_button = QPushButton("Make a quantized variant…")
        self.variant_button.clicked.connect(self._choose_variant)
        self.remove_button = QPushButton("Remove…")
        self.remove_button.clicked.connect(self._remove)
        actions.addWidget(self.chat_button)
        actions.addWidget(self.default_button)
        actions.addWidget(self.variant_button)
        actions.addStretch(1)
        actions.addWidget(self.remove_button)
        return actions

    def _build_remotes(self) -> QFrame:
        self.remotes_card = QFrame()
        self.remotes_card.setObjectName("card")
        layout = QVBoxLayout(self.remotes_card)
        layout.setContentsMargins(16, 12, 16, 14)
        title = QLabel("Remote servers")
        title.setObjectName("cardTitle")
        layout.addWidget(title)
        self.remotes_empty = QLabel(NO_REMOTES)
        self.remotes_empty.setObjectName("muted")
        layout.addWidget(self.remotes_empty)
        self.remote_list = QListWidget()
        self.remote_list.setMaximumHeight(110)
        self.remote_list.itemSelectionChanged.connect(self._update_remote_buttons)
        self.remote_list.itemDoubleClicked.connect(lambda _item: self._chat_with_remote())
        self.remote_list.hide()
        layout.addWidget(self.remote_list)
        buttons = QHBoxLayout()
        self.connect_button = QPushButton("Connect to a server…")
        self.connect_button.setToolTip(
            "Chat with a model on an OpenAI-compatible server (vLLM, llama-server, Ollama …)"
        )
        self.connect_button.clicked.connect(self.open_remote_dialog)
        buttons.addWidget(self.connect_button)
        self.remote_chat_button = QPushButton("Chat with it")
        self.remote_chat_button.clicked.connect(self._chat_with_remote)
        self.remote_remove_button = QPushButton("Remove")
        self.remote_remove_button.clicked.connect(self._remove_remote)
        buttons.addWidget(self.remote_chat_button)
        buttons.addStretch(1)
        buttons.addWidget(self.remote_remove_button)
        layout.addLayout(buttons)
        self._update_remote_buttons()
        return self.remotes_card

    def _fill_table(self) -> None:
        self.table.setRowCount(len(self._records))
        for row, record in enumerate(self._records):
            for column, text in enumerate(row_texts(record)):
                item = QTableWidgetItem(text)
                item.setToolTip(plain_tooltip(self._tooltip(record, column, text)))
                self.table.setItem(row, column, item)
        self.table.setVisible(bool(self._records))
        self.empty_hint.setVisible(not self._records)

    def _tooltip(self, record: ModelRecord, column: int, text: str) -> str:
        if COLUMNS[column] == "Name":
            return f"{record.id}\n{record.path}"
        return text

    def _update_buttons(self) -> None:
        chosen = self._selected_record()
        for button in (self.chat_button, self.remove_button):
            button.setEnabled(chosen is not None)
        self.variant_button.setEnabled(chosen is not None and self._job is None)
        self.default_button.setEnabled(chosen is not None and not chosen.is_default)
        self._show_details(chosen)

    def _selected_record(self) -> ModelRecord | None:
        chosen = self.selected_id()
        return next((r for r in self._records if r.id == chosen), None)

    def _default_id(self) -> str | None:
        return next((r.id for r in self._records if r.is_default), None)

    # -- actions --

    def _chat(self) -> None:
        chosen = self.selected_id()
        if chosen is not None:
            self.load_requested.emit(chosen)

    def _set_default(self) -> None:
        chosen = self.selected_id()
        if chosen is None:
            return
        try:
            record = self._store.set_default(chosen)
        except HearthsideError as exc:
            self.show_message(describe_error(exc), error=True)
            return
        self.show_message(f"{record.name} is now the default model.")
        self.reload()
        self.models_changed.emit()

    def _remove(self) -> None:
        record = self._selected_record()
        if record is None or not self._confirm_remove(record):
            return
        try:
            self._store.remove(record.id)
        except HearthsideError as exc:
            self.show_message(describe_error(exc), error=True)
        else:
            self.show_message(f"Removed {record.name}.")
        self.reload()
        self.models_changed.emit()

    def _confirm_remove(self, record: ModelRecord) -> bool:
        if self._store.owns_file(record):
            fate = f"Its file ({format_bytes(record.size_bytes)}) will be deleted."
        else:
            fate = f"Its file stays where it is:\n{record.path}"
        answer = QMessageBox.question(self, "Remove model", f"Remove {record.name}?\n\n{fate}")
        return answer == QMessageBox.StandardButton.Yes

    def _choose_files(self) -> None:
        names, _filter = QFileDialog.getOpenFileNames(
            self, "Add a model file", str(Path.home()), GGUF_FILTER
        )
        self.add_files([Path(name) for name in names])

    # -- drag and drop --

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 (Qt's name)
        if local_files(event.mimeData().urls()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 (Qt's name)
        files = local_files(event.mimeData().urls())
        if not files:
            event.ignore()
            return
        event.acceptProposedAction()
        self.add_files(files)

    # -- background jobs: adding files (one at a time) and making variants --

    def _start_job(self, job: _Job) -> None:
        self._cancel = threading.Event()
        cancel, report = self._cancel, self._progress_relay.post
        self._progress_text = job.progress_text
        self.progress_label.setText(job.busy_text)
        self.progress_bar.setRange(0, 0)  # busy until the work reports its first step
        self.cancel_button.setEnabled(True)
        self.progress_row.show()
        for button in (self.add_button, self.variant_button):
            button.setEnabled(False)
        self._job = run_in_background(lambda: job.work(report, cancel), job.on_done, job.on_failed)

    def _show_progress(self, value: tuple[int, int]) -> None:
        done, total = value
        if self._job is None or total <= 0:
            return
        self.progress_bar.setRange(0, PERCENT)
        self.progress_bar.setValue(done * PERCENT // total)
        self.progress_label.setText(self._progress_text(done, total))

    def _job_finished(self) -> None:
        self._job = None
        self.progress_row.hide()
        self.add_button.setEnabled(True)
        self._update_buttons()

    def _start_next_add(self) -> None:
        if self._job is not None or not self._pending:
            return
        path = self._pending.pop(0)
        home = self.home
        self._start_job(
            _Job(
                busy_text=f"Checking {path.name}…",
                work=lambda report, cancel: add_model_file(home, path, report, cancel),
                on_done=self._added,
                on_failed=lambda error: self._add_failed(path, error),
                progress_text=copy_progress_text,
            )
        )

    def _added(self, record: ModelRecord) -> None:
        self._job_finished()
        hint = "" if self._default_id() else " Make it the default with “Set as default”."
        self.show_message(f"Added {record.name} ({format_bytes(record.size_bytes)}).{hint}")
        self._show_new_model(record)
        self._start_next_add()

    def _add_failed(self, path: Path, error: BaseException) -> None:
        self._job_finished()
        if isinstance(error, AddCancelled):
            self.show_message(f"Stopped adding {path.name}; nothing was kept.")
        else:
            self.show_message(f"Could not add {path.name}. {describe_error(error)}", error=True)
        self._start_next_add()

    def _show_new_model(self, record: ModelRecord) -> None:
        self.reload()
        self.select(record.id)
        self.models_changed.emit()

    # -- quantized variants --

    def make_variant(self, model_id: str, target: str) -> None:
        """Quantize `model_id` to `target` (e.g. "Q4_0") in the background, as a new model."""
        if self._job is not None:
            self.show_message("Wait until the current model job has finished.", error=True)
            return
        home = self.home
        self._start_job(
            _Job(
                busy_text=f"Preparing a {target} variant of {model_id}…",
                work=lambda report, cancel: make_variant_file(
                    home, model_id, target, report, cancel
                ),
                on_done=self._variant_made,
                on_failed=lambda error: self._variant_failed(target, error),
                progress_text=lambda done, total: f"Quantizing: {done} of {total} tensors",
            )
        )

    def _choose_variant(self) -> None:
        record = self._selected_record()
        if record is None:
            return
        dialog = QuantizeDialog(self._store, record, self)
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.make_variant(record.id, dialog.target())

    def _variant_made(self, record: ModelRecord) -> None:
        self._job_finished()
        self.show_message(f"Made {record.name}: {format_bytes(record.size_bytes)}.")
        self._show_new_model(record)

    def _variant_failed(self, target: str, error: BaseException) -> None:
        from hearthside.core.models.quantize import QuantizeCancelled

        self._job_finished()
        if isinstance(error, QuantizeCancelled):
            self.show_message(f"Stopped making the {target} variant; nothing was kept.")
        else:
            self.show_message(
                f"Could not make the {target} variant. {describe_error(error)}", error=True
            )


@dataclass(frozen=True)
class _Job:
    busy_text: str
    work: Callable[[Callable[[tuple[int, int]], None], threading.Event], ModelRecord]
    on_done: Callable[[ModelRecord], None]
    on_failed: Callable[[BaseException], None]
    progress_text: Callable[[int, int], str]


def copy_progress_text(done_bytes: int, total_bytes: int) -> str:
    return f"Copying {format_bytes(done_bytes)} of {format_bytes(total_bytes)}"


# ---- the "Make a quantized variant" dialog ---------------------------------------------------


class QuantizeDialog(QDialog):
    """Pick a quantization type; shows the planned result (name, size, warnings) before OK."""

    def __init__(self, store: ModelStore, record: ModelRecord, parent: QWidget | None = None):
        super().__init__(parent)
        self._store = store
        self._record = record
        self.setWindowTitle("Make a quantized variant")
        layout = QVBoxLayout(self)
        layout.setSpacing(10)
        intro = QLabel(
            f"Make a copy of {record.name} ({record.quant or 'unknown type'}) with another "
            "quantization: fewer bits make a smaller, faster model that answers a little worse."
        )
        intro.setWordWrap(True)
        layout.addWidget(intro)
        form = QFormLayout()
        from hearthside.core.models.quantize import QUANT_TYPES

        self.type_box = QComboBox()
        self.type_box.addItems(list(QUANT_TYPES))
        form.addRow("Quantization", self.type_box)
        layout.addLayout(form)
        self.plan_label = QLabel()
        self.plan_label.setTextFormat(Qt.TextFormat.PlainText)
        self.plan_label.setWordWrap(True)
        layout.addWidget(self.plan_label)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.ok_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.ok_button.setText("Make variant")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        self.type_box.currentTextChanged.connect(self._show_plan)
        self.type_box.setCurrentText(suggested_target(record.quant))
        self._show_plan(self.type_box.currentText())
        self.resize(480, self.sizeHint().height())

    def target(self) -> str:
        return self.type_box.currentText()

    def _show_plan(self, target: str) -> None:
        from hearthside.core.models.quantize import plan_quantize

        try:
            plan = plan_quantize(self._store, self._record.id, target)
        except HearthsideError as exc:
            self.plan_label.setText(exc.user_text())
            self.ok_button.setEnabled(False)
            return
        text = f"Makes “{plan.name}”, about {format_bytes(plan.estimated_bytes)}."
        self.plan_label.setText("\n\n".join([text, *plan.warnings]))
        self.ok_button.setEnabled(True)


def suggested_target(source_quant: str | None) -> str:
    """A sensible first choice: the common 4-bit mix, or 8-bit for a source that already is."""
    return "Q8_0" if (source_quant or "").upper() == "Q4_K_M" else "Q4_K_M"
