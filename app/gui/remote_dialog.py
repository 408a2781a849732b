""" "Connect to a server": save an OpenAI-compatible server (vLLM, llama-server, Ollama …) as a
remote the chat can use, after testing that it answers and listing its models.

The key is typed into a password field, sent only to that server while testing, and saved in
its own private file by `RemoteRegistry` (never into settings or logs). The test runs off the
UI thread; the dialog shows the server's answer in plain words.
"""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.workers import BackgroundTask, run_in_background
from hearthside.core.engine.remote import RemoteConfig, RemoteModel, fetch_models
from hearthside.core.engine.remotes import Remote, RemoteRegistry
from hearthside.core.errors import HearthsideError, describe_error

FIRST_LISTED = "(the first model the server lists)"


class RemoteDialog(QDialog):
    """Name, address, key → Test connection (lists the models) → Save."""

    def __init__(self, registry: RemoteRegistry | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self.setWindowTitle("Connect to a server")
        self.registry = registry or RemoteRegistry()
        self.saved: Remote | None = None
        self._test: BackgroundTask[list[RemoteModel]] | None = None
        self._build()

    # ---- layout ------------------------------------------------------------------------

    def _build(self) -> None:
        self.name_edit = QLineEdit(placeholderText="gpu-box")
        self.url_edit = QLineEdit(placeholderText="http://192.168.1.20:8000/v1")
        self.key_edit = QLineEdit(placeholderText="leave empty if the server needs none")
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.model_box = QComboBox(editable=True)
        self.model_box.addItem(FIRST_LISTED)
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test_connection)
        self.status_label = QLabel(wordWrap=True)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        form.addRow("Address", self.url_edit)
        form.addRow("API key", self.key_edit)
        form.addRow("Model", self.model_box)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel
        )
        self.buttons.accepted.connect(self.save)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.test_button)
        layout.addWidget(self.status_label)
        layout.addWidget(self.buttons)

    # ---- actions -----------------------------------------------------------------------

    def test_connection(self) -> None:
        """Ask the server for its models off the UI thread; the answer fills the model list."""
        try:
            config = RemoteConfig(self.url_edit.text(), name=self.name_edit.text() or None)
        except HearthsideError as exc:
            self._show_error(exc)
            return
        key = self.key_edit.text().strip() or None
        self.test_button.setEnabled(False)
        self.status_label.setText(f"Asking {config.base_url} …")
        self._test = run_in_background(
            lambda: fetch_models(config, api_key=key),
            on_done=self._show_models,
            on_error=self._show_error,
        )

    def save(self) -> None:
        model = self.model_box.currentText().strip()
        try:
            self.saved = self.registry.add(
                self.name_edit.text().strip(),
                self.url_edit.text(),
                model=None if model in ("", FIRST_LISTED) else model,
                api_key=self.key_edit.text().strip() or None,
            )
        except HearthsideError as exc:
            self._show_error(exc)
            return
        self.accept()

    # ---- results -----------------------------------------------------------------------

    def _show_models(self, models: list[RemoteModel]) -> None:
        self.test_button.setEnabled(True)
        chosen = self.model_box.currentText()
        self.model_box.clear()
        self.model_box.addItem(FIRST_LISTED)
        self.model_box.addItems([model.id for model in models])
        if chosen != FIRST_LISTED:
            self.model_box.setCurrentText(chosen)
        count = len(models)
        noun = "model" if count == 1 else "models"
        self.status_label.setText(f"Connected: the server offers {count} {noun}.")

    def _show_error(self, error: BaseException) -> None:
        self.test_button.setEnabled(True)
        self.status_label.setText(describe_error(error))
