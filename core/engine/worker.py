"""The engine worker process: one loaded `Engine`, driven over frames on its stdin/stdout.

`WorkerEngine` starts it as `python -m hearthside.core.engine.worker`. Whatever kills it — a
SIGSEGV in a ggml kernel, a GGML_ASSERT abort, the OOM killer — ends only this process; the
app hears the pipe close and says what happened. llama.cpp's log lines go to stderr, which
the app keeps, so a crash report can show the last ones.

Requests run on threads of their own: a generation on an engine with several slots runs beside
the others (the engine's scheduler batches them); anything else holds the engine alone.

The worker lives only as long as the app wants it: it says "alive" every HEARTBEAT_S (the app
kills a worker that goes quiet, core/engine/worker_engine.py), ignores the terminal's Ctrl-C
(the app decides when it ends), and exits at once when its stdin closes without a "close":
the app has gone, so whatever it is doing (a load that takes minutes) is for nobody.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.engine.logprobs import TokenLogprob
from hearthside.core.engine.worker_protocol import FramedPipe, Snapshot
from hearthside.core.errors import EngineError

# Methods that only read the vocabulary or the template: safe beside a running generation.
READ_ONLY_METHODS = frozenset(
    {"tokenize", "tokenize_prompt", "render_chat", "token_text", "is_end_of_generation"}
)
STREAMED_METHODS = frozenset({"chat", "generate"})
CALLABLE_METHODS = READ_ONLY_METHODS | {
    "clear_cache",
    "set_speculative",
    "time_prefill",
    "time_decode",
    "pause_speculation",
    "resume_speculation",
}
MAX_REQUEST_THREADS = 80  # every slot (at most 64) plus calls waiting their turn
# Text pieces that come closer together than this go back in one frame: the app process then
# wakes once for a few fast tokens instead of once per token (on two cores each wake-up costs
# decode speed). A piece waits at most until the next one, and nobody reads 20 ms.
COALESCE_S = 0.02
HEARTBEAT_S = 1.0  # the app allows WorkerDeadlines.silence_s (30 s) of silence
EXIT_APP_GONE = 3  # the exit status of a worker whose app went away without saying "close"


class _EngineLock:
    """Generations share the engine when it has several slots; everything else has it alone."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._shared = 0
        self._exclusive = False

    def acquire(self, shared: bool) -> None:
        with self._condition:
            if shared:
                self._condition.wait_for(lambda: not self._exclusive)
                self._shared += 1
            else:
                self._condition.wait_for(lambda: not self._exclusive and self._shared == 0)
                self._exclusive = True

    def release(self, shared: bool) -> None:
        with self._condition:
            if shared:
                self._shared -= 1
            else:
                self._exclusive = False
            self._condition.notify_all()


