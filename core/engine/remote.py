"""`RemoteEngine`: chat through an OpenAI-compatible server someone already runs.

vLLM, llama.cpp's llama-server, llama-cpp-python's server, Ollama's `/v1` and Hearthside's own
API all speak the same protocol, so one client covers them. A `RemoteEngine` offers the part of
`Engine` that chat needs (`chat`, `n_ctx`, `close`) and `relay`, which passes an API request
through unchanged for the Local API's proxy mode. Like a local engine it is only used from
`EngineService`'s worker thread.

Cancelling closes the request's socket (a watcher thread shuts it down as soon as the job's
cancel event is set), so even a read blocked on a long remote prompt evaluation returns at
once. Connections are not kept alive, which guarantees that every request's socket is seen by
its own watcher.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import (
    ChatMessage,
    GenerationMetrics,
    GenerationResult,
    TextCallback,
)
from hearthside.core.errors import (
    ContextOverflowError,
    EngineError,
    HearthsideError,
    JobCancelledError,
)
from hearthside.core.server.keys import read_private_text

# Used for `n_ctx` when the server does not say (vLLM does; llama.cpp's and Ollama's don't).
# The server enforces its own limit; this only sizes context gauges in the interfaces.
DEFAULT_REMOTE_N_CTX = 4096
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
CANCEL_POLL_S = 0.05
MAX_SERVER_MESSAGE_CHARS = 300
RELAY_ROUTES = frozenset({"chat/completions", "completions", "embeddings"})
# Keys go in an HTTP header: printable ASCII, no spaces.
VALID_REMOTE_KEY = re.compile(r"[\x21-\x7e]{1,4096}")
_BEARER = re.compile(r"(?i)bearer\s++\S+")  # possessive: a long gap is scanned once
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
SseEvent = dict[str, Any]


class RemoteConfigError(HearthsideError):
    """A remote server's settings are unusable (bad address, missing key file, unknown name)."""


class RemoteServerError(EngineError):
    """The remote server could not be reached or refused the request.

    `client_status` is what the Local API answers its own client when it proxies this server.
    """

    def __init__(self, message: str, *, hint: str | None = None, client_status: int = 502) -> None:
        super().__init__(message, hint=hint)
        self.client_status = client_status


class _Cancelled(Exception):
    """The job's cancel event closed the connection."""


# ---- settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteConfig:
    """How to reach one model on an OpenAI-compatible server. Holds no secret: the key stays
    in its private file (`api_key_file`) and is read when the engine connects."""

    base_url: str  # normalised: scheme://host[:port]/path, "/v1" when no path was given
    model: str | None = None  # None: the first model the server lists
    api_key_file: str | None = None
    name: str | None = None  # the saved remote's name, for messages and hints
    timeout_s: float = DEFAULT_TIMEOUT_S  # longest wait for the next bytes of a reply
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    n_ctx: int | None = None  # the context the server reports; None when it doesn't say

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_url", normalise_base_url(self.base_url))
        if self.timeout_s <= 0 or self.connect_timeout_s <= 0:
            raise RemoteConfigError("Timeouts must be more than 0 seconds.")

    @property
    def model_path(self) -> str:
        """Stands where a local config names its file, so code that shows the loaded model's
        name (`Path(config.model_path).stem`) works for both kinds."""
        return f"remote:{self.name}" if self.name else f"remote:{urlsplit(self.base_url).netloc}"

    def describe(self) -> str:
        return f"the server at {self.base_url}"


