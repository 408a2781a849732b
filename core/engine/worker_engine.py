"""`WorkerEngine`: an `Engine` that lives in a worker process of its own.

It offers what callers use of an Engine — chat and generate with streamed text and a cancel
event, tokenizing, the bench timings, speculative settings, the loaded config and load
report — and sends each call to the worker (core/engine/worker.py). When the worker dies,
every call in flight, and every later one, raises `EngineCrashedError` naming the signal and
carrying llama.cpp's last log lines of the work in flight (never those of earlier requests);
the app itself carries on.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, cast

from hearthside.core.engine.cancel import CancelEvent
from hearthside.core.engine.config import EngineConfig, SamplingParams, SpeculativeConfig
from hearthside.core.engine.engine import ChatMessage, Engine, GenerationResult, TextCallback
from hearthside.core.engine.load_report import LoadReport
from hearthside.core.engine.logprobs import LogprobsCallback, TokenLogprob
from hearthside.core.engine.metrics import SpeculationStats
from hearthside.core.engine.worker_protocol import FramedPipe, Snapshot
from hearthside.core.errors import (
    EngineCrashedAtLoadError,
    EngineCrashedError,
    EngineError,
    EngineKilledAtLoadError,
    EngineLoadError,
)
from hearthside.core.models.child_check import prefer_for_oom_kill
from hearthside.core.models.gguf_validator import GGUFInfo, validate_gguf

log = logging.getLogger(__name__)
native_log = logging.getLogger("hearthside.llama_cpp")
T = TypeVar("T")
CANCEL_POLL_S = 0.02  # how often a waiting call looks at a plain (not a CancelEvent) cancel event
_CANCELLED = ("cancelled",)  # put among a call's answers when its CancelEvent is set
CLOSE_TIMEOUT_S = 10.0
WATCHDOG_POLL_S = 0.5  # how often a waiting call checks that the worker still answers
NATIVE_LINES_KEPT = 40
NATIVE_LINES_SHOWN = 8
CRASH_WORDS = ("assert", "error", "failed", "aborted", "fatal")
SIGNAL_WORDS = {
    "SIGSEGV": "a segmentation fault",
    "SIGILL": "an instruction this CPU does not have",
    "SIGABRT": "llama.cpp aborted, e.g. a failed GGML_ASSERT",
    "SIGBUS": "a bad memory access, e.g. a model file that changed on disk",
    "SIGFPE": "an arithmetic fault",
    "SIGKILL": "killed, most often by the system for want of memory",
}


def describe_exit(returncode: int | None) -> str:
    """E.g. "SIGSEGV, a segmentation fault" or "exit status 3"."""
    if returncode is None:
        return "it stopped answering"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
        words = SIGNAL_WORDS.get(name)
        return f"{name}, {words}" if words else name
    return f"exit status {returncode}"


@dataclass(frozen=True)
class WorkerDeadlines:
    """How long the app waits for a worker before it kills it as frozen (seconds).

    The worker says "alive" every second from a thread of its own (llama.cpp releases the GIL
    while it computes), so `silence_s` without any frame means the process is stopped or
    stuck, whatever it was doing; `startup_s` covers the imports before it first speaks. A
    load must finish within `load_s` (a large model from a slow disk takes minutes); a
    generation must send its next piece within `next_frame_s` (a long prompt's prefill on a
    slow CPU is the longest wait with nothing to show).
    """

    silence_s: float = 30.0
    startup_s: float = 120.0
    load_s: float = 900.0
    next_frame_s: float = 600.0


class EngineUnresponsiveError(EngineCrashedError):
    """The worker stopped answering within its deadline; the app killed it (the service
    restarts it like a crashed one)."""


def _unresponsive(what: str) -> EngineUnresponsiveError:
    return EngineUnresponsiveError(
        f"The engine stopped responding ({what}), so Hearthside stopped it and is starting "
        "it again. Send the request again in a few seconds.",
        hint="If it keeps happening, the model may be too large for this computer: try a "
        "smaller context or a smaller model.",
        cause=what,
    )


# Every worker process this app started and has not seen end, so that a shutdown can end them
# all, including one still loading (its WorkerEngine does not exist yet).
_live_workers: set[subprocess.Popen[bytes]] = set()
_live_workers_lock = threading.Lock()
_exiting = threading.Event()  # set by kill_every_worker(for_good=True): no new workers


def kill_every_worker(*, for_good: bool = False) -> int:
    """SIGKILL every engine worker this process started that is still running (a shutdown
    that must not wait for them); returns how many were killed. `for_good`: the process is
    exiting, so no worker starts after this (a load killed here is not retried)."""
    with _live_workers_lock:
        if for_good:
            _exiting.set()
        running = [process for process in _live_workers if process.poll() is None]
        _live_workers.clear()
    for process in running:
        with contextlib.suppress(OSError):
            process.kill()
    return len(running)


class _Call:
    """One request waiting for its answer. Streamed text goes to `on_text` straight from the
    reading thread: one thread woken per token, not two, leaves the cores to llama.cpp."""

    def __init__(
        self, on_text: TextCallback | None, on_logprobs: LogprobsCallback | None = None
    ) -> None:
        self.on_text = on_text
        self.on_logprobs = on_logprobs
        self.answers: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.text_error: BaseException | None = None  # what on_text raised; the call fails
        # The most seconds without progress (an answer, or a piece of a streamed one) before
        # the worker counts as stuck; None: only the worker's silence counts.
        self.deadline_s: float | None = None
        self.doing = "a request"  # what the worker was doing, for the error
        self.progress_at = time.monotonic()

    def overdue(self, now: float) -> bool:
        return self.deadline_s is not None and now - self.progress_at > self.deadline_s

    def text(self, piece: str) -> bool:
        """Hand `piece` on; False when on_text raised (the request should stop)."""
        self.progress_at = time.monotonic()
        if self.on_text is None or self.text_error is not None:
            return self.text_error is None
        try:
            self.on_text(piece)
        except BaseException as exc:
            self.text_error = exc
            return False
        return True

    def logprobs(self, entries: tuple[TokenLogprob, ...]) -> bool:
        """Hand `entries` on, like `text`."""
        self.progress_at = time.monotonic()
        if self.on_logprobs is None or self.text_error is not None:
            return self.text_error is None
        try:
            self.on_logprobs(entries)
        except BaseException as exc:
            self.text_error = exc
            return False
        return True


class WorkerEngine:
    """A model loaded with `config` in a worker process; raises what an Engine would."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        verbose: bool = False,
        deadlines: WorkerDeadlines = WorkerDeadlines(),
    ) -> None:
        self._deadlines = deadlines
        self._heard_at: float | None = None  # when the worker last sent a frame
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        # llama.cpp's stderr lines, numbered; a crash quotes only those since `_job_first_line`,
        # the first line of the calls now in flight, never what earlier requests left (their
        # lines could quote another client's prompt, and they mislead).
        self._native_lines: collections.deque[tuple[int, str]] = collections.deque(
            maxlen=NATIVE_LINES_KEPT
        )
        self._native_lines_read = 0
        self._job_first_line = 0
        self._crash: EngineCrashedError | None = None
        self._closing = False
        self._live: SpeculationStats | None = None
        self.model_path = Path(config.model_path)
        self.model_info: GGUFInfo = validate_gguf(self.model_path)  # a bad file spawns nothing
        self._process = _start_worker()
        self._started_at = time.monotonic()
        assert self._process.stdin is not None and self._process.stdout is not None
        self._pipe = FramedPipe(
            cast(BinaryIO, self._process.stdout), cast(BinaryIO, self._process.stdin)
        )
        self._log_reader = _daemon(self._read_native_log, "worker-log")
        _daemon(self._read_answers, "worker-answers")  # last: it may end at once
        try:
            snapshot: Snapshot = self._request(
                ("load", config.to_dict(), verbose),
                deadline=(deadlines.load_s, f"loading {self.model_path.name}"),
            )
        except EngineUnresponsiveError:
            self.close()
            raise
        except EngineCrashedError as crash:
            self.close()
            raise _load_crash(config, crash) from None
        except BaseException:
            self.close()
            raise
        self._adopt(snapshot)

    def _adopt(self, snapshot: Snapshot) -> None:
        self.config: EngineConfig = snapshot.config
        self.n_ctx: int = snapshot.n_ctx
        self.n_vocab: int = snapshot.n_vocab
        self.load_report: LoadReport = snapshot.load_report

    # ---- what callers use of an Engine -------------------------------------------------

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def crash(self) -> EngineCrashedError | None:
        """Why the worker died, once it has."""
        return self._crash

    @property
    def alive(self) -> bool:
        return self._crash is None and self._process.poll() is None

    @property
    def parallel(self) -> int:
        """Requests the worker serves at the same time."""
        return self.config.n_parallel

    @property
    def draft(self) -> SpeculativeConfig | None:
        """The speculative settings in use, None when speculation is off."""
        return self.config.speculative if self.config.speculative.enabled else None

    @property
    def llama(self) -> Any:
        raise EngineError(
            "The model lives in the engine worker process.",
            hint="Measure it with WorkerEngine.run(function), which runs there.",
        )

    def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        on_logprobs: LogprobsCallback | None = None,
    ) -> GenerationResult:
        return self._streamed("chat", (list(messages), sampling), (on_text, on_logprobs), cancel)

    def generate(
        self,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
        started: float | None = None,
        reply: bool = False,
        on_logprobs: LogprobsCallback | None = None,
    ) -> GenerationResult:
        del started  # the worker's clock starts when it gets the request
        return self._streamed(
            "generate",
            (list(prompt_tokens), sampling),
            (on_text, on_logprobs),
            cancel,
            reply=reply,
        )

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        return self._method("tokenize", text, add_bos=add_bos)

    def tokenize_prompt(self, prompt: str) -> list[int]:
        return self._method("tokenize_prompt", prompt)

    def render_chat(self, messages: Sequence[ChatMessage]) -> str:
        return self._method("render_chat", list(messages))

    def token_text(self, token: int) -> bytes:
        return self._method("token_text", token)

    def is_end_of_generation(self, token: int) -> bool:
        return self._method("is_end_of_generation", token)

    def clear_cache(self) -> None:
        self._method("clear_cache")

    def time_prefill(self, tokens: Sequence[int]) -> float:
        return self._method("time_prefill", list(tokens))

    def time_decode(self, tokens: Sequence[int]) -> float:
        return self._method("time_decode", list(tokens))

    def set_speculative(self, speculative: SpeculativeConfig) -> None:
        self._adopt(self._method("set_speculative", speculative))

    @contextlib.contextmanager
    def speculation_paused(self) -> Iterator[None]:
        self._method("pause_speculation")
        try:
            yield
        finally:
            self._method("resume_speculation")

    def live_speculation(self) -> SpeculationStats | None:
        """Drafted/accepted so far in the reply being streamed, as the worker last said."""
        return self._live

    def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(engine, *args)` in the worker, holding its engine alone; `function` must
        be a module-level function (it travels by name) and its result must pickle."""
        return self._request(("run", function, args))

    def close(self) -> None:
        """Unload: the worker exits, and its memory goes back to the system."""
        if self._closing:
            return
        self._closing = True
        if self._process.poll() is None:
            with contextlib.suppress(OSError):
                self._pipe.send(("close", 0))
            try:
                self._process.wait(CLOSE_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("engine worker %s did not exit; killing it", self.pid)
                self._process.kill()
                self._process.wait()
        with _live_workers_lock:
            _live_workers.discard(self._process)
        self._pipe.close()
        self._fail_all(self._crash or EngineError("The model was unloaded."))

    def __del__(self) -> None:
        process = getattr(self, "_process", None)
        if process is not None and process.poll() is None:
            process.kill()

    # ---- requests ----------------------------------------------------------------------

    def _method(self, name: str, *args: Any, **kwargs: Any) -> Any:
        return self._request(("call", name, args, kwargs))

    def _streamed(
        self,
        method: str,
        args: tuple[Any, ...],
        callbacks: tuple[TextCallback | None, LogprobsCallback | None],
        cancel: threading.Event | None,
        **kwargs: Any,
    ) -> GenerationResult:
        self._live = None
        return self._request(
            ("stream", method, args, kwargs),
            call=_Call(*callbacks),
            cancel=cancel,
            deadline=(self._deadlines.next_frame_s, "no new text while generating"),
        )

    def _request(
        self,
        message: tuple[Any, ...],
        *,
        call: _Call | None = None,
        cancel: threading.Event | None = None,
        deadline: tuple[float, str] | None = None,
    ) -> Any:
        """Send `message` and wait for its answer; `deadline`: the most seconds without
        progress, and what the worker was doing (for the error if it passes)."""
        if self._crash is not None:
            raise self._crash
        if self._closing:
            raise EngineError("The model was unloaded.", hint="Load a model first.")
        request_id = next(self._ids)
        call = call or _Call(None)
        if deadline is not None:
            call.deadline_s, call.doing = deadline
        with self._calls_lock:
            self._start_job_if_idle()
            self._calls[request_id] = call
        try:
            self._send((message[0], request_id, *message[1:]))
            return self._wait(request_id, call, cancel)
        finally:
            with self._calls_lock:
                self._calls.pop(request_id, None)
                self._start_job_if_idle()

    def _start_job_if_idle(self) -> None:
        """With no call in flight, the log lines so far belong to finished work."""
        if not self._calls:
            self._job_first_line = self._native_lines_read

    def _send(self, message: tuple[Any, ...]) -> None:
        try:
            self._pipe.send(message)
        except (BrokenPipeError, OSError, ValueError):
            self._reader_done()  # the worker is gone; its exit explains why
            raise self._crash or EngineError("The engine worker is not running.") from None

    def _send_quietly(self, message: tuple[Any, ...]) -> None:
        """A message whose loss does not matter (a cancel to a worker that may have gone)."""
        with contextlib.suppress(OSError, ValueError):
            self._pipe.send(message)

    def _wait(self, request_id: int, call: _Call, cancel: threading.Event | None) -> Any:
        """The call's answer. A cancel is passed on to the worker once: told at once by a
        `CancelEvent`, found by polling a plain event."""
        forget = None
        if isinstance(cancel, CancelEvent):
            forget = cancel.when_set(lambda: call.answers.put(_CANCELLED))
        poll_s = CANCEL_POLL_S if cancel is not None and forget is None else WATCHDOG_POLL_S
        cancel_sent = False
        try:
            while True:
                answer: tuple[Any, ...] | None
                try:
                    answer = call.answers.get(timeout=poll_s)
                except queue.Empty:
                    self._kill_if_stuck(call)
                    answer = _CANCELLED if cancel is not None and cancel.is_set() else None
                if answer is None or answer is _CANCELLED:
                    if answer is _CANCELLED and not cancel_sent:
                        cancel_sent = True
                        self._send_quietly(("cancel", request_id))
                    continue
                if call.text_error is not None:
                    raise call.text_error
                if answer[0] == "result":
                    return answer[1]
                raise answer[1]
        finally:
            if forget is not None:
                forget()

    def _kill_if_stuck(self, call: _Call) -> None:
        """Past `call`'s deadline, or with the worker silent too long: kill it. The pipe
        closes, and every call in flight fails with the EngineUnresponsiveError set here."""
        if self._crash is not None or self._closing:
            return
        now = time.monotonic()
        if call.overdue(now):
            what = f"{call.doing}, nothing for {call.deadline_s:.3g} s"
        else:
            silence = self._silence(now)
            if silence is None:
                return
            what = silence
        self._crash = _unresponsive(what)
        log.error("engine worker %s killed: %s", self.pid, what)
        with contextlib.suppress(OSError):
            self._process.kill()

    def _silence(self, now: float) -> str | None:
        """Why the worker counts as frozen (no frame for too long), or None."""
        if self._heard_at is None:
            waited = now - self._started_at
            if waited > self._deadlines.startup_s:
                return f"it did not start within {waited:.0f} s"
            return None
        quiet = now - self._heard_at
        return f"no answer for {quiet:.0f} s" if quiet > self._deadlines.silence_s else None

    # ---- the reading threads ---------------------------------------------------------

    def _read_answers(self) -> None:
        try:
            while (message := self._pipe.receive()) is not None:
                self._heard_at = time.monotonic()
                kind, request_id = message[0], message[1]
                with self._calls_lock:
                    call = self._calls.get(request_id)
                if call is None:
                    continue
                if kind == "logprobs":
                    if not call.logprobs(message[2]):
                        self._send_quietly(("cancel", request_id))
                    continue
                if kind != "text":
                    call.answers.put((kind, *message[2:]))
                    continue
                self._live = message[3]
                if not call.text(message[2]):
                    self._send_quietly(("cancel", request_id))
        except (OSError, ValueError, EOFError) as exc:
            log.debug("engine worker pipe: %s", exc)
        except Exception:
            log.exception("reading the engine worker's answers")
        self._reader_done()

    def _read_native_log(self) -> None:
        assert self._process.stderr is not None
        for raw in self._process.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                self._native_lines.append((self._native_lines_read, line))
                self._native_lines_read += 1
                native_log.debug("%s", line)

    def _reader_done(self) -> None:
        """The worker's pipe closed: on purpose (close) or because it died."""
        if self._closing:
            return
        try:
            returncode = self._process.wait(CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            returncode = None
        self._log_reader.join(1.0)  # its last words
        if self._crash is None:
            self._crash = self._crash_error(returncode)
            if returncode == -signal.SIGTERM:  # asked to end (a tuning budget's deadline)
                log.warning("engine worker %s was stopped by SIGTERM", self.pid)
            else:
                log.error(
                    "engine worker %s died: %s; llama.cpp's last lines:\n%s",
                    self.pid,
                    self._crash.cause,
                    "\n".join(self._crash.native_lines[-NATIVE_LINES_SHOWN:]) or "(none)",
                )
        self._fail_all(self._crash)

    def _crash_error(self, returncode: int | None) -> EngineCrashedError:
        cause = describe_exit(returncode)
        first = self._job_first_line
        lines = tuple(line for number, line in self._native_lines if number >= first)
        last = _last_native_words(lines)
        return EngineCrashedError(
            f"The engine crashed ({cause})"
            + (f"; llama.cpp's last words: {last}" if last else "."),
            hint="Hearthside restarts it; the conversation is kept. If it keeps crashing, "
            "choose safer settings (no flash attention, f16 KV cache) or another build "
            "(`hearthside engine rebuild`).",
            cause=cause,
            native_lines=lines,
        )

    def _fail_all(self, error: EngineError) -> None:
        with self._calls_lock:
            calls = list(self._calls.values())
        for call in calls:
            call.answers.put(("error", error))


def _start_worker() -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with _live_workers_lock:
        if _exiting.is_set():
            raise EngineError("Hearthside is shutting down; the engine does not start now.")
        process = subprocess.Popen(
            [sys.executable, "-m", "hearthside.core.engine.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        ended = {worker for worker in _live_workers if worker.poll() is not None}
        _live_workers.difference_update(ended)
        _live_workers.add(process)
    # Its death is reported and it is restarted; the app's own would go unexplained.
    prefer_for_oom_kill(process.pid)
    return process


def _daemon(target: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _last_native_words(lines: Sequence[str]) -> str:
    """The line that most likely explains a crash: an assert or error, else the last line."""
    for line in reversed(lines[-NATIVE_LINES_SHOWN:]):
        lowered = line.lower()
        if any(word in lowered for word in CRASH_WORDS):
            return line.strip()
    return lines[-1].strip() if lines else ""


def _load_crash(config: EngineConfig, crash: EngineCrashedError) -> EngineLoadError:
    name = Path(config.model_path).name
    if crash.cause.startswith("SIGKILL"):
        message = (
            f"The engine was killed while loading {name} with a context of "
            f"{config.total_context} tokens: most likely there was not enough memory."
        )
    else:
        message = f"The engine crashed while loading {name} ({crash.cause})."
    error_class = (
        EngineKilledAtLoadError if crash.cause.startswith("SIGKILL") else EngineCrashedAtLoadError
    )
    return error_class(
        message,
        hint="Try a smaller context or fewer GPU layers; if it keeps crashing, run "
        "`hearthside engine selftest`.",
        cause=crash.cause,
        native_lines=crash.native_lines,
    )


LocalEngine = Engine | WorkerEngine  # a model on this computer, in this process or a worker


# What starts an engine for a config: `WorkerEngine` itself, or, in a test, something that
# makes a load fail the way a machine without the memory would.
EngineLoader = Callable[[EngineConfig], WorkerEngine]
