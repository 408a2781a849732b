"""Which engine answers a request's `model`: the served model, or any installed model, loaded
on demand in an engine of its own (what Ollama's OLLAMA_MAX_LOADED_MODELS and LM Studio's JIT
loading do).

The window and the API share one EngineService for the model the user chose: the "served"
model, named by `ServerSettings.model_id`, by "default", or by no name at all. A request that
names another installed model gets that model's own EngineService (its own worker process)
from this pool, loaded with the planner's settings for this machine. The pool keeps at most
`max_loaded` such models; when a new one needs room — the cap, or memory by the planner's
estimate — it stops the least recently used idle one, whose worker process ends and gives its
memory back at once. Two requests for a model that is still loading wait for the same load.

A request holds its model (`ServedModel` is a lease: release it, or use it as a context
manager) from the moment it asks until its jobs are queued; a held model is never unloaded, so
no request meets an engine torn down under it. Loads run one at a time on a thread of the
pool's own; a request waits for its model at most `wait_s`, then gets QueueFullError (503 with
Retry-After) and the load carries on for the next request, unless nobody wants it any more.
So at most `max_loaded` models are loaded on demand, the one loading included.

The app layer says what is installed and how a model is planned (`OnDemandModels`): this
module knows neither where the store lives nor how the planner works.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.errors import HearthsideError, QueueFullError
from hearthside.core.models.store import DEFAULT_REF, ModelStore

log = logging.getLogger(__name__)
DEFAULT_MAX_LOADED = 2
# How long a request waits for its model to be loaded (behind other loads, and for a loaded
# model to fall idle so it can make room) before it gets a 503 with Retry-After.
WAIT_FOR_MODEL_S = 30.0
IDLE_POLL_S = 0.05
MAX_NAME_SHOWN = 80


@dataclass(frozen=True)
class InstalledModel:
    id: str  # the id `hearthside models list` shows
    path: Path
    created_s: int  # Unix time it was added


class ModelLoader(Protocol):
    """How a model is planned and sized on this machine (the app layer's planner)."""

    def settings_for(self, model: InstalledModel) -> EngineConfig:
        """The settings `model` loads with on this machine (planned for the whole machine)."""
        ...

    def fits_now(self, config: EngineConfig) -> bool:
        """Whether `config` fits in the memory free at this moment, by the planner's estimate."""
        ...


@dataclass(frozen=True)
class OnDemandModels:
    """What the pool may load beside the served model, and how."""

    installed: Callable[[], Sequence[InstalledModel]]
    loader: ModelLoader


class ModelNotFoundError(HearthsideError):
    """A request named a model that is neither served nor installed."""

    def __init__(self, name: str) -> None:
        shown = "".join(ch if ch.isprintable() else "?" for ch in name)[:MAX_NAME_SHOWN]
        super().__init__(
            f"The model `{shown}` does not exist or you do not have access to it.",
            hint="GET /v1/models lists the models this server answers for, and `default`.",
        )


@dataclass(frozen=True)
class ServedModel:
    """The engine for a request, held (never unloaded) until `release()`."""

    id: str  # the name replies carry
    service: EngineService
    lease: _Lease | None = None  # None: the served model, which the pool never unloads

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclass(frozen=True)
class PoolEvent:
    kind: Literal["loaded", "unloaded"]
    model_id: str
    reason: str = ""


@dataclass(eq=False)
class _Entry:
    model: InstalledModel
    last_used_s: float
    ready: Future[EngineService] = field(default_factory=Future)
    holders: int = 0  # requests waiting for it or using it: while > 0 it is never unloaded


class _Lease:
    """One request's hold on an entry; releasing twice releases once."""

    def __init__(self, pool: ModelPool, entry: _Entry) -> None:
        self._pool = pool
        self._entry = entry
        self._once = threading.Lock()

    def release(self) -> None:
        if self._once.acquire(blocking=False):
            self._pool._let_go(self._entry)


def installed_in_store(root: Path) -> list[InstalledModel]:
    """The models registered in the store under `root` whose file is present."""
    with ModelStore(root) as store:
        records = store.list()
    return [
        InstalledModel(record.id, record.path, _unix_time(record.added_at))
        for record in records
        if record.path.is_file()
    ]


def _unix_time(iso: str) -> int:
    try:
        return int(datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return 0


def _started_service() -> EngineService:
    return EngineService().start()


class ModelPool:
    """The served model and the models loaded on demand, by the names clients send."""

    def __init__(
        self,
        served: EngineService,
        served_id: str,
        on_demand: OnDemandModels | None = None,
        *,
        max_loaded: int = DEFAULT_MAX_LOADED,
        created_s: int | None = None,
        service_factory: Callable[[], EngineService] = _started_service,
        wait_s: float = WAIT_FOR_MODEL_S,
    ) -> None:
        if max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        self.served = served
        self.served_id = served_id
        self.max_loaded = max_loaded
        self.wait_s = wait_s
        self._on_demand = on_demand
        self._created_s = int(time.time()) if created_s is None else created_s
        self._listeners: list[Callable[[PoolEvent], None]] = []
        self._service_factory = service_factory
        self._lock = threading.Lock()
        # One load at a time (its room is measured alone), in the order they were asked for.
        self._load_turns: collections.deque[_Entry] = collections.deque()
        self._entries: dict[str, _Entry] = {}
        self._stopping = False

    # ---- choosing the engine for a request -------------------------------------------

    def model_for(self, name: str | None) -> ServedModel:
        """The engine that answers requests for `name`, loading it first when it is an
        installed model not loaded yet (blocking: seconds, at most `wait_s`). Held until
        released. Raises ModelNotFoundError, or QueueFullError when it cannot be had now."""
        if self._names_served(name) or self.served.is_remote:
            return ServedModel(self.served_id, self.served)
        model = self._installed(name or "")
        if self._is_served_file(model.path):
            return ServedModel(model.id, self.served)
        return self._lease_of(model)

    def service_for(self, name: str | None) -> EngineService:
        """The engine for `name`, not held: it may be unloaded for another at any time."""
        with self.model_for(name) as model:
            return model.service

    def add_listener(self, listener: Callable[[PoolEvent], None]) -> None:
        """`listener` hears every load and unload, on the thread that did it."""
        self._listeners.append(listener)

    def loaded_worker_pids(self) -> dict[str, int | None]:
        """The models loaded on demand now, with their worker process ids."""
        with self._lock:
            ready = [entry for entry in self._entries.values() if _succeeded(entry)]
        return {entry.model.id: entry.ready.result().worker_pid for entry in ready}

    def stop(self) -> None:
        """Unload every model loaded on demand (the served one stays with its owner); the
        requests waiting for a load hear at once that the API is shutting down."""
        with self._lock:
            self._stopping = True
            entries = list(self._entries.values())
            self._entries.clear()
        for entry in entries:
            _settle(entry, exception=_shutting_down())  # a load still running ends by itself
            if _succeeded(entry):
                entry.ready.result().stop()

    # ---- /v1/models ------------------------------------------------------------------

    def cards(self) -> list[dict[str, Any]]:
        """Every model a request may name: the served one first, then the installed ones,
        then the alias "default"; `loaded` says which answer without loading first."""
        served = self._served_card(self.served_id)
        if self.served.is_remote:
            return [served]
        others = [self._installed_card(m) for m in self._all_installed() if m.id != self.served_id]
        return [served, *others, self._served_card(DEFAULT_REF)]

    def card(self, name: str) -> dict[str, Any]:
        """The card for `name`; raises ModelNotFoundError."""
        if self._names_served(name):
            return self._served_card(name)
        if self.served.is_remote:
            raise ModelNotFoundError(name)
        return self._installed_card(self._installed(name))

    def _served_card(self, name: str) -> dict[str, Any]:
        loaded = self.served.loaded_config is not None
        return _card(name or DEFAULT_REF, self._created_s, loaded)

    def _installed_card(self, model: InstalledModel) -> dict[str, Any]:
        with self._lock:
            entry = self._entries.get(model.id)
        loaded = self._is_served_file(model.path) or (entry is not None and _succeeded(entry))
        return _card(model.id, model.created_s, loaded)

    # ---- names -----------------------------------------------------------------------

    def _names_served(self, name: str | None) -> bool:
        return name in (None, "", DEFAULT_REF, self.served_id)

    def _all_installed(self) -> Sequence[InstalledModel]:
        return self._on_demand.installed() if self._on_demand is not None else ()

    def _installed(self, name: str) -> InstalledModel:
        found = next((m for m in self._all_installed() if m.id == name), None)
        if found is None:
            raise ModelNotFoundError(name)
        return found

    def _is_served_file(self, path: Path) -> bool:
        config = self.served.loaded_config
        if not isinstance(config, EngineConfig):
            return False
        return Path(config.model_path).resolve() == path.resolve()

    # ---- loading on demand -----------------------------------------------------------

    def _lease_of(self, model: InstalledModel) -> ServedModel:
        """`model`'s engine, held for the caller; its load starts here if nobody started it."""
        with self._lock:
            if self._stopping:
                raise _shutting_down()
            entry = self._entries.get(model.id)
            if entry is None:
                entry = self._entries[model.id] = _Entry(model, time.monotonic())
                entry.holders = 1
                threading.Thread(
                    target=self._load, args=(entry,), name=f"load {model.id}", daemon=True
                ).start()
            else:
                entry.holders += 1
            entry.last_used_s = time.monotonic()
        lease = _Lease(self, entry)
        try:
            service = entry.ready.result(timeout=self.wait_s)
        except FutureTimeoutError:
            lease.release()
            raise _still_loading(model.id, self.wait_s) from None
        except BaseException:
            lease.release()
            raise
        return ServedModel(model.id, service, lease)

    def _let_go(self, entry: _Entry) -> None:
        with self._lock:
            entry.holders -= 1
            entry.last_used_s = time.monotonic()

    def _load(self, entry: _Entry) -> None:
        """On the entry's own thread: load its model, one load at a time."""
        try:
            service = self._loaded_service(entry)
        except BaseException as exc:
            with self._lock:
                if self._entries.get(entry.model.id) is entry:
                    del self._entries[entry.model.id]  # the next request tries again
            _settle(entry, exception=exc)
            return
        if not _settle(entry, service=service):  # the pool stopped meanwhile
            service.stop()
            return
        self._tell(PoolEvent("loaded", entry.model.id))

    def _loaded_service(self, entry: _Entry) -> EngineService:
        with self._lock:
            self._load_turns.append(entry)
        service: EngineService | None = None
        try:
            self._wait_for_turn(entry)
            config = self._make_room_and_plan(entry)
            service = self._service_factory()
            service.load(config, on_retry=log.info).result()
            return service
        except BaseException:
            if service is not None:
                service.stop()
            raise
        finally:
            with self._lock:
                self._load_turns.remove(entry)

    def _wait_for_turn(self, entry: _Entry) -> None:
        while True:
            self._check_still_wanted(entry)
            with self._lock:
                if self._load_turns[0] is entry:
                    return
            time.sleep(IDLE_POLL_S)

    def _check_still_wanted(self, entry: _Entry) -> None:
        """Raise when the pool is stopping, or when every request that wanted the model has
        given up (its load would only take memory and time from the next one)."""
        with self._lock:
            if self._stopping:
                raise _shutting_down()
            if entry.holders == 0:
                if self._entries.get(entry.model.id) is entry:
                    del self._entries[entry.model.id]
                raise _still_loading(entry.model.id, self.wait_s)

    def _make_room_and_plan(self, entry: _Entry) -> EngineConfig:
        """Unload the least recently used models until the cap leaves room for `entry`'s,
        then until its planned settings fit the memory free now. (The planner plans for the
        whole machine, so what the others hold never shrinks the new model's settings.)"""
        while len(self._others(entry)) >= self.max_loaded:
            self._unload_least_recent(entry, f"at most {self.max_loaded} loaded on demand")
        config = self._loader().settings_for(entry.model)
        while self._others(entry) and not self._loader().fits_now(config):
            self._unload_least_recent(entry, f"memory for {entry.model.id}")
        return config

    def _others(self, entry: _Entry) -> list[_Entry]:
        with self._lock:
            return [e for e in self._entries.values() if e is not entry and _succeeded(e)]

    def _unload_least_recent(self, entry: _Entry, reason: str) -> None:
        """Stop the least recently used idle model, waiting while every one is in use (as
        long as some request still wants `entry`'s model)."""
        while (victim := self._take_least_recent_idle(entry)) is None:
            self._check_still_wanted(entry)
            time.sleep(IDLE_POLL_S)
        victim.ready.result().stop()  # the worker process ends: its memory returns now
        log.info("unloaded %s (%s)", victim.model.id, reason)
        self._tell(PoolEvent("unloaded", victim.model.id, reason))

    def _take_least_recent_idle(self, entry: _Entry) -> _Entry | None:
        """The least recently used model that no request holds and whose engine is idle,
        taken out of the pool in the same step (under the lock that hands models out, so
        none is handed out as it goes)."""
        with self._lock:
            idle = [
                other
                for other in self._entries.values()
                if other is not entry
                and other.holders == 0
                and _succeeded(other)
                and other.ready.result().idle
            ]
            victim = min(idle, key=lambda other: other.last_used_s, default=None)
            if victim is not None:
                del self._entries[victim.model.id]
            return victim

    def _loader(self) -> ModelLoader:
        assert self._on_demand is not None  # only installed models reach a load
        return self._on_demand.loader

    def _tell(self, event: PoolEvent) -> None:
        for listener in list(self._listeners):
            try:
                listener(event)
            except Exception:
                log.exception("model pool listener failed")


def _succeeded(entry: _Entry) -> bool:
    return entry.ready.done() and entry.ready.exception() is None


def _settle(
    entry: _Entry, *, service: EngineService | None = None, exception: BaseException | None = None
) -> bool:
    """Give `entry` its outcome unless it has one already (a stop settles loads early)."""
    try:
        if exception is not None:
            entry.ready.set_exception(exception)
        else:
            entry.ready.set_result(service)  # type: ignore[arg-type]
    except InvalidStateError:
        return False
    return True


def _shutting_down() -> QueueFullError:
    return QueueFullError(
        "The API is shutting down.", hint="Send the request again once it has restarted."
    )


def _still_loading(model_id: str, waited_s: float) -> QueueFullError:
    return QueueFullError(
        f"The model `{model_id}` could not be loaded within {waited_s:.0f} s: other models "
        "are loading or every loaded model is busy.",
        hint="Try again in a few seconds, or ask for a model that is already loaded "
        '(GET /v1/models marks them "loaded").',
    )


def _card(model_id: str, created_s: int, loaded: bool) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created_s,
        "owned_by": "hearthside",
        "loaded": loaded,  # an extension: answers without a load first
    }
