"""Getting a model ready to load: install the default model on first run, resolve the file.

`prepare_model` blocks (it may assemble 253 MB, validate a file, run the child load check),
so the window runs it on a worker thread and reports its progress; the load itself is then an
EngineService job. Resolution is the terminal chat's own (`engine_config_for`), so the window
and `hearthside chat` always pick the same file with the same settings — and, like it, use the
process's data dir (`data_dir()`, HEARTHSIDE_HOME).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hearthside.app.terminal_chat import engine_config_for
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.default_model import ensure_default_model
from hearthside.core.models.store import DEFAULT_REF, ModelRecord, ModelStore, ProgressCallback
from hearthside.core.paths import data_dir
from hearthside.core.settings import Settings


@dataclass(frozen=True)
class LoadOptions:
    """How the window loads models (the same knobs as `hearthside chat`)."""

    n_ctx: int = 4096
    n_threads: int | None = None
    n_threads_batch: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadOptions:
        return cls(settings.context_size, settings.threads, settings.batch_threads)


@dataclass(frozen=True)
class PreparedModel:
    config: EngineConfig
    name: str  # what the window calls it
    model_id: str | None  # None for a GGUF path that is not registered


def needs_default_install(ref: str) -> bool:
    """True when loading `ref` first installs the default model (a first run)."""
    if ref != DEFAULT_REF:
        return False
    with ModelStore(data_dir()) as store:
        return store.default() is None


def prepare_model(
    ref: str, options: LoadOptions, progress: ProgressCallback | None = None
) -> PreparedModel:
    """The EngineConfig for `ref` ("default", a model id or a GGUF path); blocking."""
    record = _installed_record(ref, progress)
    config = engine_config_for(ref, options.n_ctx, options.n_threads, options.n_threads_batch)
    if record is None:
        return PreparedModel(config, Path(config.model_path).stem, None)
    return PreparedModel(config, record.name, record.id)


def _installed_record(ref: str, progress: ProgressCallback | None) -> ModelRecord | None:
    with ModelStore(data_dir()) as store:
        if ref == DEFAULT_REF:
            return store.default() or ensure_default_model(store, progress=progress)
        return store.find(ref)
