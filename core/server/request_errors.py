"""`InvalidRequestError`: a request Hearthside understood but cannot serve as asked, naming
the field at fault, so the edge answers OpenAI's 400 with `param` and `code` set."""

from __future__ import annotations

from hearthside.core.errors import EngineError


class InvalidRequestError(EngineError):
    """A 400 `invalid_request_error` for `param`. An EngineError because some are raised on
    the engine thread (a token id checked against the vocabulary), where the service logs a
    traceback for anything else."""

    def __init__(self, message: str, *, param: str | None, code: str, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.param = param
        self.code = code
