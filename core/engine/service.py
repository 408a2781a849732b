"""`EngineService`: the one thread that owns the engine, fed by a bounded FIFO queue of jobs.

The CLI, the window and the API all submit jobs here; nobody else touches a `Llama`. Every
job has its own cancel event, checked between tokens (and inside long prompt evaluations),
so cancelling one reply never disturbs another. A full queue refuses new work at once.

The service holds either a local `Engine` (loaded from an `EngineConfig`) or a `RemoteEngine`
(connected from a `RemoteConfig`); `chat` works the same over both, `call` needs a local one.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult, TextCallback
from hearthside.core.engine.load_retry import load_retrying
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.engine.remote import RemoteConfig, RemoteEngine
from hearthside.core.errors import EngineError, JobCancelledError, QueueFullError

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_MAX_QUEUE = 8
EngineFactory = Callable[[EngineConfig], Engine]
RemoteFactory = Callable[[RemoteConfig], RemoteEngine]
RetryNote = Callable[[str], None]
LoadedEngine = Engine | RemoteEngine
AnyConfig = EngineConfig | RemoteConfig


@dataclass
class Job(Generic[T]):
    """Work to run on the engine thread: `run(engine, cancel)` returns the job's result."""

    run: Callable[[LoadedEngine | None, threading.Event], T]
    description: str = "job"
    cancel_event: threading.Event = field(default_factory=threading.Event)
    future: Future[T] = field(default_factory=Future)

    def cancel(self) -> None:
        """Stop this job: before it starts, or between two tokens while it runs."""
        self.cancel_event.set()

    def result(self, timeout: float | None = None) -> T:
        return self.future.result(timeout)

    def done(self) -> bool:
        return self.future.done()


class EngineService:
    """Runs jobs one at a time on a dedicated thread that owns the loaded Engine."""

    def __init__(
        self,
        *,
        max_queue: int = DEFAULT_MAX_QUEUE,
        engine_factory: EngineFactory = Engine,
        remote_factory: RemoteFactory = RemoteEngine,
    ) -> None:
        self._queue: queue.Queue[Job[Any] | None] = queue.Queue(maxsize=max_queue)
        self._engine_factory = engine_factory
        self._remote_factory = remote_factory
        self._engine: LoadedEngine | None = None
        self._thread = threading.Thread(target=self._work, name="hearthside-engine", daemon=True)
        self._started = False
        self._stopping = False
        self._busy = False

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> EngineService:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Cancel queued jobs, let the running one stop, unload the model, end the thread."""
        if not self._started or self._stopping:
            return
        self._stopping = True
        self._cancel_queued()
        self._queue.put(None)
        self._thread.join(timeout)

    def __enter__(self) -> EngineService:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def loaded_config(self) -> AnyConfig | None:
        """The loaded model's config; a `RemoteConfig` is resolved (model and context filled in
        from what the server said)."""
        engine = self._engine
        return engine.config if engine is not None else None

    @property
    def is_remote(self) -> bool:
        return isinstance(self._engine, RemoteEngine)

    def live_speculation(self) -> SpeculationStats | None:
        """Drafted and accepted tokens so far in the running reply, read from any thread
        without waiting for the engine (None: no speculation, or a remote engine)."""
        engine = self._engine
        return engine.live_speculation() if isinstance(engine, Engine) else None

    @property
    def busy(self) -> bool:
        """True while a job is running on the engine thread."""
        return self._busy

    @property
    def waiting_jobs(self) -> int:
        """Jobs queued behind the running one (approximate while jobs come and go)."""
        return self._queue.qsize()

    # ---- submitting work ---------------------------------------------------------------

    def submit(self, job: Job[T]) -> Job[T]:
        """Queue `job`; raises QueueFullError at once when the queue is full."""
        if self._stopping or not self._started:
            raise EngineError("The engine is not running.")
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            raise QueueFullError(
                "Hearthside is busy with other requests.", hint="Try again in a few seconds."
            ) from None
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
            if isinstance(config, RemoteConfig):
                remote = self._remote_factory(config)
                self._engine = remote
                return remote.config
            if on_retry is None:
                self._engine = self._engine_factory(config)
                return config
            self._engine, loaded = load_retrying(self._engine_factory, config, on_retry)
            return loaded

        return self.submit(Job(run, description=f"load {config.model_path}"))

    def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        on_text: TextCallback | None = None,
    ) -> Job[GenerationResult]:
        """Queue a chat reply; `on_text` is called on the engine thread with each new piece."""
        history = list(messages)

        def run(engine: LoadedEngine | None, cancel: threading.Event) -> GenerationResult:
            return _require(engine).chat(history, sampling, on_text=on_text, cancel=cancel)

        return self.submit(Job(run, description="chat"))

    def call(self, fn: Callable[[Engine], T], description: str = "call") -> Job[T]:
        """Queue any function of a local engine (benchmarks, tokenizing); refused for a remote."""
        return self.submit(Job(lambda engine, _cancel: fn(_require_local(engine)), description))

    def call_any(self, fn: Callable[[LoadedEngine], T], description: str = "call") -> Job[T]:
        """Queue a function that works on either kind of engine (`n_ctx`, `config`, `chat`)."""
        return self.submit(Job(lambda engine, _cancel: fn(_require(engine)), description))

    # ---- the worker thread -------------------------------------------------------------

    def _work(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                break
            self._run(job)
        self._unload()

    def _run(self, job: Job[Any]) -> None:
        if job.cancel_event.is_set():
            job.future.set_exception(JobCancelledError("The request was cancelled."))
            return
        if not job.future.set_running_or_notify_cancel():
            return
        self._busy = True
        try:
            job.future.set_result(job.run(self._engine, job.cancel_event))
        except BaseException as exc:  # the worker must survive whatever one job raises
            if not isinstance(exc, EngineError):
                log.exception("engine job %s failed", job.description)
            job.future.set_exception(exc)
        finally:
            self._busy = False

    def _cancel_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.cancel()
                job.future.set_exception(JobCancelledError("Hearthside is shutting down."))

    def _unload(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def _require(engine: LoadedEngine | None) -> LoadedEngine:
    if engine is None:
        raise EngineError("No model is loaded.", hint="Load a model first.")
    return engine


def _require_local(engine: LoadedEngine | None) -> Engine:
    loaded = _require(engine)
    if isinstance(loaded, RemoteEngine):
        raise EngineError(
            "This needs a model loaded on this computer; the current one runs on "
            f"{loaded.config.describe()}.",
            hint="Load a local model for this.",
        )
    return loaded
