"""The window's own settings (toolbar "Settings…"): everything the window refers to, in one place.

Per-conversation settings (system prompt, sampling) live in chat_settings_dialog.py; these
apply to every model the window loads, to the Local API and to hub downloads. Where each is
kept:
- parallel requests: window.ini (`engine/parallel`, 0 = Auto), read and written here so the
  dialog, the window and the tests agree on the key and on what a hand-edited value means;
- context, threads, the hub's address and token, the Local API's idle unload:
  `<data dir>/settings.json` through `core/settings.py` (`save_user_settings`), the file
  `hearthside chat`/`serve` read too (the idle time is kept in seconds, shown in minutes);
- the default model: the model store (`ModelStore.set_default`);
- the Local API's port: `gui_api.json` (api_switch.py).
The data folder is shown with a button that opens it; it cannot move while Hearthside runs.

"Parallel requests" is the engine's slots (`EngineConfig.n_parallel`): how many requests —
this window's chat and Local API clients — the model answers at once, each with its own
context. Auto leaves the number to the planner (up to 4 where memory allows,
autotune/planner.py). The KV cache is allocated when a model loads, so a change to it, the
context or the threads applies at the next load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import QSettings, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QWidget,
)

from hearthside.app.gui.window_state import PARALLEL_KEY, read_int

MAX_WINDOW_PARALLEL = 8  # the window offers 1..8; the command line goes to 64
AUTO_TEXT = "Auto (the planner's choice)"
APPLIES_NOTE = "Applies the next time a model loads."
PARALLEL_TIP = (
    "How many requests — this window's chat and Local API clients — the model answers at "
    "once. Each has its own context, so the KV cache takes that many times one request's "
    "memory; the others wait their turn. Auto: the planner gives up to 4 where memory allows "
    "and 1 when it is tight, never a shorter context. " + APPLIES_NOTE
)
CONTEXT_TIP = (
    "How much of the conversation the model keeps in mind, in tokens (about ¾ of a word "
    "each). Longer takes more memory; the plan shortens it when memory is short. " + APPLIES_NOTE
)
THREADS_TIP = (
    "CPU threads that generate text. Auto uses one per physical core, which is fastest on "
    "most machines; fewer leaves room for other programs. " + APPLIES_NOTE
)
HUB_TIP = "Where “Download from the hub…” searches and downloads models (https only)."
TOKEN_TIP = (
    "An access token of your hub account, for private or gated models. It is kept in a "
    "file only you can read and sent only to the hub address above."
)
IDLE_UNLOAD_TIP = (
    "A model the Local API loaded because a request named it, and that no request has used "
    "for this long, is unloaded so its memory is free for other programs; the next request "
    "for it waits while it loads again. The model you chat with here stays loaded unless "
    "you tick the box below. Applies the next time the Local API is turned on."
)
IDLE_CHAT_TIP = (
    "Unload the model you chat with here too, after the same time without a chat, so its "
    "memory is free for other programs; sending a message loads it again (a few seconds). "
    "Never while the Local API is on: it may be answering with that model."
)
IDLE_CHAT_TEXT = "Also the model you chat with here (it loads again when you send a message)"
NEVER_TEXT = "Never"
MAX_IDLE_MINUTES = 24 * 60
OUTSIDE_NOTE = "Set outside Hearthside for this run; your choice here applies once that is gone."
MIN_CONTEXT, MAX_CONTEXT = 256, 262_144
MAX_THREADS = 256
DEFAULT_HUB = "https://huggingface.co"


def read_parallel(settings: QSettings) -> int | None:
    """The stored number of parallel requests; None for Auto (also for a missing or
    hand-edited value out of range)."""
    value = read_int(settings, PARALLEL_KEY)
    return value if value is not None and 1 <= value <= MAX_WINDOW_PARALLEL else None


def write_parallel(settings: QSettings, value: int | None) -> None:
    settings.setValue(PARALLEL_KEY, value or 0)  # 0: Auto


def parallel_text(value: int | None) -> str:
    """The setting in words, for the dialog's list and the window's message."""
    if value is None:
        return "Auto"
    return "1 (one at a time)" if value == 1 else str(value)


def threads_text(value: int | None) -> str:
    return "Auto (one per core)" if value is None else str(value)


def idle_unload_text(seconds: int | None) -> str:
    if seconds is None:
        return "never"
    if seconds % 60:
        return f"after {seconds} s"
    minutes = seconds // 60
    return f"after {minutes} minute{'' if minutes == 1 else 's'}"


@dataclass(frozen=True)
class WindowSettings:
    """What the dialog edits; `changes` between two of them are what the window applies."""

    parallel: int | None = None
    n_ctx: int = 4096
    n_threads: int | None = None
    api_port: int = 8765
    hub_endpoint: str = DEFAULT_HUB
    hub_token: str = ""
    default_model_id: str | None = None
    idle_unload_s: int | None = None  # the Local API's idle unload (None: never)
    idle_unload_chat: bool = False  # the window's own chat model too, after the same time


SETTING_NAMES = {
    "parallel": "Parallel requests",
    "n_ctx": "Context",
    "n_threads": "Threads",
    "api_port": "Local API port",
    "hub_endpoint": "Hub address",
    "hub_token": "Hub access token",
    "default_model_id": "Default model",
    "idle_unload_s": "Unload idle API models",
    "idle_unload_chat": "Unload the idle chat model too",
}


def changed_fields(before: WindowSettings, after: WindowSettings) -> list[str]:
    return [name for name in SETTING_NAMES if getattr(before, name) != getattr(after, name)]


def change_text(name: str, value: WindowSettings, model_names: dict[str, str]) -> str:
    """One changed setting in words for the message bar: "Context: 8192 tokens"."""
    words = {
        "parallel": lambda: parallel_text(value.parallel),
        "n_ctx": lambda: f"{value.n_ctx} tokens",
        "n_threads": lambda: threads_text(value.n_threads),
        "api_port": lambda: f"{value.api_port} (from the next time the API is turned on)",
        "hub_endpoint": lambda: value.hub_endpoint,
        "hub_token": lambda: "saved" if value.hub_token else "removed",
        "default_model_id": lambda: model_names.get(value.default_model_id or "", "none"),
        "idle_unload_s": lambda: (
            f"{idle_unload_text(value.idle_unload_s)} (from the next time the API is turned on)"
        ),
        "idle_unload_chat": lambda: "yes" if value.idle_unload_chat else "no",
    }
    return f"{SETTING_NAMES[name]}: {words[name]()}"


class SettingsDialog(QDialog):
    """Edits the window's settings; `parallel()` and `chosen()` read the choice."""

    def __init__(
        self,
        parallel: int | None,
        parent: QWidget | None = None,
        *,
        current: WindowSettings | None = None,
        models: Sequence[tuple[str, str]] = (),
        data_folder: Path | None = None,
        outside: Sequence[str] = (),
    ) -> None:
        """`models`: (id, name) of installed models; `outside`: the WindowSettings fields the
        environment sets for this run."""
        super().__init__(parent)
        self.setWindowTitle("Settings")
        self._current = replace(current or WindowSettings(), parallel=parallel)
        self.form = QFormLayout(self)
        self._build_model_rows(models)
        self._build_load_rows()
        self._build_hub_rows()
        self._build_data_row(data_folder)
        for name in outside:
            self._mark_outside(name)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel, self
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.form.addRow(buttons)

    # -- building --

    def _row(self, text: str, field: QWidget, tip: str) -> None:
        label = QLabel(text, self)
        label.setBuddy(field)
        label.setToolTip(tip)
        field.setToolTip(tip)
        self.form.addRow(label, field)

    def _build_model_rows(self, models: Sequence[tuple[str, str]]) -> None:
        self.model_box = QComboBox(self)
        for model_id, name in models:
            self.model_box.addItem(name, model_id)
        if not models:
            self.model_box.addItem("No model installed yet", None)
            self.model_box.setEnabled(False)
        index = self.model_box.findData(self._current.default_model_id)
        self.model_box.setCurrentIndex(max(0, index))
        self._row("Default &model:", self.model_box, "The model a new window loads first.")

    def _build_load_rows(self) -> None:
        current = self._current
        self.context_box = QSpinBox(self)
        self.context_box.setRange(MIN_CONTEXT, MAX_CONTEXT)
        self.context_box.setSingleStep(1024)
        self.context_box.setSuffix(" tokens")
        self.context_box.setValue(current.n_ctx)
        self._row("&Context:", self.context_box, CONTEXT_TIP)
        self.threads_box = QSpinBox(self)
        self.threads_box.setRange(0, MAX_THREADS)
        self.threads_box.setSpecialValueText(threads_text(None))
        self.threads_box.setValue(current.n_threads or 0)
        self._row("&Threads:", self.threads_box, THREADS_TIP)
        self.parallel_box = QComboBox(self)
        self.parallel_box.addItem(AUTO_TEXT, 0)
        for count in range(1, MAX_WINDOW_PARALLEL + 1):
            self.parallel_box.addItem(parallel_text(count), count)
        self.parallel_box.setCurrentIndex(max(0, self.parallel_box.findData(current.parallel or 0)))
        self._row("&Parallel requests:", self.parallel_box, PARALLEL_TIP)
        self.note = QLabel(APPLIES_NOTE, self)
        self.note.setWordWrap(True)
        self.form.addRow("", self.note)
        self.port_box = QSpinBox(self)
        self.port_box.setRange(1024, 65535)
        self.port_box.setValue(current.api_port)
        self._row("Local API &port:", self.port_box, "The port the Local API listens on.")
        self.idle_box = QSpinBox(self)
        self.idle_box.setRange(0, MAX_IDLE_MINUTES)
        self.idle_box.setSpecialValueText(NEVER_TEXT)
        self.idle_box.setSuffix(" minutes")
        self.idle_box.setValue(_minutes(current.idle_unload_s))
        self._row("Unload &idle API models after:", self.idle_box, IDLE_UNLOAD_TIP)
        self.idle_chat_box = QCheckBox(IDLE_CHAT_TEXT, self)
        self.idle_chat_box.setChecked(current.idle_unload_chat)
        self.idle_chat_box.setToolTip(IDLE_CHAT_TIP)
        self.idle_chat_box.setEnabled(self.idle_box.value() > 0)  # after the time above
        self.idle_box.valueChanged.connect(lambda value: self.idle_chat_box.setEnabled(value > 0))
        self.form.addRow("", self.idle_chat_box)

    def _build_hub_rows(self) -> None:
        self.hub_edit = QLineEdit(self._current.hub_endpoint, self)
        self._row("&Hub address:", self.hub_edit, HUB_TIP)
        self.token_edit = QLineEdit(self._current.hub_token, self)
        self.token_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.token_edit.setPlaceholderText("None: public models only")
        self._row("Hub access &token:", self.token_edit, TOKEN_TIP)

    def _build_data_row(self, folder: Path | None) -> None:
        self.data_folder = folder
        row = QWidget(self)
        line = QHBoxLayout(row)
        line.setContentsMargins(0, 0, 0, 0)
        self.data_label = QLabel(str(folder) if folder else "unknown", row)
        self.data_label.setWordWrap(True)
        self.open_data_button = QPushButton("Open folder", row)
        self.open_data_button.setEnabled(folder is not None)
        self.open_data_button.clicked.connect(self._open_data_folder)
        line.addWidget(self.data_label, 1)
        line.addWidget(self.open_data_button)
        self._row(
            "Data folder:",
            row,
            "Models, chats, measurements and settings are kept here, readable only by you.",
        )

    def _mark_outside(self, name: str) -> None:
        fields = {
            "n_ctx": self.context_box,
            "n_threads": self.threads_box,
            "hub_endpoint": self.hub_edit,
            "hub_token": self.token_edit,
            "parallel": self.parallel_box,
            "idle_unload_s": self.idle_box,
            "idle_unload_chat": self.idle_chat_box,
        }
        field = fields.get(name)
        if field is not None:
            field.setToolTip(f"{field.toolTip()}\n\n{OUTSIDE_NOTE}")

    def _open_data_folder(self) -> None:
        if self.data_folder is not None:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.data_folder)))

    # -- reading --

    def parallel(self) -> int | None:
        return int(self.parallel_box.currentData()) or None

    def chosen(self) -> WindowSettings:
        model_id = self.model_box.currentData()
        return WindowSettings(
            parallel=self.parallel(),
            n_ctx=self.context_box.value(),
            n_threads=self.threads_box.value() or None,
            api_port=self.port_box.value(),
            hub_endpoint=self.hub_edit.text().strip() or DEFAULT_HUB,
            hub_token=self.token_edit.text().strip(),
            default_model_id=str(model_id) if model_id is not None else None,
            idle_unload_s=self._idle_unload_s(),
            idle_unload_chat=self.idle_chat_box.isChecked(),
        )

    def _idle_unload_s(self) -> int | None:
        """The box's minutes in seconds; a stored time the box rounds stays as it was
        unless the box was changed."""
        current = self._current.idle_unload_s
        if self.idle_box.value() == _minutes(current):
            return current
        return self.idle_box.value() * 60 or None