def normalise_base_url(url: str) -> str:
    """`http(s)://host[:port][/path]` without a trailing slash; a bare host gets `/v1`."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RemoteConfigError(
            f"'{url}' is not a server address.",
            hint="Give it as http://HOST:PORT/v1 (or https://…).",
        )
    if parts.username or parts.password:
        raise RemoteConfigError(
            "The server address contains a user name or password.",
            hint="Leave credentials out of the address; store the key with --api-key-file.",
        )
    if parts.query or parts.fragment:
        raise RemoteConfigError(f"'{url}' has a query or fragment; give only scheme, host, path.")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def read_remote_key(config: RemoteConfig) -> str | None:
    """The key stored for `config`, or None when it has none."""
    if config.api_key_file is None:
        return None
    key = read_private_text(Path(config.api_key_file))
    key = key.strip() if key is not None else None
    if not key or not VALID_REMOTE_KEY.fullmatch(key):
        who = f"remote '{config.name}'" if config.name else config.base_url
        raise RemoteConfigError(
            f"The API key file for {who} is missing or damaged.",
            hint="Store the key again with `hearthside remote add NAME URL --api-key-file FILE "
            "--replace`.",
        )
    return key


# ---- models ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteModel:
    id: str
    owned_by: str | None = None
    context_length: int | None = None  # only when the server reports it


def fetch_models(config: RemoteConfig, *, api_key: str | None = None) -> list[RemoteModel]:
    """The models the server lists under `/models` (checks that it answers and takes the key).

    `api_key` is for a key not saved yet (testing a connection before saving it); without it
    the key comes from `config.api_key_file`.
    """
    key = api_key.strip() if api_key is not None else read_remote_key(config)
    with _RemoteClient(config, key or None) as client:
        return client.list_models()


# ---- the engine ------------------------------------------------------------------------------


class RemoteEngine:
    """One model on a remote server, used like a loaded `Engine` for chat."""

    def __init__(self, config: RemoteConfig) -> None:
        self._client = _RemoteClient(config, read_remote_key(config))
        try:
            self.models = tuple(self._client.list_models())
            chosen = _choose_model(config, self.models)
        except BaseException:
            self._client.close()
            raise
        self.config = replace(config, model=chosen.id, n_ctx=config.n_ctx or chosen.context_length)

    @property
    def model(self) -> str:
        return self.config.model or ""

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx or DEFAULT_REMOTE_N_CTX

    def close(self) -> None:
        self._client.close()

    def list_models(self) -> list[RemoteModel]:
        return self._client.list_models()

    def chat(
        self,
        messages: Sequence[ChatMessage],
        sampling: SamplingParams,
        *,
        on_text: TextCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> GenerationResult:
        """Stream the server's reply to `messages`; `on_text` gets each new piece of text."""
        if sampling.grammar is not None:
            raise EngineError(
                "Replies constrained by a grammar need a model loaded on this computer.",
                hint="Load a local model, or send the request through the Local API, which "
                "passes response_format and tools on to the server.",
            )
        cancel = cancel or threading.Event()
        tally = _ReplyTally(time.perf_counter(), on_text)
        body = _chat_body(self.model, messages, sampling)
        try:
            with self._client.exchange("chat/completions", body, cancel) as response:
                for event in self._client.events(response, cancel):
                    if "error" in event:
                        raise self._client.error_in_stream(event)
                    tally.take(event)
        except _Cancelled:
            tally.cancelled = True
        tally.cancelled = tally.cancelled or (cancel.is_set() and tally.finish_reason is None)
        return tally.result()

    def relay(
        self,
        route: str,
        body: dict[str, Any],
        *,
        on_event: Callable[[SseEvent], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> dict[str, Any] | None:
        """Send an OpenAI request body to the server as it is, for this engine's model.

        With `"stream": true` every event goes to `on_event` and None is returned; otherwise
        the server's JSON reply is. Raises JobCancelledError when `cancel` ended it.
        """
        if route not in RELAY_ROUTES:
            raise EngineError(f"Hearthside does not pass /{route} on to a remote server.")
        body = {**body, "model": self.model}
        cancel = cancel or threading.Event()
        try:
            with self._client.exchange(route, body, cancel) as response:
                if not body.get("stream"):
                    return self._client.json_reply(response)
                for event in self._client.events(response, cancel):
                    if "error" in event:
                        raise self._client.error_in_stream(event)
                    if on_event is not None:
                        on_event(event)
        except _Cancelled:
            pass
        if cancel.is_set():
            raise JobCancelledError("The request was cancelled.")
        return None


def _choose_model(config: RemoteConfig, models: Sequence[RemoteModel]) -> RemoteModel:
    if not models:
        raise RemoteServerError(
            f"{config.describe().capitalize()} serves no models.",
            hint="Load a model on that server first.",
        )
    if config.model is None:
        return models[0]
    for model in models:
        if model.id == config.model:
            return model
    served = ", ".join(model.id for model in models[:10])
    raise RemoteServerError(
        f"{config.describe().capitalize()} has no model named '{config.model}'. "
        f"It serves: {served}.",
        hint="Choose one of those with `hearthside remote add NAME URL --model ID --replace`.",
        client_status=404,
    )


def _chat_body(
    model: str, messages: Sequence[ChatMessage], sampling: SamplingParams
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "messages": [message.as_template_input() for message in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
    }
    # top_k and min_p are not OpenAI's, but vLLM, llama.cpp and Ollama all honour them.
    optional = {
        "max_tokens": sampling.max_tokens,
        "stop": list(sampling.stop) or None,
        "seed": sampling.seed,
        "presence_penalty": sampling.presence_penalty or None,
        "frequency_penalty": sampling.frequency_penalty or None,
        "top_k": sampling.top_k or None,
        "min_p": sampling.min_p or None,
    }
    body.update({key: value for key, value in optional.items() if value is not None})
    return body


# ---- HTTP ------------------------------------------------------------------------------------


class _RemoteClient:
    """HTTP to one server: requests, error translation, SSE parsing. Never logs the key."""

    def __init__(self, config: RemoteConfig, api_key: str | None) -> None:
        self.config = config
        self._api_key = api_key
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=config.base_url + "/",
            headers=headers,
            timeout=httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s),
            limits=httpx.Limits(max_keepalive_connections=0),
            trust_env=False,  # no proxy or .netrc picked up from the environment
        )

    def __enter__(self) -> _RemoteClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def list_models(self) -> list[RemoteModel]:
        with self._translated_errors("models", None):
            response = self._http.get("models")
            if response.status_code >= 400:
                raise self._status_error(response, "models")
            return _parse_models(self.json_reply(response), self.config)

    @contextlib.contextmanager
    def exchange(
        self, route: str, body: dict[str, Any], cancel: threading.Event | None
    ) -> Iterator[httpx.Response]:
        """POST `body` and yield the response once its status is known to be a success."""
        watch = _ConnectionWatch(cancel or threading.Event())
        with watch.running(), self._translated_errors(route, watch):
            request = self._http.build_request(
                "POST", route, json=body, extensions={"trace": watch.trace}
            )
            response = self._http.send(request, stream=True)
            try:
                if response.status_code >= 400:
                    response.read()
                    raise self._status_error(response, route)
                yield response
            finally:
                response.close()

    def json_reply(self, response: httpx.Response) -> dict[str, Any]:
        try:
            reply = json.loads(response.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            reply = None
        if not isinstance(reply, dict):
            raise self._malformed("a reply that is not a JSON object")
        return reply

    def events(self, response: httpx.Response, cancel: threading.Event) -> Iterator[SseEvent]:
        """The JSON payloads of a server-sent event stream, up to `[DONE]`."""
        for data in _sse_data(response.iter_lines()):
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                raise self._malformed("an event that is not JSON") from None
            if not isinstance(event, dict):
                raise self._malformed("an event that is not a JSON object")
            yield event
        if cancel.is_set():
            raise _Cancelled()
        raise RemoteServerError(
            f"{self._where()} ended its reply without finishing it.",
            hint="Look at the server's own log for the reason (llama-cpp-python's server does "
            "this when the prompt is longer than its context).",
        )

    def error_in_stream(self, event: SseEvent) -> RemoteServerError:
        message = self._server_message(event)
        return RemoteServerError(f"{self._where()} failed mid-reply: {message}")

    # ---- errors in plain words ---------------------------------------------------------

    @contextlib.contextmanager
    def _translated_errors(self, route: str, watch: _ConnectionWatch | None) -> Iterator[None]:
        try:
            yield
        except httpx.HTTPError as exc:
            if watch is not None and watch.tripped:
                raise _Cancelled() from None
            raise self._transport_error(exc, route) from None

    def _transport_error(self, exc: httpx.HTTPError, route: str) -> RemoteServerError:
        where = self._where()
        if isinstance(exc, httpx.ConnectTimeout):
            return RemoteServerError(
                f"{where} did not accept a connection within {self.config.connect_timeout_s:g} s.",
                hint="Check the address and that the server is up and reachable from here.",
                client_status=504,
            )
        if isinstance(exc, httpx.ConnectError):
            return RemoteServerError(
                f"{where} isn't answering — is it running?",
                hint="Start the server, or check its address with `hearthside remote list`.",
            )
        if isinstance(exc, httpx.TimeoutException):
            return RemoteServerError(
                f"{where} stopped answering: nothing came back for "
                f"{self.config.timeout_s:g} s (/{route}).",
                hint="The server may be overloaded; try again, or raise the remote's timeout.",
                client_status=504,
            )
        if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
            return RemoteServerError(
                f"{where} closed the connection before its reply was complete.",
                hint="Look at the server's own log for the reason.",
            )
        return RemoteServerError(f"{where} could not be reached ({type(exc).__name__}).")

    def _status_error(self, response: httpx.Response, route: str) -> HearthsideError:
        status = response.status_code
        payload = _json_or_none(response)
        message = self._server_message(payload, fallback=response.text)
        where = self._where()
        if status in (401, 403):
            hint = (
                "Store the right key with `hearthside remote add NAME URL --api-key-file FILE "
                "--replace`."
                if self._api_key
                else "It wants an API key: add one with `hearthside remote add NAME URL "
                "--api-key-file FILE --replace`."
            )
            return RemoteServerError(f"{where} rejected the key (HTTP {status}).", hint=hint)
        if status == 404:
            model = f" (model '{self.config.model}')" if self.config.model else ""
            return RemoteServerError(
                f"{where} answered 'not found' for /{route}{model}: {message}",
                hint="List what it serves with `hearthside remote models NAME`; OpenAI-compatible "
                "servers answer under /v1 (Ollama: http://HOST:11434/v1).",
                client_status=404,
            )
        if _error_code(payload) == "context_length_exceeded":
            return ContextOverflowError(f"{where} says the request is too long: {message}")
        if status < 500:
            return RemoteServerError(
                f"{where} refused the request (HTTP {status}): {message}", client_status=status
            )
        return RemoteServerError(
            f"{where} failed (HTTP {status}): {message}",
            hint="Look at the server's own log for the reason.",
        )

    def _malformed(self, what: str) -> RemoteServerError:
        return RemoteServerError(
            f"{self._where()} sent {what}; Hearthside cannot read it.",
            hint="Check that the address points at an OpenAI-compatible API (…/v1).",
        )

    def _where(self) -> str:
        return f"The server at {self.config.base_url}"

    def _server_message(self, payload: Any, fallback: str = "") -> str:
        """The server's own words about an error, without control characters or our key."""
        text = _message_in(payload) or fallback or "no details"
        if self._api_key:
            text = text.replace(self._api_key, "•••")
        text = _BEARER.sub("Bearer •••", _CONTROL.sub(" ", text)).strip()
        if len(text) > MAX_SERVER_MESSAGE_CHARS:
            text = text[: MAX_SERVER_MESSAGE_CHARS - 1] + "…"
        return text


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


def _message_in(payload: Any) -> str | None:
    """OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, or Ollama's {"error": "..."}."""
    if not isinstance(payload, dict):
        return None
    error = payload.get("error")
    if isinstance(error, dict):
        error = error.get("message")
    for candidate in (error, payload.get("detail"), payload.get("message")):
        if isinstance(candidate, str) and candidate:
            return candidate
    return None


def _error_code(payload: Any) -> str | None:
    error = payload.get("error") if isinstance(payload, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code if isinstance(code, str) else None


def _parse_models(reply: dict[str, Any], config: RemoteConfig) -> list[RemoteModel]:
    cards = reply.get("data")
    if not isinstance(cards, list):
        raise RemoteServerError(
            f"{config.describe().capitalize()} did not send a model list.",
            hint="Check that the address points at an OpenAI-compatible API (…/v1).",
        )
    return [_model_from_card(card) for card in cards if isinstance(card, dict) and card.get("id")]


def _model_from_card(card: dict[str, Any]) -> RemoteModel:
    context = None
    for key in ("max_model_len", "context_length", "context_window"):  # vLLM, others
        value = card.get(key)
        if isinstance(value, int) and value > 0:
            context = value
            break
    owner = card.get("owned_by")
    return RemoteModel(str(card["id"]), owner if isinstance(owner, str) else None, context)


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each message event; comments, pings and other named events are skipped."""
    data: list[str] = []
    event_name = ""
    for line in lines:
        if not line:
            if data and event_name in ("", "message"):
                yield "\n".join(data)
            data, event_name = [], ""
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            event_name = value
    if data and event_name in ("", "message"):
        yield "\n".join(data)


class _ConnectionWatch:
    """Shuts the request's socket down as soon as the cancel event is set, so a read blocked
    on the server (a long prompt evaluation, a slow first token) returns at once."""

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._finished = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.tripped = False

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        if self._cancel.is_set():
            raise _Cancelled()
        thread = threading.Thread(target=self._watch, name="hearthside-remote-cancel", daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._finished.set()  # the thread ends within one poll; no need to wait for it

    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpx's trace hook: remember each socket this request connects."""
        if not (event.startswith("connection.connect_") and event.endswith(".complete")):
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            if self.tripped:
                _shut(sock)

    def _watch(self) -> None:
        while not self._finished.is_set():
            if self._cancel.wait(CANCEL_POLL_S):
                with self._lock:
                    if self._finished.is_set():
                        return
                    self.tripped = True
                    for sock in self._sockets:
                        _shut(sock)
                return


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# ---- metrics ---------------------------------------------------------------------------------


@dataclass
class _ReplyTally:
    """Collects a streamed reply and times it the way the local engine does."""

    started: float
    on_text: TextCallback | None
    pieces: list[str] = field(default_factory=list)
    first_piece_at: float | None = None
    last_piece_at: float | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False

    def take(self, event: SseEvent) -> None:
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict):
                self._take_choice(choice)

    def _take_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else None
        if isinstance(piece, str) and piece:
            now = time.perf_counter()
            self.first_piece_at = self.first_piece_at or now
            self.last_piece_at = now
            self.pieces.append(piece)
            if self.on_text is not None:
                self.on_text(piece)
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason

    def result(self) -> GenerationResult:
        return GenerationResult(text="".join(self.pieces), metrics=self._metrics())

    def _metrics(self) -> GenerationMetrics:
        ended = time.perf_counter()
        prompt = _usage_int(self.usage, "prompt_tokens")
        details = self.usage.get("prompt_tokens_details")
        cached = _usage_int(details, "cached_tokens") if isinstance(details, dict) else 0
        completion = _usage_int(self.usage, "completion_tokens") or len(self.pieces)
        ttft = self.first_piece_at - self.started if self.first_piece_at else None
        return GenerationMetrics(
            prompt_tokens=prompt,
            prompt_tokens_evaluated=max(prompt - cached, 0),
            completion_tokens=completion,
            ttft_s=ttft,
            prompt_tok_s=(prompt - cached) / ttft if ttft and prompt > cached else None,
            decode_tok_s=self._decode_tok_s(completion),
            total_s=ended - self.started,
            stop_reason=self._stop_reason(),
        )

    def _decode_tok_s(self, completion: int) -> float | None:
        if self.first_piece_at is None or self.last_piece_at is None or completion < 2:
            return None
        span = self.last_piece_at - self.first_piece_at
        return (completion - 1) / span if span > 0 else None

    def _stop_reason(self) -> str:
        if self.cancelled:
            return "cancelled"
        return "length" if self.finish_reason == "length" else "stop"


def _usage_int(usage: dict[str, Any], key: str) -> int:
    value = usage.get(key)
    return value if isinstance(value, int) and value >= 0 else 0
