"""Telling a client that its request waited for a model to load.

A model unloaded while idle, or one a request names that is not loaded yet, is loaded before
the request is answered: the request waits (a stream's first chunk comes once the model is
ready) rather than failing. The answer then carries two headers, and the window's request log
shows the load:

    X-Hearthside-Loaded-Model: smollm2-135m
    X-Hearthside-Load-Wait-S: 1.42

`model_for_request` picks the request's model from the pool and notes a load in the request's
ASGI state; `ModelLoadHeaders` adds the headers when the answer starts.
"""

from __future__ import annotations

from fastapi import Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hearthside.core.server.model_pool import ModelPool, ServedModel

LOADED_MODEL_HEADER = "X-Hearthside-Loaded-Model"
LOAD_WAIT_HEADER = "X-Hearthside-Load-Wait-S"
_STATE_KEY = "hearthside_model_load"  # in the request's ASGI state: (model id, seconds)


async def model_for_request(pool: ModelPool, name: str | None, request: Request) -> ServedModel:
    """The model that answers `request` (held: release it), loaded first when it was not;
    off the event loop, since a load takes seconds."""
    model = await run_in_threadpool(pool.model_for, name)
    if model.loaded_s is not None:
        request.scope.setdefault("state", {})[_STATE_KEY] = (model.id, model.loaded_s)
    return model


class ModelLoadHeaders:
    """Adds the load headers to an answer whose request waited for a model to load."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            load = scope.get("state", {}).get(_STATE_KEY)
            if message["type"] == "http.response.start" and load is not None:
                model_id, waited_s = load
                headers = MutableHeaders(scope=message)
                headers[LOADED_MODEL_HEADER] = _header_safe(model_id)
                headers[LOAD_WAIT_HEADER] = f"{waited_s:.2f}"
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _header_safe(text: str) -> str:
    """Printable ASCII only: a header value cannot hold anything else."""
    return "".join(ch if " " <= ch <= "~" else "?" for ch in text)[:200]