def _minutes(seconds: int | None) -> int:
    return 0 if seconds is None else max(1, round(seconds / 60))


# ---- reading and keeping the settings (the window calls these) -------------------------------

LOAD_FIELDS = ("parallel", "n_ctx", "n_threads", "default_model_id")


def installed_models(root: Path) -> tuple[list[tuple[str, str]], str | None]:
    """(id, name) of every installed model, and the default's id."""
    from hearthside.core.models.store import ModelStore

    with ModelStore(root) as store:
        default = store.default()
        return [(r.id, r.name) for r in store.list()], default.id if default else None


def gather_settings(
    parallel: int | None, n_ctx: int, n_threads: int | None, api_port: int, root: Path
) -> tuple[WindowSettings, list[tuple[str, str]]]:
    """What the dialog starts from: the window's load options, the API's port, the settings
    file's hub address and token, the store's default model."""
    from hearthside.core.settings import Settings

    settings = Settings()
    token = settings.hub_token.get_secret_value() if settings.hub_token is not None else ""
    models, default_id = installed_models(root)
    current = WindowSettings(
        parallel=parallel,
        n_ctx=n_ctx,
        n_threads=n_threads,
        api_port=api_port,
        hub_endpoint=settings.hub_endpoint,
        hub_token=token,
        default_model_id=default_id,
        idle_unload_s=settings.idle_unload_s,
        idle_unload_chat=settings.idle_unload_chat,
    )
    return current, models