class Worker:
    """Reads requests, runs each on a thread, sends back text, results and errors."""

    def __init__(self, pipe: FramedPipe) -> None:
        self._pipe = pipe
        self._engine: Engine | None = None
        self._lock = _EngineLock()
        self._cancels: dict[int, threading.Event] = {}
        self._cancels_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(MAX_REQUEST_THREADS, thread_name_prefix="request")
        # Work that has the engine alone runs on this one thread, whichever request thread
        # asked: OpenMP gives every thread that calls llama.cpp its own team of threads, and
        # a finished team's threads spin on while the next one works. Two teams taking turns
        # on two cores made decode 4-5x slower, from the ~30th call of a worker on.
        self._engine_thread = ThreadPoolExecutor(1, thread_name_prefix="engine")
        self._paused: list[Any] = []  # a speculation_paused() context left open by the app

    def serve(self) -> bool:
        """Answer requests until "close" (True) or until the app's end of the pipe closes
        (False: the app has gone; the caller exits without waiting for the engine)."""
        while (message := self._pipe.receive()) is not None:
            kind, request_id = message[0], message[1]
            if kind == "close":
                self._close()
                return True
            if kind == "cancel":
                self._cancel(request_id)
                continue
            event = threading.Event()
            with self._cancels_lock:
                self._cancels[request_id] = event
            self._pool.submit(self._answer, message, event)
        return False

    def _close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for event in list(self._cancels.values()):
            event.set()
        self._engine_thread.submit(self._close_engine).result()
        self._engine_thread.shutdown()

    def _cancel(self, request_id: int) -> None:
        with self._cancels_lock:
            event = self._cancels.get(request_id)
        if event is not None:
            event.set()

    def _answer(self, message: tuple[Any, ...], cancel: threading.Event) -> None:
        kind, request_id = message[0], message[1]
        try:
            value = self._handle(kind, request_id, message[2:], cancel)
        except BaseException as exc:  # every failure goes back to the app
            self._send_error(request_id, exc)
        else:
            self._send_result(request_id, value)
        finally:
            with self._cancels_lock:
                self._cancels.pop(request_id, None)

    def _handle(
        self, kind: str, request_id: int, body: tuple[Any, ...], cancel: threading.Event
    ) -> Any:
        if kind == "load":
            return self._load(EngineConfig.from_dict(body[0]), verbose=body[1])
        engine = self._require_engine()
        if kind == "stream":
            return self._stream(engine, request_id, body, cancel)
        if kind == "call":
            return self._call(engine, *body)
        if kind == "run":
            function, args = body
            return self._holding(False, lambda: function(engine, *args))
        raise EngineError(f"The engine worker does not know the request {kind!r}.")

    def _load(self, config: EngineConfig, *, verbose: bool) -> Snapshot:
        def load() -> Snapshot:
            self._close_engine()
            # Its callbacks only write frames to the pipe: the scheduler may call them itself.
            self._engine = Engine(config, verbose=verbose, quick_callbacks=True)
            return snapshot_of(self._engine)

        return self._holding(False, load)

    def _stream(
        self, engine: Engine, request_id: int, body: tuple[Any, ...], cancel: threading.Event
    ) -> Any:
        method, args, kwargs = body
        if method not in STREAMED_METHODS:
            raise EngineError(f"{method!r} is not a streamed engine method.")

        text = _PendingText(
            lambda piece: self._send(("text", request_id, piece, engine.live_speculation()))
        )

        def on_logprobs(entries: tuple[TokenLogprob, ...]) -> None:
            text.flush()  # entries go ahead of their own token's text, after the earlier ones'
            self._send(("logprobs", request_id, entries))

        def run() -> Any:
            try:
                return getattr(engine, method)(
                    *args, **kwargs, on_text=text.add, cancel=cancel, on_logprobs=on_logprobs
                )
            finally:
                text.flush()

        return self._holding(engine.config.n_parallel > 1, run)

    def _call(
        self, engine: Engine, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if method not in CALLABLE_METHODS:
            raise EngineError(f"{method!r} is not an engine method the app may call.")
        if method in READ_ONLY_METHODS:
            return getattr(engine, method)(*args, **kwargs)
        if method == "pause_speculation":
            return self._holding(False, lambda: self._pause(engine))
        if method == "resume_speculation":
            return self._holding(False, self._resume)
        result = self._holding(False, lambda: getattr(engine, method)(*args, **kwargs))
        return snapshot_of(engine) if method == "set_speculative" else result

    def _pause(self, engine: Engine) -> None:
        context = engine.speculation_paused()
        context.__enter__()
        self._paused.append(context)

    def _resume(self) -> None:
        if self._paused:
            self._paused.pop().__exit__(None, None, None)

    def _holding(self, shared: bool, work: Callable[[], Any]) -> Any:
        """`work` with the engine shared (on the request's thread: the engine's batch
        scheduler runs llama.cpp for all of them) or alone (on the engine thread)."""
        self._lock.acquire(shared)
        try:
            return work() if shared else self._engine_thread.submit(work).result()
        finally:
            self._lock.release(shared)

    def _require_engine(self) -> Engine:
        if self._engine is None:
            raise EngineError("No model is loaded in the engine worker.")
        return self._engine

    def _close_engine(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None

    def _send(self, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError):  # the app has gone: nobody to tell
            self._pipe.send(message)

    def _send_result(self, request_id: int, value: Any) -> None:
        try:
            self._pipe.send(("result", request_id, value))
        except (BrokenPipeError, OSError):
            pass
        except Exception as exc:  # a result that does not pickle is a bug: say so
            self._send_error(request_id, exc)

    def _send_error(self, request_id: int, exc: BaseException) -> None:
        try:
            self._pipe.send(("error", request_id, exc))
        except (BrokenPipeError, OSError):
            pass
        except Exception:  # an error that does not pickle goes back as words
            log.exception("request %s failed", request_id)
            self._send(("error", request_id, EngineError(f"The engine failed: {exc}")))


class _PendingText:
    """One streamed reply's text on its way to the pipe: a piece goes at once unless the last
    frame went less than COALESCE_S ago; then it waits to go with the next (or the last)."""

    def __init__(self, send: Callable[[str], None]) -> None:
        self._send = send
        self._pieces: list[str] = []
        self._sent_at = float("-inf")

    def add(self, piece: str) -> None:
        self._pieces.append(piece)
        if time.monotonic() - self._sent_at >= COALESCE_S:
            self.flush()

    def flush(self) -> None:
        if self._pieces:
            pieces, self._pieces = self._pieces, []
            self._sent_at = time.monotonic()
            self._send("".join(pieces))


log = logging.getLogger("hearthside.worker")


def snapshot_of(engine: Engine) -> Snapshot:
    return Snapshot(engine.config, engine.n_ctx, engine.n_vocab, engine.load_report)


def _log_to_stderr() -> None:
    """llama.cpp's lines (see native_log) and our own warnings, one per line, for the app."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("hearthside.llama_cpp").setLevel(logging.DEBUG)


def _say_alive(pipe: FramedPipe) -> None:
    """A frame every HEARTBEAT_S, from its own thread: llama.cpp releases the GIL while it
    computes, so only a frozen or stopped process misses them."""
    while True:
        time.sleep(HEARTBEAT_S)
        try:
            pipe.send(("alive", 0))
        except (OSError, ValueError):
            return


def main() -> int:
    # Ctrl-C in a terminal reaches the whole process group: the app, not this worker, decides
    # when it ends (a worker that died of it would be restarted by the app as it shuts down).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    frames_out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)  # native code that prints must not write into the frames
    _log_to_stderr()
    pipe = FramedPipe(sys.stdin.buffer, frames_out)
    threading.Thread(target=_say_alive, args=(pipe,), name="alive", daemon=True).start()
    if not Worker(pipe).serve():
        # PR_SET_PDEATHSIG would not do here: it fires when the *thread* that started the
        # worker ends, and the app starts workers on short-lived job threads.
        os._exit(EXIT_APP_GONE)  # not waiting for a load or a reply nobody will read
    pipe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
