"""`EngineBridge`: the window's side of the EngineService, as Qt signals.

The engine thread never touches a widget. It appends each new piece of text to a buffer under
a lock; a timer on the GUI thread drains that buffer every `flush_interval_ms` and emits one
`text_flushed` with everything that arrived meanwhile (STYLE.md practice 11), so the view
updates ~25 times a second however fast the model is. A finished job hops to the GUI thread
through a queued signal. Stopping is the job's own cancel event, checked between tokens.

When the engine worker crashes, the service restarts it by itself and tells its listeners,
on a service thread: the bridge logs the crash (app/engine_crash.py) and relays each
`EngineNotice` to the GUI thread as `engine_notice`; after "restart_failed" no model is loaded.

The model may also be a remote server (a `RemoteConfig`): the service then holds a
`RemoteEngine` and everything here works the same. The engine modules are imported for types
only: the window exists (and is shown) before the engine module is imported.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal, Slot

from hearthside.app.engine_crash import log_crash
from hearthside.core.errors import EngineCrashedError, EngineError

if TYPE_CHECKING:
    from hearthside.core.engine.config import EngineConfig, SamplingParams
    from hearthside.core.engine.engine import ChatMessage, GenerationResult
    from hearthside.core.engine.remote import RemoteConfig
    from hearthside.core.engine.service import EngineNotice, EngineService, Job, LoadedEngine

DEFAULT_FLUSH_INTERVAL_MS = 40


@dataclass(frozen=True)
class LoadedModel:
    """What the window shows about the loaded model. For a remote server `config` is the
    connected `RemoteConfig` (its model and context filled in from what the server said)."""

    config: EngineConfig | RemoteConfig
    n_ctx: int  # the real context llama.cpp allocated (it pads the requested one)
    name: str
    model_id: str | None = None  # the registry id; None for an unregistered file or a remote

    @property
    def is_remote(self) -> bool:
        from hearthside.core.engine.remote import RemoteConfig  # loaded with the engine

        return isinstance(self.config, RemoteConfig)


class _TextBuffer:
    """Text written by the engine thread, taken by the GUI thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pieces: list[str] = []

    def append(self, piece: str) -> None:
        with self._lock:
            self._pieces.append(piece)

    def take(self) -> str:
        with self._lock:
            pieces, self._pieces = self._pieces, []
        return "".join(pieces)


