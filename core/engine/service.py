"""`EngineService`: the one place that owns the loaded engine, fed by a bounded FIFO queue.

The CLI, the window and the API all submit jobs here; nobody else holds a `Llama`. The model
itself lives in a worker process (`WorkerEngine`, core/engine/worker.py), so a native crash
ends that process, not the app: the jobs in flight fail with `EngineCrashedError`, the service
starts a new worker with the same settings, and after a second crash in a row it falls back
to the safest settings (`EngineConfig.safest`) — telling its listeners each time.

Every job has its own cancel event. Generations (`Job.shared`) run side by side up to the
engine's slots (`n_parallel`: the worker batches them); any other job (a load, a benchmark)
waits for the engine to be idle and has it alone. A full queue refuses new work at once.

The service holds either a local engine (loaded from an `EngineConfig`) or a `RemoteEngine`
(connected from a `RemoteConfig`); `chat` works the same over both, `call` needs a local one.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, overload

from hearthside.core.engine.cancel import CancelEvent
from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult, TextCallback
from hearthside.core.engine.load_retry import load_retrying
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.engine.remote import RemoteConfig, RemoteEngine
from hearthside.core.engine.worker_engine import LocalEngine, WorkerEngine
from hearthside.core.errors import (
    EngineCrashedError,
    EngineError,
    JobCancelledError,
    QueueFullError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_MAX_QUEUE = 8
EngineFactory = Callable[[EngineConfig], LocalEngine]
RemoteFactory = Callable[[RemoteConfig], RemoteEngine]
RetryNote = Callable[[str], None]
LoadedEngine = Engine | WorkerEngine | RemoteEngine
AnyConfig = EngineConfig | RemoteConfig
NoticeKind = Literal["crashed", "restarted", "restart_failed"]


@dataclass(frozen=True)
class EngineNotice:
    """Something the service did on its own that the user should hear about."""

    kind: NoticeKind
    message: str
    crash: EngineCrashedError | None = None


SIGNAL_CHECK_S = 0.1  # how soon a main thread waiting for a job runs a signal's handler

Listener = Callable[[EngineNotice], None]
ResultListener = Callable[[Any], None]


class EngineStoppedError(EngineError):
    """A job was submitted to a service that has stopped (the app is closing, or the model
    was unloaded to make room for another)."""


@dataclass
class Job(Generic[T]):
    """Work to run on the engine: `run(engine, cancel)` returns the job's result.

    A `shared` job (a generation) may run beside other shared jobs, up to the engine's slots;
    any other job has the engine to itself.
    """

    run: Callable[[LoadedEngine | None, threading.Event], T]
    description: str = "job"
    cancel_event: threading.Event = field(default_factory=CancelEvent)
    future: Future[T] = field(default_factory=Future)
    shared: bool = False

    def cancel(self) -> None:
        """Stop this job: before it starts, or between two tokens while it runs."""
        self.cancel_event.set()

    def result(self, timeout: float | None = None) -> T:
        if timeout is None and threading.current_thread() is threading.main_thread():
            self._wait_waking_for_signals()
        return self.future.result(timeout)

    def _wait_waking_for_signals(self) -> None:
        """Python runs a Ctrl-C's or SIGTERM's handler in the main thread, but the kernel may
        hand the signal to any thread; then the main thread only learns of it when it wakes,
        and a wait without a timeout never does (`serve` hung on a SIGTERM during a hung load)."""
        while not self.future.done():
            wait([self.future], timeout=SIGNAL_CHECK_S)

    def done(self) -> bool:
        return self.future.done()


class EngineService:
    """Runs jobs on the loaded engine: generations side by side, anything else alone."""

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        engine_factory: EngineFactory = WorkerEngine,
        remote_factory: RemoteFactory = RemoteEngine,
    ) -> None:
        self._max_queue = max_queue
        self._pending: collections.deque[Job[Any]] = collections.deque()
        self._condition = threading.Condition()
        self._active: dict[int, Job[Any]] = {}  # the jobs running now, by id(): stop() stops them
        self._running = 0
        self._exclusive = False
        self._engine_factory = engine_factory
        self._remote_factory = remote_factory
        self._engine: LoadedEngine | None = None
        self._requested: EngineConfig | None = None  # what the caller asked to load
        self._crashes_in_a_row = 0
        self._restart_wanted = False
        self._listeners: list[Listener] = []
        self._result_listeners: list[ResultListener] = []
        self._thread = threading.Thread(target=self._work, name="hearthside-engine", daemon=True)
        self._started = False
        self._stopping = False

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> EngineService:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel queued jobs, tell the running ones to stop (between two tokens), unload the
        model, end the thread."""
        if not self._started or self._stopping:
            return
        with self._condition:
            self._stopping = True
            self._cancel_queued()
            for job in self._active.values():
                job.cancel()
            self._condition.notify_all()
        self._thread.join(timeout)

    def __enter__(self) -> EngineService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def add_listener(self, listener: Listener) -> None:
        """`listener` hears of crashes and restarts, on the service's own threads."""
        self._listeners.append(listener)

    def add_result_listener(self, listener: ResultListener) -> None:
        """`listener` hears each job's result (a GenerationResult, a loaded config...) on the
        job's thread, just before whoever waits for the job does (the API's /metrics)."""
        self._result_listeners.append(listener)

    @property
    def loaded_config(self) -> AnyConfig | None:
        """The loaded model's config; a `RemoteConfig` is resolved (model and context filled in
        from what the server said)."""
        engine = self._engine
        return engine.config if engine is not None else None

    @property
    def is_remote(self) -> bool:
        return isinstance(self._engine, RemoteEngine)

    @property
    def worker_pid(self) -> int | None:
        """The engine worker process's id (None: no model, in-process or remote)."""
        engine = self._engine
        return engine.pid if isinstance(engine, WorkerEngine) else None

    def live_speculation(self) -> SpeculationStats | None:
        """Drafted and accepted tokens so far in the running reply, read from any thread
        without waiting for the engine (None: no speculation, or a remote engine)."""
        engine = self._engine
        return (
            None
            if isinstance(engine, RemoteEngine) or engine is None
            else engine.live_speculation()
        )

    @property
    def running_jobs(self) -> int:
        """Jobs running on the engine now (generations, one per busy slot)."""
        return self._running

    @property
    def busy(self) -> bool:
        """True while a job is running on the engine."""
        return self._running > 0

    @property
    def idle(self) -> bool:
        """No job running and none queued, read in one step (a job moving from the queue to
        the engine is never missed)."""
        with self._condition:
            return self._running == 0 and not self._pending

    @property
    def waiting_jobs(self) -> int:
        """Jobs queued behind the running ones (approximate while jobs come and go)."""
        return len(self._pending)

    @property
    def slots(self) -> int:
        """Generations the loaded engine serves at the same time."""
        engine = self._engine
        if engine is None or isinstance(engine, RemoteEngine):
            return 1
        return engine.config.n_parallel

    # ---- submitting work ---------------------------------------------------------------

    def submit(self, job: Job[T]) -> Job[T]:
        """Queue `job`; raises QueueFullError at once when the queue is full."""
        with self._condition:
            if self._stopping or not self._started:
                raise EngineStoppedError(
                    "The engine is not running.", hint="Hearthside is closing or unloaded it."
                )
            if len(self._pending) >= self._max_queue:
                raise QueueFullError(
                    "Hearthside is busy with other requests.", hint="Try again in a few seconds."
                )
            self._pending.append(job)
            self._condition.notify_all()
        return job

    @overload
    def load(
        self, config: EngineConfig, *, on_retry: RetryNote | None = None
    ) -> Job[EngineConfig]: ...
    @overload
    def load(
        self, config: RemoteConfig, *, on_retry: RetryNote | None = None
    ) -> Job[RemoteConfig]: ...
    @overload
    def load(self, config: AnyConfig, *, on_retry: RetryNote | None = None) -> Job[AnyConfig]: ...

    def load(self, config: AnyConfig, *, on_retry: RetryNote | None = None) -> Job[Any]:
        """Load `config`'s model (or connect to its server) in place of the current one, which
        is unloaded first. The job's result is the config as loaded: with `on_retry`, a model
        llama.cpp cannot allocate is loaded again smaller (core/engine/load_retry.py), and
        `on_retry` hears why, on the engine thread."""

        def run(_engine: LoadedEngine | None, _cancel: threading.Event) -> AnyConfig:
            self._unload()
            self._crashes_in_a_row = 0
            if isinstance(config, RemoteConfig):
                self._requested = None
                remote = self._remote_factory(config)
                self._engine = remote
                return remote.config
            self._requested = config
            if on_retry is None:
                self._engine = self._engine_factory(config)
                return config
            self._engine, loaded = load_retrying(self._engine_factory, config, on_retry)
            return loaded

        return self.submit(Job(run, description=f"load {config.model_path}"))

    def unload(self) -> Job[None]:
        """Unload the model once the jobs before it are done: its worker process ends and its
        memory returns (the API's idle unload). `load` brings a model back."""

        def run(_engine: LoadedEngine | None, _cancel: threading.Event) -> None:
            self._unload()
            self._requested = None
            self._crashes_in_a_row = 0

        return self.submit(Job(run, description="unload"))

    def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        on_text: TextCallback | None = None,
    ) -> Job[GenerationResult]:
        """Queue a chat reply; `on_text` is called on an engine thread with each new piece."""
        history = list(messages)

        def run(engine: LoadedEngine | None, cancel: threading.Event) -> GenerationResult:
            return _require(engine).chat(history, sampling, on_text=on_text, cancel=cancel)

        return self.submit(Job(run, description="chat", shared=True))

    def call(self, fn: Callable[[LocalEngine], T], description: str = "call") -> Job[T]:
        """Queue any function of a local engine (benchmarks, tokenizing); refused for a remote."""
        return self.submit(Job(lambda engine, _cancel: fn(_require_local(engine)), description))

    def call_any(self, fn: Callable[[LoadedEngine], T], description: str = "call") -> Job[T]:
        """Queue a function that works on either kind of engine (`n_ctx`, `config`, `chat`)."""
        return self.submit(Job(lambda engine, _cancel: fn(_require(engine)), description))

    # ---- running jobs ------------------------------------------------------------------

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            if job.cancel_event.is_set() or not job.future.set_running_or_notify_cancel():
                self._finished(job, cancelled=True)
                continue
            threading.Thread(target=self._run, args=(job,), name="hearthside-engine").start()
        with self._condition:
            self._condition.wait_for(lambda: self._running == 0)
        self._unload()

    def _next_job(self) -> Job[Any] | None:
        """The next job that may start now, counted as running; None once stopping."""
        with self._condition:
            while True:
                if self._stopping:
                    return None
                if self._restart_wanted and self._running == 0:
                    self._restart_wanted = False
                    self._running, self._exclusive = 1, True
                    self._condition.release()
                    try:
                        self._restart_after_crash()
                    finally:
                        self._condition.acquire()
                        self._running, self._exclusive = 0, False
                    continue
                if self._pending and self._may_start(self._pending[0]):
                    job = self._pending.popleft()
                    self._active[id(job)] = job
                    self._running += 1
                    self._exclusive = not job.shared
                    return job
                self._condition.wait()

    def _may_start(self, job: Job[Any]) -> bool:
        if self._restart_wanted:
            return False
        if job.shared:
            return not self._exclusive and self._running < self.slots
        return self._running == 0

    def _run(self, job: Job[Any]) -> None:
        try:
            result = job.run(self._engine, job.cancel_event)
            self._tell_result(result)
            job.future.set_result(result)
        except BaseException as exc:  # the service must survive whatever one job raises
            if not isinstance(exc, EngineError):
                log.exception("engine job %s failed", job.description)
            job.future.set_exception(exc)
            self._finished(job, crashed=isinstance(exc, EngineCrashedError))
        else:
            self._finished(job)

    def _finished(self, job: Job[Any], *, cancelled: bool = False, crashed: bool = False) -> None:
        with self._condition:
            self._active.pop(id(job), None)
            if cancelled:
                if not job.future.done():
                    job.future.set_exception(JobCancelledError("The request was cancelled."))
            elif crashed:
                self._restart_wanted = self._worker_died()
            elif job.shared:
                self._crashes_in_a_row = 0
            self._running -= 1
            if self._running == 0:
                self._exclusive = False
            self._condition.notify_all()

    def _worker_died(self) -> bool:
        engine = self._engine
        return isinstance(engine, WorkerEngine) and not engine.alive

    # ---- after a crash -----------------------------------------------------------------

    def _restart_after_crash(self) -> None:
        """A new worker with the same settings; after a second crash in a row, the safest."""
        crashed = self._engine
        assert isinstance(crashed, WorkerEngine)
        crash = crashed.crash
        what = crash.message if crash else "The engine crashed."
        self._unload()
        self._crashes_in_a_row += 1
        config = self._requested or crashed.config
        if self._crashes_in_a_row >= 2:
            if config == config.safest():
                self._tell("restart_failed", _gave_up_text(what), crash)
                return
            config = self._requested = config.safest()
            how = f"with the safest settings ({config.describe_safety()})"
        else:
            how = "with the same settings"
        self._tell("crashed", f"{what} Hearthside is restarting it {how}.", crash)
        try:
            self._engine, _loaded = load_retrying(self._engine_factory, config, log.info)
        except EngineError as exc:
            self._tell("restart_failed", f"The engine could not restart: {exc.user_text()}", crash)
            return
        self._tell("restarted", f"The engine is running again, {how}.", crash)

    def _tell(self, kind: NoticeKind, message: str, crash: EngineCrashedError | None) -> None:
        log.warning("%s", message)
        notice = EngineNotice(kind, message, crash)
        for listener in list(self._listeners):
            try:
                listener(notice)
            except Exception:
                log.exception("engine notice listener failed")

    def _tell_result(self, result: Any) -> None:
        for listener in list(self._result_listeners):
            try:
                listener(result)
            except Exception:
                log.exception("engine result listener failed")

    def _cancel_queued(self) -> None:
        while self._pending:
            job = self._pending.popleft()
            job.cancel()
            job.future.set_exception(JobCancelledError("Hearthside is shutting down."))

    def _unload(self) -> None:
        # Forgotten before it is closed: once its worker has ended, nobody may still read the
        # model as loaded (GET /v1/models right after an idle unload).
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.close()


def _gave_up_text(what: str) -> str:
    return (
        f"{what} It crashed again with the safest settings, so Hearthside stopped restarting it. "
        "Load the model again, or run `hearthside engine selftest` to check the engine build."
    )


def _require(engine: LoadedEngine | None) -> LoadedEngine:
    if engine is None:
        raise EngineError("No model is loaded.", hint="Load a model first.")
    return engine


def _require_local(engine: LoadedEngine | None) -> LocalEngine:
    loaded = _require(engine)
    if isinstance(loaded, RemoteEngine):
        raise EngineError(
            "This needs a model loaded on this computer; the current one runs on "
            f"{loaded.config.describe()}.",
            hint="Load a local model for this.",
        )
    return loaded
