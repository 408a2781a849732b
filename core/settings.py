"""User settings shared by the CLI, the window and the API, from one typed schema.

Values come from (highest first) command-line flags, `HEARTHSIDE_*` environment variables,
the settings file `<data dir>/settings.json` (what the window's Settings dialog writes, with
`save_user_settings`) and the field defaults below. `home` (the data dir itself) cannot come
from a file inside it, so it is never read from or written to the file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from hearthside.core.engine.config import CHAT_CONTEXT
from hearthside.core.errors import HearthsideError
from hearthside.core.paths import data_dir, make_private_file

log = logging.getLogger(__name__)

ENV_PREFIX = "HEARTHSIDE_"
SETTINGS_FILE_NAME = "settings.json"
# What the window may write; everything else in the schema stays with flags and the env.
FILE_FIELDS = (
    "context_size",
    "threads",
    "hub_endpoint",
    "hub_token",
    "idle_unload_s",
    "idle_unload_chat",
)


class SettingsFileError(HearthsideError):
    """The settings could not be saved (disk full, read-only data dir) or are invalid."""


def settings_file(root: Path | None = None) -> Path:
    return (root if root is not None else data_dir()) / SETTINGS_FILE_NAME


def read_user_settings(root: Path | None = None) -> dict[str, Any]:
    """What the settings file holds (only FILE_FIELDS); {} when it is missing or damaged."""
    path = settings_file(root)
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring the settings file %s: %s", path, exc)
        return {}
    if not isinstance(stored, dict):
        return {}
    return {key: value for key, value in stored.items() if key in FILE_FIELDS}


class _SettingsFileSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        return read_user_settings()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    home: str | None = Field(
        default=None, description="Data directory (models, database); default: the OS data dir."
    )
    context_size: int = Field(default=CHAT_CONTEXT, ge=16, description="Context window in tokens.")
    threads: int | None = Field(
        default=None, ge=1, description="Decode threads; default: the physical core count."
    )
    batch_threads: int | None = Field(
        default=None, ge=1, description="Prompt-processing threads; default: all logical cores."
    )
    parallel: int | None = Field(
        default=None,
        ge=1,
        le=64,  # core/engine/config.py's MAX_PARALLEL (llama.cpp's LLAMA_MAX_SEQ)
        description="Requests the API and the window answer at once (slots, each with its own "
        "context); default: the planner's choice, up to 4 where memory allows.",
    )
    temperature: float = Field(default=0.7, ge=0.0, le=2.0, description="Sampling temperature.")
    idle_unload_s: int | None = Field(
        default=None,
        ge=1,
        description="Unload a model the API has had no request for in this many seconds, so "
        "its memory returns; the next request loads it again. `serve` unloads its own model "
        "too, the window only models the API loaded on request. None: never.",
    )
    idle_unload_chat: bool = Field(
        default=False,
        description="With idle_unload_s: the window's own chat model unloads too after that "
        "long without a chat while the Local API is off, and loads again when a message is "
        "sent.",
    )
    max_queue: int = Field(
        default=8, ge=1, le=256, description="Requests that may wait for the engine at once."
    )
    hub_endpoint: str = Field(
        default="https://huggingface.co",
        description="The model hub's address (https only) for search and downloads.",
    )
    hub_allow_insecure_loopback: bool = Field(
        default=False,
        description="For tests: allow plain http when hub_endpoint is a loopback IP address "
        "(127.0.0.1, ::1). It has no effect for any other host.",
    )
    hub_token: SecretStr | None = Field(
        default=None,
        description="Hub access token for private or gated repos; sent only to hub_endpoint.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _SettingsFileSource(settings_cls))


def set_outside(field_name: str, env: dict[str, str] | None = None) -> bool:
    """True when the environment sets `field_name` for this run (it wins over the file)."""
    environ = os.environ if env is None else env
    return f"{ENV_PREFIX}{field_name.upper()}" in environ


def save_user_settings(changes: dict[str, Any], root: Path | None = None) -> dict[str, Any]:
    """Merge `changes` (FILE_FIELDS only; None removes a value) into the settings file after
    checking them against the schema; returns what the file now holds."""
    unknown = set(changes) - set(FILE_FIELDS)
    if unknown:
        raise ValueError(f"not settings the file keeps: {sorted(unknown)}")
    stored = read_user_settings(root)
    stored.update(changes)
    stored = {key: value for key, value in stored.items() if value is not None}
    try:
        Settings.model_validate(stored)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first.get("loc", ()))
        raise SettingsFileError(
            f"That setting cannot be used: {where}: {first.get('msg', 'invalid value')}.",
            hint="Correct it and save again.",
        ) from exc
    _write_private_json(settings_file(root), stored)
    return stored


def _write_private_json(path: Path, content: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".part")
    try:
        make_private_file(partial)  # the hub token may be in it: 0600
        partial.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(partial, path)
    except OSError as exc:
        raise SettingsFileError(
            f"The settings could not be saved in {path.parent} ({exc.strerror or exc}).",
            hint="Free some disk space or check that folder's permissions, then save again.",
        ) from exc