def set_outside_fields() -> list[str]:
    """The dialog's fields the environment sets for this run."""
    from hearthside.core.settings import set_outside

    schema_names = {
        "n_ctx": "context_size",
        "n_threads": "threads",
        "parallel": "parallel",
        "hub_endpoint": "hub_endpoint",
        "hub_token": "hub_token",
        "idle_unload_s": "idle_unload_s",
        "idle_unload_chat": "idle_unload_chat",
    }
    return [name for name, field in schema_names.items() if set_outside(field)]


def keep_settings(before: WindowSettings, after: WindowSettings, root: Path) -> None:
    """Write what changed to the settings file and the model store (not window.ini or the
    API's port: the window owns those). Raises a HearthsideError worded for the user."""
    from hearthside.core.settings import save_user_settings

    changed = set(changed_fields(before, after))
    if "hub_endpoint" in changed:
        from hearthside.core.models.hub_http import HubEndpoint

        HubEndpoint(url=after.hub_endpoint)  # refuses an unsafe address with a reason
    in_file = {
        "n_ctx": ("context_size", after.n_ctx),
        "n_threads": ("threads", after.n_threads),
        "hub_endpoint": ("hub_endpoint", after.hub_endpoint),
        "hub_token": ("hub_token", after.hub_token or None),
        "idle_unload_s": ("idle_unload_s", after.idle_unload_s),
        "idle_unload_chat": ("idle_unload_chat", after.idle_unload_chat or None),
    }
    wanted = dict(in_file[name] for name in changed if name in in_file)
    if wanted:
        save_user_settings(wanted, root)
    if "default_model_id" in changed and after.default_model_id:
        from hearthside.core.models.store import ModelStore

        with ModelStore(root) as store:
            store.set_default(after.default_model_id)


def changes_message(
    before: WindowSettings, after: WindowSettings, model_names: dict[str, str]
) -> str:
    """The message bar's confirmation: each change, then when it applies."""
    changed = changed_fields(before, after)
    if not changed:
        return ""
    text = "; ".join(change_text(name, after, model_names) for name in changed) + "."
    if any(name in LOAD_FIELDS for name in changed):
        text += f" {APPLIES_NOTE}"
    return text
