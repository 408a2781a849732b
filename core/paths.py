"""Where Hearthside keeps its data, and the rules for creating private files there.

The data dir is the platformdirs user data dir unless `HEARTHSIDE_HOME` points elsewhere
(tests and portable installs use that). It is created mode 0700; databases and keys 0600.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_NAME = "Hearthside"
HOME_ENV = "HEARTHSIDE_HOME"
CACHE_ENV = "HEARTHSIDE_CACHE"


def data_dir(home: str | os.PathLike[str] | None = None) -> Path:
    """The root of everything Hearthside stores, created private on first use."""
    chosen = home if home is not None else os.environ.get(HOME_ENV)
    root = Path(chosen) if chosen else Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))
    return ensure_private_dir(root)


def cache_dir() -> Path:
    """Downloads that can be fetched again (the default model's wheel contents): the
    platformdirs user cache dir unless `HEARTHSIDE_CACHE` points elsewhere. Shared by every
    data dir, so tests with a fresh `HEARTHSIDE_HOME` each do not download again."""
    chosen = os.environ.get(CACHE_ENV)
    root = Path(chosen) if chosen else Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
    return ensure_private_dir(root)


def models_dir(root: Path) -> Path:
    return ensure_private_dir(root / "models")


def ensure_private_dir(path: Path) -> Path:
    """Create `path` (and parents) and make it readable by this user only."""
    path.mkdir(parents=True, exist_ok=True)
    if os.name == "posix":
        path.chmod(0o700)
    return path


def make_private_file(path: Path) -> None:
    """Create `path` if missing and restrict it to this user (0600 on POSIX)."""
    if not path.exists():
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.close(fd)
    if os.name == "posix":
        path.chmod(0o600)


def is_within(path: Path, root: Path) -> bool:
    """True when `path`, with symlinks resolved, lies under `root`."""
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True
