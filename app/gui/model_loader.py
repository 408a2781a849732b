"""Getting a model ready to load: install the default model on first run, resolve the file.

`prepare_model` blocks (it may assemble 253 MB, validate a file, run the child load check),
so the window runs it on a worker thread and reports its progress; the load itself is then an
EngineService job. Resolution is the terminal chat's own (`load_settings_for`: the settings
tuned here, else planned here), so the window and `hearthside chat` always pick the same file
with the same settings — and, like it, use the process's data dir (`data_dir()`,
HEARTHSIDE_HOME).

The terminal chat's module, the model store and the engine settings are imported where a
model is prepared, not at the top: the window imports this module before it is shown, and
those imports (llama_cpp, SQLite helpers) would delay the first paint by seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hearthside.core.paths import data_dir

if TYPE_CHECKING:
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.remote import RemoteConfig
    from hearthside.core.models.store import ModelRecord, ProgressCallback
    from hearthside.core.probe.profile import HardwareProfile
    from hearthside.core.settings import Settings


@dataclass(frozen=True)
class LoadOptions:
    """How the window loads models (the same knobs as `hearthside chat`)."""

    n_ctx: int = 4096  # per request
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_parallel: int | None = None  # requests answered at once; None: the planner's choice

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadOptions:
        return cls(
            settings.context_size, settings.threads, settings.batch_threads, settings.parallel
        )


@dataclass(frozen=True)
class PreparedModel:
    config: EngineConfig | RemoteConfig
    name: str  # what the window calls it
    model_id: str | None  # None for a GGUF path that is not registered, or a remote server
    why: str = ""  # where the settings came from: measured here, planned, or defaults
    backed_off: bool = False  # less than asked (context, KV cache) so that it fits: `why` says

    @property
    def is_remote(self) -> bool:
        from hearthside.core.engine.remote import RemoteConfig  # imported when it was prepared

        return isinstance(self.config, RemoteConfig)


def needs_default_install(ref: str) -> bool:
    """True when loading `ref` first installs the default model (a first run)."""
    from hearthside.core.models.store import DEFAULT_REF, ModelStore

    if ref != DEFAULT_REF:
        return False
    with ModelStore(data_dir()) as store:
        return store.default() is None


def prepare_model(
    ref: str,
    options: LoadOptions,
    progress: ProgressCallback | None = None,
    profile: Callable[[], HardwareProfile] | None = None,
) -> PreparedModel:
    """The config for `ref` ("default", a model id, a GGUF path, or `remote:NAME` for a saved
    remote server), with the settings chosen for this machine (`profile` gives the hardware;
    without it the probe runs in this process); blocking."""
    from hearthside.app.terminal_chat import load_settings_for
    from hearthside.core.engine.remotes import remote_config, remote_name

    remote = remote_name(ref)
    if remote is not None:
        return PreparedModel(remote_config(ref), remote, None)
    record = _installed_record(ref, progress)
    chosen = load_settings_for(
        ref,
        options.n_ctx,
        options.n_threads,
        options.n_threads_batch,
        profile() if profile is not None else None,
        n_parallel=options.n_parallel,
    )
    config = chosen.config
    name = record.name if record is not None else Path(config.model_path).stem
    model_id = record.id if record is not None else None
    return PreparedModel(config, name, model_id, chosen.why, chosen.backed_off)


def prepare_config(config: EngineConfig) -> PreparedModel:
    """`config` with its `model_path` — a registered id, "default" or a GGUF path, as the
    planner names models — resolved to the file to load; blocking (an unregistered file is
    validated and test-loaded in a child process first). Nothing is installed here: a plan
    exists only for a model that is already there."""
    from hearthside.core.models.store import DEFAULT_REF, ModelStore, resolve_model_path

    with ModelStore(data_dir()) as store:
        ref = config.model_path
        path = resolve_model_path(store, ref)
        record = store.default() if ref == DEFAULT_REF else store.find(ref)
    resolved = config.with_changes(model_path=str(path))
    if record is None:
        return PreparedModel(resolved, path.stem, None)
    return PreparedModel(resolved, record.name, record.id)


def _installed_record(ref: str, progress: ProgressCallback | None) -> ModelRecord | None:
    from hearthside.core.models.default_model import ensure_default_model
    from hearthside.core.models.store import DEFAULT_REF, ModelStore

    with ModelStore(data_dir()) as store:
        if ref == DEFAULT_REF:
            return store.default() or ensure_default_model(store, progress=progress)
        return store.find(ref)
