"""The typed errors every layer raises and every edge (CLI, GUI, API) shows.

Each error carries a plain message for the user and, where there is one, the next thing to
try. Messages never contain tracebacks or keys. `describe_error` is the one place that turns
any exception into words for the user: ours by their text, anything else by one sentence
naming the log file, where its traceback went.
"""

from __future__ import annotations

import logging

from hearthside.core.logs import setup_logging

log = logging.getLogger(__name__)


class HearthsideError(Exception):
    """Base of every error Hearthside shows to a user."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def user_text(self) -> str:
        """The message followed by what to do next, for a terminal or a dialog."""
        if self.hint:
            return f"{self.message}\n{self.hint}"
        return self.message


class ModelFileError(HearthsideError):
    """A model file is missing, unreadable or malformed."""


class ModelStoreError(HearthsideError):
    """The model registry cannot do what was asked (unknown id, duplicate, disk full...)."""


class EngineError(HearthsideError):
    """Base of errors raised by the inference engine."""


class EngineLoadError(EngineError):
    """The engine could not load a model (out of memory, unsupported file, bad settings)."""


class EngineOutOfMemoryError(EngineLoadError):
    """A load failed for want of memory: llama.cpp could not allocate a buffer (weights, KV
    cache, compute), or the OOM killer ended the worker while it loaded."""


class ContextOverflowError(EngineError):
    """The prompt (plus the requested reply) does not fit in the context window. The counts,
    when known, let the API word it as OpenAI does, which clients match."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        context_tokens: int | None = None,
        prompt_tokens: int | None = None,
        completion_tokens: int = 0,
    ) -> None:
        super().__init__(message, hint=hint)
        self.context_tokens = context_tokens
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens  # asked for; 0: none asked


class TemplateError(EngineError):
    """The model's chat template failed, was too slow or produced too much text."""


class QueueFullError(EngineError):
    """The engine's job queue is full; try again shortly."""


class JobCancelledError(EngineError):
    """A job was cancelled before it started."""


class EngineCrashedError(EngineError):
    """The engine's worker process died (a signal, an abort, the OOM killer) mid-job.

    `cause` names what ended it ("SIGSEGV, a segmentation fault"); `native_lines` are the last
    lines llama.cpp logged before it died, for the crash report.
    """

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        cause: str = "",
        native_lines: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, hint=hint)
        self.cause = cause
        self.native_lines = native_lines


class EngineCrashedAtLoadError(EngineCrashedError, EngineLoadError):
    """The worker died while loading the model: a load failure and a crash (the tuner
    remembers the settings as `crashed`)."""


class EngineKilledAtLoadError(EngineCrashedAtLoadError, EngineOutOfMemoryError):
    """The OOM killer (SIGKILL) ended the worker while it loaded: out of memory, retried
    smaller, remembered by the tuner as `oom`."""


def describe_error(error: BaseException) -> str:
    """What to tell the user about `error`.

    A HearthsideError is its message and hint. Anything else is a bug or a failure nobody
    foresaw: its traceback goes to the log file (set up here if the entry point has not done
    so yet, so the file named really holds it) and the user reads one sentence naming that file.
    """
    if isinstance(error, HearthsideError):
        return error.user_text()
    path = setup_logging()
    log.error("unexpected %s", type(error).__name__, exc_info=error)
    return f"Something went wrong ({type(error).__name__}). The details are in {path}."
