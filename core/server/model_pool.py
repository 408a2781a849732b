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

Idle unload (`idle_unload_s`, what llama-server's --sleep-idle-seconds, Ollama's keep_alive
and LM Studio's TTL do): a watcher thread unloads a model no request has held and whose engine
has had no job for that long, so its worker process ends and its memory returns. The next
request for it loads it again and waits meanwhile (at most `wait_s`); `ServedModel.loaded_s`
says how long, and the API puts it in a response header. The served model is unloaded too
only with `unload_served_when_idle` (`hearthside serve`): the window's own chat model stays.

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
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.errors import EngineError, HearthsideError, QueueFullError
from hearthside.core.models.store import DEFAULT_REF, ModelStore

log = logging.getLogger(__name__)
DEFAULT_MAX_LOADED = 2
# How long a request waits for its model to be loaded (behind other loads, and for a loaded
# model to fall idle so it can make room) before it gets a 503 with Retry-After.
WAIT_FOR_MODEL_S = 30.0
IDLE_POLL_S = 0.05
# The idle watcher looks this often at most (and four times per idle period at least), so a
# model is unloaded within a second or so of its idle time.
IDLE_CHECK_MAX_S = 1.0
IDLE_CHECK_MIN_S = 0.05
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
    lease: _Lease | None = None  # None: nothing to release
    loaded_s: float | None = None  # how long this request waited for its model to load

    def release(self) -> None:
        if self.lease is not None:
            self.lease.release()

    def __enter__(self) -> ServedModel:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


@dataclass(frozen=True)
class PoolEvent:
    """`loading`: a request is waiting for a model to load (loaded on demand, or the served
    one again after an idle unload); `loaded`: a model loaded on demand is ready (`service`);
    `unloaded`: a model was unloaded, `reason` says why."""

    kind: Literal["loading", "loaded", "unloaded"]
    model_id: str
    reason: str = ""
    service: EngineService | None = field(default=None, compare=False)
    served: bool = False  # the served model (its own service counts its loads)


@dataclass(eq=False)
class _Entry:
    model: InstalledModel
    last_used_s: float
    ready: Future[EngineService] = field(default_factory=Future)
    holders: int = 0  # requests waiting for it or using it: while > 0 it is never unloaded


class _Lease:
    """One request's hold on a model; releasing twice releases once."""

    def __init__(self, let_go: Callable[[], None]) -> None:
        self._let_go = let_go
        self._once = threading.Lock()

    def release(self) -> None:
        if self._once.acquire(blocking=False):
            self._let_go()


@dataclass(eq=False)
class _ServedState:
    """The served model's holders and idle time, and its config while unloaded for idling."""

    last_used_s: float
    holders: int = 0
    asleep: EngineConfig | None = None  # unloaded when idle: what the next request loads
    reloading: Future[None] | None = None


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
        idle_unload_s: float | None = None,
        unload_served_when_idle: bool = False,
    ) -> None:
        """`idle_unload_s`: unload a model idle that long (None: never); the served one only
        with `unload_served_when_idle`."""
        if max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        if idle_unload_s is not None and idle_unload_s <= 0:
            raise ValueError("idle_unload_s must be positive (None: never unload)")
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
        self.idle_unload_s = idle_unload_s
        self.unload_served_when_idle = unload_served_when_idle
        self._served_state = _ServedState(time.monotonic())
        self._watch_stopped = threading.Event()
        if idle_unload_s is not None:
            threading.Thread(
                target=self._watch_idle, name="hearthside-idle-unload", daemon=True
            ).start()

    # ---- choosing the engine for a request -------------------------------------------

    def model_for(self, name: str | None) -> ServedModel:
        """The engine that answers requests for `name`, loading it first when it is an
        installed model not loaded yet (blocking: seconds, at most `wait_s`). Held until
        released. Raises ModelNotFoundError, or QueueFullError when it cannot be had now."""
        if self._names_served(name) or self.served.is_remote:
            return self._served_lease(self.served_id)
        model = self._installed(name or "")
        if self._is_served_file(model.path):
            return self._served_lease(model.id)
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
        self._watch_stopped.set()
        with self._lock:
            self._stopping = True
            entries = list(self._entries.values())
            self._entries.clear()
            reloading = self._served_state.reloading
        if reloading is not None:  # the load itself ends with the served service
            _settle_future(reloading, exception=_shutting_down())
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
        config = self.served.loaded_config or self._served_state.asleep
        if not isinstance(config, EngineConfig):
            return False
        return Path(config.model_path).resolve() == path.resolve()

    # ---- the served model --------------------------------------------------------------

    def _served_lease(self, shown_id: str) -> ServedModel:
        """The served model, held for the caller; loaded again first when it was unloaded
        for idling (the caller waits, at most `wait_s`)."""
        state = self._served_state
        with self._lock:
            state.holders += 1
            state.last_used_s = time.monotonic()
            reload, asleep = state.reloading, state.asleep
            if reload is None and asleep is not None:
                if self._stopping:
                    state.holders -= 1
                    raise _shutting_down()
                reload = state.reloading = Future()
            else:
                asleep = None  # loaded, or another request started its load
        if asleep is not None and reload is not None:
            self._start_reload(asleep, reload)
        lease = _Lease(self._let_go_served)
        loaded_s = (
            None
            if reload is None
            else self._wait_for_load(reload, lease, shown_id, _still_loading_again)
        )
        return ServedModel(shown_id, self.served, lease, loaded_s)

    def _start_reload(self, config: EngineConfig, done: Future[None]) -> None:
        self._tell(PoolEvent("loading", self.served_id, "a request came", served=True))
        threading.Thread(
            target=self._reload_served, args=(config, done), name="reload served", daemon=True
        ).start()

    def _reload_served(self, config: EngineConfig, done: Future[None]) -> None:
        log.info("loading %s again for a request (it was unloaded while idle)", self.served_id)
        try:
            self.served.load(config, on_retry=log.info).result()
        except BaseException as exc:
            with self._lock:  # still asleep: the next request tries again
                self._served_state.reloading = None
            _settle_future(done, exception=exc)
            return
        with self._lock:
            self._served_state.asleep = None
            self._served_state.reloading = None
            self._served_state.last_used_s = time.monotonic()
        _settle_future(done, result=None)

    def _let_go_served(self) -> None:
        with self._lock:
            self._served_state.holders -= 1
            self._served_state.last_used_s = time.monotonic()

    def _wait_for_load(
        self,
        loading: Future[Any],
        lease: _Lease,
        model_id: str,
        too_slow: Callable[[str, float], QueueFullError] | None = None,
    ) -> float:
        """Seconds waited for `loading`; the lease is given up when the wait fails."""
        started = time.monotonic()
        try:
            loading.result(timeout=self.wait_s)
        except FutureTimeoutError:
            lease.release()
            raise (too_slow or _still_loading)(model_id, self.wait_s) from None
        except BaseException:
            lease.release()
            raise
        return time.monotonic() - started

    # ---- unloading idle models ---------------------------------------------------------

    def _watch_idle(self) -> None:
        assert self.idle_unload_s is not None
        every_s = max(IDLE_CHECK_MIN_S, min(IDLE_CHECK_MAX_S, self.idle_unload_s / 4))
        while not self._watch_stopped.wait(every_s):
            try:
                self.unload_idle()
            except Exception:  # the watcher must outlive whatever one unload raises
                log.exception("unloading idle models failed")

    def unload_idle(self) -> list[str]:
        """Unload every model idle for `idle_unload_s` (the watcher calls this); returns
        their ids."""
        if self.idle_unload_s is None:
            return []
        now = time.monotonic()
        reason = f"no request for {_seconds_text(self.idle_unload_s)}"
        unloaded = []
        for entry in self._take_idle_entries(now, self.idle_unload_s):
            entry.ready.result().stop()  # the worker process ends: its memory returns now
            unloaded.append(entry.model.id)
            self._announce_unload(entry.model.id, reason, served=False)
        if self.unload_served_when_idle and self._unload_served_if_idle(now, self.idle_unload_s):
            unloaded.append(self.served_id)
            self._announce_unload(self.served_id, reason, served=True)
        return unloaded

    def _announce_unload(self, model_id: str, reason: str, *, served: bool) -> None:
        log.info("unloaded %s (%s)", model_id, reason)
        self._tell(PoolEvent("unloaded", model_id, reason, served=served))

    def _take_idle_entries(self, now: float, idle_s: float) -> list[_Entry]:
        """The models loaded on demand that have been idle for `idle_s`, taken out of the
        pool in the same step; a model in use counts as used now."""
        taken = []
        with self._lock:
            for entry in list(self._entries.values()):
                if not _succeeded(entry):
                    continue
                if entry.holders or not entry.ready.result().idle:
                    entry.last_used_s = now
                elif now - entry.last_used_s >= idle_s:
                    del self._entries[entry.model.id]
                    taken.append(entry)
        return taken

    def _unload_served_if_idle(self, now: float, idle_s: float) -> bool:
        """Unload the served model when it has been idle for `idle_s`. Marked asleep under
        the lock that hands it out, so a request that comes meanwhile loads it again (its
        load queues behind the unload)."""
        state = self._served_state
        with self._lock:
            config = self.served.loaded_config
            if not isinstance(config, EngineConfig) or self._stopping or state.reloading:
                return False
            if state.holders or not self.served.idle:
                state.last_used_s = now
                return False
            if now - state.last_used_s < idle_s:
                return False
            try:
                unloading = self.served.unload()
            except EngineError:  # the service is stopping
                return False
            state.asleep = config
        unloading.result()
        return True

    # ---- loading on demand -----------------------------------------------------------

    def _lease_of(self, model: InstalledModel) -> ServedModel:
        """`model`'s engine, held for the caller; its load starts here if nobody started it."""
        with self._lock:
            if self._stopping:
                raise _shutting_down()
            entry = self._entries.get(model.id)
            first = entry is None
            if entry is None:
                entry = self._entries[model.id] = _Entry(model, time.monotonic())
                entry.holders = 1
            else:
                entry.holders += 1
            entry.last_used_s = time.monotonic()
        if first:
            self._tell(PoolEvent("loading", model.id, "a request named it"))
            threading.Thread(
                target=self._load, args=(entry,), name=f"load {model.id}", daemon=True
            ).start()
        lease = _Lease(partial(self._let_go, entry))
        if entry.ready.done():
            return ServedModel(model.id, self._ready_service(entry, lease), lease)
        loaded_s = self._wait_for_load(entry.ready, lease, model.id)
        return ServedModel(model.id, entry.ready.result(), lease, loaded_s)

    @staticmethod
    def _ready_service(entry: _Entry, lease: _Lease) -> EngineService:
        try:
            return entry.ready.result()
        except BaseException:
            lease.release()
            raise

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
        self._tell(PoolEvent("loaded", entry.model.id, service=service))

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
        self._announce_unload(victim.model.id, reason, served=False)

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


def _seconds_text(seconds: float) -> str:
    if seconds >= 120 and seconds % 60 == 0:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds:g} s"


def _settle_future(
    future: Future[Any], *, result: object = None, exception: BaseException | None = None
) -> None:
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except InvalidStateError:  # settled already (a stop answered its waiters early)
        pass


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


def _still_loading_again(model_id: str, waited_s: float) -> QueueFullError:
    return QueueFullError(
        f"The model `{model_id}` was unloaded after a quiet spell and is still loading "
        f"after {waited_s:.0f} s.",
        hint="Try again in a few seconds; it stays loaded while requests keep coming.",
    )


def _card(model_id: str, created_s: int, loaded: bool) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created_s,
        "owned_by": "hearthside",
        "loaded": loaded,  # an extension: answers without a load first
    }
