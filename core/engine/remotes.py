"""The remote servers the user has saved: `remotes.json` in the data dir, keys beside it.

Each remote has a name, the server's address, an optional model and an optional key. The key
lives in its own private file (`remote-keys/NAME.key`, 0600, written like our own API key) and
the list holds only that file's name, so listing remotes never touches a secret. Both files
are replaced atomically; the list is private too (it reveals which servers the user uses).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from hearthside.core.engine.remote import (
    DEFAULT_TIMEOUT_S,
    VALID_REMOTE_KEY,
    RemoteConfig,
    RemoteConfigError,
    normalise_base_url,
)
from hearthside.core.paths import data_dir, is_within
from hearthside.core.server.keys import read_private_text, write_private_file

SCHEMA = 1
REMOTES_FILE = "remotes.json"
KEYS_DIR = "remote-keys"
REMOTE_PREFIX = "remote:"
VALID_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_REMOTES_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class Remote:
    """One saved server. `key_file` is relative to the data dir; None when it needs no key."""

    name: str
    base_url: str
    model: str | None = None
    key_file: str | None = None
    timeout_s: float = DEFAULT_TIMEOUT_S

    @property
    def has_key(self) -> bool:
        return self.key_file is not None

    def config(self, root: Path) -> RemoteConfig:
        key_path = str(root / self.key_file) if self.key_file else None
        return RemoteConfig(
            base_url=self.base_url,
            model=self.model,
            api_key_file=key_path,
            name=self.name,
            timeout_s=self.timeout_s,
        )


def remote_name(model_ref: str) -> str | None:
    """NAME for a model reference `remote:NAME`, None for any other reference."""
    return model_ref.removeprefix(REMOTE_PREFIX) if model_ref.startswith(REMOTE_PREFIX) else None


def remote_config(model_ref: str, root: Path | None = None) -> RemoteConfig:
    """The `RemoteConfig` for `remote:NAME` (or a bare NAME)."""
    return RemoteRegistry(root).config(remote_name(model_ref) or model_ref)


class RemoteRegistry:
    """Reads and changes the saved remotes of one data dir."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else data_dir()

    @property
    def path(self) -> Path:
        return self.root / REMOTES_FILE

    def all(self) -> list[Remote]:
        return sorted(self._load().values(), key=lambda remote: remote.name)

    def get(self, name: str) -> Remote:
        remote = self._load().get(name)
        if remote is None:
            raise RemoteConfigError(
                f"There is no remote server named '{name}'.",
                hint="See the saved ones with `hearthside remote list`, or add it with "
                "`hearthside remote add NAME URL`.",
            )
        return remote

    def config(self, name: str) -> RemoteConfig:
        return self.get(name).config(self.root)

    def add(
        self,
        name: str,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        replace_existing: bool = False,
    ) -> Remote:
        """Save a remote (and its key, in its own private file)."""
        _check_name(name)
        remotes = self._load()
        if name in remotes and not replace_existing:
            raise RemoteConfigError(
                f"A remote server named '{name}' is already saved.",
                hint="Add --replace to change it, or choose another name.",
            )
        remote = Remote(name=name, base_url=normalise_base_url(base_url), model=model or None)
        if api_key is not None:
            remote = replace(remote, key_file=self._store_key(name, api_key))
        else:
            self._delete_key(remotes.get(name))
        remotes[name] = remote
        self._save(remotes)
        return remote

    def remove(self, name: str) -> Remote:
        remotes = self._load()
        remote = self.get(name)
        del remotes[name]
        self._save(remotes)
        self._delete_key(remote)
        return remote

    # ---- files -------------------------------------------------------------------------

    def _load(self) -> dict[str, Remote]:
        text = read_private_text(self.path, MAX_REMOTES_FILE_BYTES)
        if text is None:
            if self.path.exists():
                raise self._damaged()
            return {}
        try:
            data = json.loads(text)
            entries = data["remotes"] if data.get("schema") == SCHEMA else None
            remotes = [_remote_from(entry) for entry in entries]  # type: ignore[union-attr]
        except (ValueError, KeyError, TypeError, AttributeError, RemoteConfigError):
            raise self._damaged() from None
        return {remote.name: remote for remote in remotes}

    def _save(self, remotes: dict[str, Remote]) -> None:
        entries = [_remote_to(remote) for remote in sorted(remotes.values(), key=_by_name)]
        text = json.dumps({"schema": SCHEMA, "remotes": entries}, indent=2) + "\n"
        write_private_file(self.path, text.encode("utf-8"))

    def _store_key(self, name: str, api_key: str) -> str:
        key = api_key.strip()
        if not VALID_REMOTE_KEY.fullmatch(key):
            raise RemoteConfigError(
                "That API key has spaces or characters a key cannot have.",
                hint="Give the key exactly as the server's operator gave it, on one line.",
            )
        relative = f"{KEYS_DIR}/{name}.key"
        write_private_file(self.root / relative, key.encode("ascii") + b"\n")
        return relative

    def _delete_key(self, remote: Remote | None) -> None:
        if remote is None or remote.key_file is None:
            return
        path = self.root / remote.key_file
        if is_within(path, self.root / KEYS_DIR):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _damaged(self) -> RemoteConfigError:
        return RemoteConfigError(
            f"The list of remote servers ({self.path}) is damaged.",
            hint="Move it aside and add the remotes again with `hearthside remote add`.",
        )


def _check_name(name: str) -> None:
    if not VALID_NAME.fullmatch(name):
        raise RemoteConfigError(
            f"'{name}' cannot be a remote's name.",
            hint="Use letters, digits, '.', '_' and '-' (up to 64), starting with a letter "
            "or digit.",
        )


def _by_name(remote: Remote) -> str:
    return remote.name


def _remote_to(remote: Remote) -> dict[str, Any]:
    return {
        "name": remote.name,
        "base_url": remote.base_url,
        "model": remote.model,
        "key_file": remote.key_file,
        "timeout_s": remote.timeout_s,
    }


def _remote_from(entry: dict[str, Any]) -> Remote:
    _check_name(entry["name"])
    key_file = entry.get("key_file")
    if key_file is not None and key_file != f"{KEYS_DIR}/{entry['name']}.key":
        raise ValueError("a key file outside remote-keys/")
    return Remote(
        name=entry["name"],
        base_url=normalise_base_url(entry["base_url"]),
        model=entry.get("model"),
        key_file=key_file,
        timeout_s=float(entry.get("timeout_s", DEFAULT_TIMEOUT_S)),
    )
