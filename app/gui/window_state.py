"""What the window remembers between runs, in an INI file inside the data dir.

QSettings normally writes to the user's global config (`~/.config/Hearthside/…`); pointing it
at `<data dir>/window.ini` keeps everything Hearthside stores in one folder, lets
HEARTHSIDE_HOME isolate tests and portable installs, and keeps tests off the real settings.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSettings

from hearthside.core.paths import make_private_file

SETTINGS_FILE_NAME = "window.ini"
ORGANIZATION = "Hearthside"
APPLICATION = "Hearthside"

GEOMETRY_KEY = "window/geometry"
WINDOW_STATE_KEY = "window/state"
SIDEBAR_SPLITTER_KEY = "window/sidebar_splitter"
CHAT_SPLITTER_KEY = "window/chat_splitter"
PAGE_KEY = "window/page"
LAST_CONVERSATION_KEY = "chat/last_conversation"
BANNER_DISMISSED_KEY = "banner/optimize_dismissed"
PARALLEL_KEY = "engine/parallel"  # parallel requests; 0: Auto (app/gui/settings_dialog.py)


def gui_settings(root: Path) -> QSettings:
    path = root / SETTINGS_FILE_NAME
    make_private_file(path)
    return QSettings(str(path), QSettings.Format.IniFormat)


def read_int(settings: QSettings, key: str) -> int | None:
    value = settings.value(key)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None  # a hand-edited file; forget the value rather than fail


def read_bool(settings: QSettings, key: str) -> bool:
    value = settings.value(key, False)
    if isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    return bool(value)