class EngineBridge(QObject):
    """Loads models and streams replies through one EngineService, one reply at a time."""

    load_started = Signal(str)  # the model's display name
    load_finished = Signal(object)  # LoadedModel
    load_failed = Signal(object)  # Exception
    load_retried = Signal(str)  # why the model is being loaded again with smaller settings
    reply_started = Signal()
    text_flushed = Signal(str)  # the text that arrived since the last flush
    speculation_live = Signal(object)  # SpeculationStats of the running reply, when they change
    reply_finished = Signal(object)  # GenerationResult (stop_reason "cancelled" when stopped)
    reply_failed = Signal(object)  # Exception
    unloaded_idle = Signal(object)  # LoadedModel: unloaded for being idle; `wake` loads it
    engine_notice = Signal(object)  # EngineNotice: the worker crashed, restarted, or could not
    _job_done = Signal(object)  # the finished Job, sent from the engine thread
    _notice_posted = Signal(object)  # EngineNotice, sent from a service thread

    def __init__(
        self,
        service: EngineService | None,
        *,
        flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._service: EngineService | None = None
        self._buffer = _TextBuffer()
        self._flush_timer = QTimer(self)
        self._flush_timer.setInterval(flush_interval_ms)
        self._flush_timer.timeout.connect(self._flush)
        self._reply: Job[GenerationResult] | None = None
        self._load: Job[Any] | None = None
        self._loaded: LoadedModel | None = None
        self._asleep: LoadedModel | None = None  # unloaded for being idle, until a load succeeds
        # Queued even when the job finishes on this thread: listeners always hear of a job
        # after the call that started it has returned.
        self._job_done.connect(self._on_job_done, Qt.ConnectionType.QueuedConnection)
        self._notice_posted.connect(self._relay_notice, Qt.ConnectionType.QueuedConnection)
        self._logged_crash: EngineCrashedError | None = None
        if service is not None:
            self.attach_service(service)

    # ---- state -------------------------------------------------------------------------

    @property
    def service(self) -> EngineService:
        if self._service is None:
            raise EngineError(
                "The engine is still starting.", hint="Wait a moment, then try again."
            )
        return self._service

    def attach_service(self, service: EngineService) -> None:
        """The service to use from now on (the app starts it after the window is shown)."""
        if service is self._service:
            return
        self._service = service
        service.add_listener(self._on_service_notice)

    @property
    def has_service(self) -> bool:
        return self._service is not None

    @property
    def generating(self) -> bool:
        return self._reply is not None

    @property
    def loading(self) -> bool:
        return self._load is not None

    @property
    def loaded_model(self) -> LoadedModel | None:
        return self._loaded

    @property
    def asleep(self) -> LoadedModel | None:
        """The model `unload_idle` unloaded, which `wake` loads again; None otherwise."""
        return self._asleep

    # ---- commands ----------------------------------------------------------------------

    def load(
        self,
        config: EngineConfig | RemoteConfig,
        name: str | None = None,
        model_id: str | None = None,
    ) -> None:
        """Load `config`'s model, or connect to its remote server (after any reply already
        queued); raises QueueFullError."""
        if self._load is not None:
            raise EngineError(
                "A model is already loading.", hint="Wait until it is ready, then try again."
            )
        self.stop()
        self._loaded = None
        name = name or Path(config.model_path).stem
        # emitted on the engine thread; Qt queues it to the window's
        load_job = self.service.load(config, on_retry=self.load_retried.emit)

        def describe(engine: LoadedEngine) -> LoadedModel:
            # As loaded: a remote's names the model it chose and the server's context; a local
            # one's may be smaller than asked, when llama.cpp could not allocate that.
            return LoadedModel(engine.config, engine.n_ctx, name, model_id)

        try:
            self._load = self.service.call_any(describe, "describe the loaded model")
        except EngineError:
            load_job.cancel()  # no one would hear of it
            raise
        self.load_started.emit(name)
        self._notify_when_done(self._load, load_job)

    def unload_idle(self) -> bool:
        """Unload the local model to free its memory, remembering it for `wake`; False (and
        nothing done) while a reply or a load runs, or when the model is a remote one."""
        loaded = self._loaded
        if loaded is None or loaded.is_remote or self._reply is not None or self._load:
            return False
        self._loaded, self._asleep = None, loaded
        self.service.unload()
        self.unloaded_idle.emit(loaded)
        return True

    def wake(self) -> None:
        """Load the model `unload_idle` unloaded, with the settings it had."""
        asleep = self._asleep
        if asleep is not None and self._load is None:
            self.load(asleep.config, asleep.name, asleep.model_id)

    def send(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> None:
        """Queue a reply to `messages`; raises a HearthsideError when it cannot be queued."""
        if self._reply is not None:
            raise EngineError("A reply is still being written.", hint="Stop it or wait for it.")
        if self._loaded is None:
            raise EngineError(
                "No model is ready yet.", hint="Wait until the model has loaded, then send again."
            )
        self._buffer.take()
        self._reply = self.service.chat(messages, sampling, on_text=self._buffer.append)
        self._flush_timer.start()
        self.reply_started.emit()
        self._notify_when_done(self._reply)

    def stop(self) -> None:
        """Stop the reply being written (within one token); its text so far is kept."""
        if self._reply is not None:
            self._reply.cancel()

    def wait_for_reply(self, timeout_s: float) -> GenerationResult | None:
        """Block until the reply being written ends (for shutdown); None if it failed."""
        job = self._reply
        if job is None:
            return None
        try:
            return job.result(timeout_s)
        except Exception:  # a failed or timed-out reply has nothing more to save
            return None

    # ---- plumbing ----------------------------------------------------------------------

    def _on_service_notice(self, notice: EngineNotice) -> None:
        """On the service's thread: log the crash once (its notices share it), then hop over."""
        crash = notice.crash
        if crash is not None and crash is not self._logged_crash:
            self._logged_crash = crash
            log_crash(crash)
        self._notice_posted.emit(notice)

    @Slot(object)
    def _relay_notice(self, notice: EngineNotice) -> None:
        if notice.kind == "restart_failed":
            self._loaded = None  # the service holds no engine now
        self.engine_notice.emit(notice)

    def _notify_when_done(self, job: Job[Any], *first: Job[Any]) -> None:
        # `first` are earlier jobs whose failure explains this one's (a load before its describe).
        job.future.add_done_callback(lambda _future: self._job_done.emit((job, first)))

    @Slot()
    def _flush(self) -> None:
        text = self._buffer.take()
        if text:
            self.text_flushed.emit(text)
            self._report_speculation()

    def _report_speculation(self) -> None:
        stats = self._service.live_speculation() if self._service is not None else None
        if stats is not None and stats.drafted:
            self.speculation_live.emit(stats)

    @Slot(object)
    def _on_job_done(self, done: tuple[Job[Any], tuple[Job[Any], ...]]) -> None:
        job, first = done
        if job is self._reply:
            self._finish_reply(job)
        elif job is self._load:
            self._finish_load(job, first)

    def _finish_reply(self, job: Job[GenerationResult]) -> None:
        self._flush_timer.stop()
        self._flush()
        self._reply = None
        error = job.future.exception()
        if error is not None:
            self.reply_failed.emit(error)
        else:
            self.reply_finished.emit(job.future.result())

    def _finish_load(self, job: Job[LoadedModel], first: tuple[Job[Any], ...]) -> None:
        self._load = None
        error = next((e for e in map(_exception, (*first, job)) if e is not None), None)
        if error is not None:
            self.load_failed.emit(error)
            return
        self._loaded, self._asleep = job.future.result(), None
        self.load_finished.emit(self._loaded)


def _exception(job: Job[Any]) -> BaseException | None:
    future: Future[Any] = job.future
    return future.exception() if future.done() else None
