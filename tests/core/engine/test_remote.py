"""`RemoteEngine` through `EngineService`, against real servers in their own processes:
llama-cpp-python's server on the default model, and Hearthside's own `hearthside serve`.
Error cases that a healthy server never produces (broken streams, a server that echoes the
key, one that never answers) come from small real servers on loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from hearthside.core.engine.config import SamplingParams
from hearthside.core.engine.engine import ChatMessage, GenerationResult
from hearthside.core.engine.remote import (
    DEFAULT_REMOTE_N_CTX,
    RemoteConfig,
    RemoteConfigError,
    RemoteEngine,
    RemoteServerError,
    fetch_models,
)
from hearthside.core.engine.remotes import RemoteRegistry
from hearthside.core.engine.service import EngineService
from hearthside.core.errors import EngineError
from tests.remote_peer import ServerProcess, free_port, hearthside_serve, llama_cpp_server
from tests.timing import Try, best_of, cancel_bound_s, decode_step_s

PEER_KEY = "peer-key-0123456789"
QUESTION = [ChatMessage("user", "What is the capital of France?")]
GREEDY = SamplingParams(temperature=0, max_tokens=12)


@pytest.fixture(scope="module")
def peer(default_model_file: Path) -> Iterator[ServerProcess]:
    with llama_cpp_server(default_model_file, PEER_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def own_server(
    default_model_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    home = tmp_path_factory.mktemp("served-home")
    with hearthside_serve(str(default_model_file), home) as server:
        yield server


def saved(name: str, server: ServerProcess, key: str | None = "same", **extra: str) -> RemoteConfig:
    """Save `server` as remote `name` (with its own key unless told otherwise)."""
    api_key = server.api_key if key == "same" else key
    registry = RemoteRegistry()
    registry.add(name, server.base_url, api_key=api_key, **extra)
    return registry.config(name)


@pytest.fixture()
def service() -> Iterator[EngineService]:
    with EngineService() as running:
        yield running


def direct_reply(server: ServerProcess, max_tokens: int) -> str:
    """The same question asked of the server directly, without Hearthside in between."""
    reply = httpx.post(
        f"{server.base_url}/chat/completions",
        headers={"Authorization": f"Bearer {server.api_key}"},
        json={
            "messages": [{"role": "user", "content": QUESTION[0].content}],
            "temperature": 0,
            "max_tokens": max_tokens,
        },
        timeout=60,
    )
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"])


# ---- against llama-cpp-python's server ------------------------------------------------------


def test_the_servers_models_are_listed(peer: ServerProcess) -> None:
    models = fetch_models(saved("peer", peer))
    assert [Path(model.id).name for model in models] == ["gemma-3-270m-q4_k_m.gguf"]


def test_chat_streams_through_the_service_like_a_direct_call(
    peer: ServerProcess, service: EngineService
) -> None:
    loaded = service.load(saved("peer", peer)).result(timeout=30)
    assert loaded.model is not None and loaded.model.endswith(".gguf")  # resolved on connect
    assert service.is_remote and service.loaded_config == loaded
    pieces: list[str] = []
    streamed = service.chat(QUESTION, GREEDY, on_text=pieces.append).result(timeout=60)
    whole = service.chat(QUESTION, GREEDY).result(timeout=60)

    assert streamed.text and len(pieces) > 1
    assert "".join(pieces) == streamed.text == whole.text
    assert streamed.text == direct_reply(peer, GREEDY.max_tokens or 0)
    metrics = streamed.metrics
    assert metrics.completion_tokens == len(pieces)  # this server sends no usage: chunks count
    assert metrics.stop_reason == "length"
    assert metrics.ttft_s is not None and 0 < metrics.ttft_s < metrics.total_s
    assert metrics.decode_tok_s is not None and metrics.decode_tok_s > 0


def peer_decode_step_s(service: EngineService) -> float:
    """The baseline for the cancel bounds: one decode step of the peer, through the service."""
    result = service.chat(QUESTION, GREEDY).result(timeout=60)
    return decode_step_s(result.metrics.decode_tok_s)


def test_cancel_mid_stream_stops_at_once(peer: ServerProcess, service: EngineService) -> None:
    service.load(saved("peer", peer)).result(timeout=30)
    bound_s = cancel_bound_s(peer_decode_step_s(service))
    story = [ChatMessage("user", "Write a long story about a cat who sails around the world.")]

    def cancel_after_the_first_piece() -> Try:
        first_piece = threading.Event()
        job = service.chat(
            story,
            SamplingParams(temperature=0, max_tokens=500),
            on_text=lambda _p: first_piece.set(),
        )
        assert first_piece.wait(60)
        cancelled_at = time.perf_counter()
        job.cancel()
        result = job.result(timeout=5)
        stopped_s = time.perf_counter() - cancelled_at
        assert result.metrics.stop_reason == "cancelled"
        assert result.metrics.completion_tokens < 500
        return Try(stopped_s, bound_s)

    taken = best_of(cancel_after_the_first_piece)
    assert any(t.within for t in taken), taken


# ~500 tokens: on its one thread the peer reads them in 1-2 s here, and no CPU in 0.1 s
LONG_PROMPT_REPEATS = 60
CANCEL_WHILE_READING_S = 0.1


def test_cancel_while_the_server_reads_a_long_prompt(
    peer: ServerProcess, service: EngineService
) -> None:
    """No bytes arrive while the server evaluates the prompt; closing the socket still ends
    the job at once, and the server answers the next request."""
    service.load(saved("peer", peer)).result(timeout=30)
    bound_s = cancel_bound_s(peer_decode_step_s(service))
    subjects = iter(("tide", "wind", "rain"))  # a new first word each try: nothing cached

    def cancel_while_reading() -> Try:
        text = f"the {next(subjects)} comes in and goes out. " * LONG_PROMPT_REPEATS
        pieces: list[str] = []
        job = service.chat(
            [ChatMessage("user", "Summarise: " + text)],
            SamplingParams(temperature=0, max_tokens=64),
            pieces.append,
        )
        time.sleep(CANCEL_WHILE_READING_S)
        assert not pieces, "the server read the whole prompt within 0.1 s"
        cancelled_at = time.perf_counter()
        job.cancel()
        result = job.result(timeout=5)
        stopped_s = time.perf_counter() - cancelled_at
        assert result.metrics.stop_reason == "cancelled"
        return Try(stopped_s, bound_s)

    taken = best_of(cancel_while_reading)
    assert any(t.within for t in taken), taken
    assert service.chat(QUESTION, GREEDY).result(timeout=120).text


def test_context_length_defaults_when_the_server_does_not_say(
    peer: ServerProcess, service: EngineService
) -> None:
    service.load(saved("peer", peer)).result(timeout=30)
    assert service.call_any(lambda engine: engine.n_ctx).result() == DEFAULT_REMOTE_N_CTX


def test_local_only_features_say_they_need_a_local_model(
    peer: ServerProcess, service: EngineService
) -> None:
    service.load(saved("peer", peer)).result(timeout=30)
    with pytest.raises(EngineError, match="on this computer"):
        service.call(lambda engine: engine.tokenize("hi")).result()
    json_only = SamplingParams(temperature=0, max_tokens=8, grammar='root ::= "{}"')
    with pytest.raises(EngineError, match="loaded on this computer"):
        service.chat(QUESTION, json_only).result()


def test_a_prompt_longer_than_the_servers_context_is_reported(
    peer: ServerProcess, service: EngineService
) -> None:
    service.load(saved("peer", peer)).result(timeout=30)
    too_long = [ChatMessage("user", "word " * 1500)]
    with pytest.raises(RemoteServerError, match="ended its reply without finishing it"):
        service.chat(too_long, GREEDY).result(timeout=60)


def test_a_wrong_key_gets_the_key_message(peer: ServerProcess) -> None:
    with pytest.raises(RemoteServerError, match="rejected the key") as wrong:
        RemoteEngine(saved("wrong", peer, key="not-the-key-42"))
    assert "not-the-key-42" not in wrong.value.user_text()
    assert "Store the right key" in (wrong.value.hint or "")
    with pytest.raises(RemoteServerError, match="rejected the key") as missing:
        RemoteEngine(saved("keyless", peer, key=None))
    assert "It wants an API key" in (missing.value.hint or "")


def test_an_unknown_model_names_what_the_server_has(peer: ServerProcess) -> None:
    with pytest.raises(RemoteServerError, match="no model named 'llama-9000'") as error:
        RemoteEngine(saved("peer", peer, model="llama-9000"))
    assert "gemma-3-270m-q4_k_m.gguf" in error.value.message


def test_a_server_that_is_down_gets_the_plain_message(service: EngineService) -> None:
    config = RemoteConfig(f"http://127.0.0.1:{free_port()}", name="gone")
    with pytest.raises(RemoteServerError, match="isn't answering — is it running"):
        service.load(config).result(timeout=30)
    assert service.loaded_config is None


def test_a_missing_key_file_is_explained(peer: ServerProcess, hearthside_home: Path) -> None:
    config = saved("peer", peer)
    Path(config.api_key_file or "").unlink()
    with pytest.raises(RemoteConfigError, match="missing or damaged"):
        RemoteEngine(config)


# ---- against Hearthside's own server in another process -------------------------------------


def test_hearthside_serve_works_as_a_remote(
    own_server: ServerProcess, service: EngineService
) -> None:
    loaded = service.load(saved("own", own_server)).result(timeout=30)
    assert loaded.model == "gemma-3-270m-q4_k_m"
    pieces: list[str] = []
    result: GenerationResult = service.chat(QUESTION, GREEDY, on_text=pieces.append).result(
        timeout=60
    )
    assert "Paris" in result.text and "".join(pieces) == result.text
    metrics = result.metrics
    assert metrics.prompt_tokens > 0  # this server sends usage in the stream
    assert 0 < metrics.completion_tokens <= 12


def test_hearthside_serve_refuses_a_wrong_key(own_server: ServerProcess) -> None:
    with pytest.raises(RemoteServerError, match="rejected the key"):
        fetch_models(saved("own", own_server, key="w" * 40))


# ---- servers that misbehave -----------------------------------------------------------------


class _OddServer(BaseHTTPRequestHandler):
    """Lists one model; answers chat in the way `server.mode` says."""

    def do_GET(self) -> None:
        card = {"id": "odd-model", "object": "model", "max_model_len": 2048}
        self._send(200, "application/json", json.dumps({"object": "list", "data": [card]}))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode == "broken-sse":
            good = json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})
            self._send(200, "text/event-stream", f"data: {good}\n\ndata: {{not json\n\n")
        elif mode == "error-event":
            event = json.dumps({"error": {"message": "CUDA out of memory"}})
            self._send(200, "text/event-stream", f"data: {event}\n\n")
        else:  # a 500 whose message repeats the request's Authorization header
            echo = f"upstream exploded; request had {self.headers.get('Authorization')}"
            self._send(500, "application/json", json.dumps({"error": {"message": echo}}))

    def _send(self, status: int, content_type: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture(scope="module")
def odd_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def odd_engine(server: ThreadingHTTPServer, mode: str, key: str | None = None) -> RemoteEngine:
    server.mode = mode  # type: ignore[attr-defined]
    registry = RemoteRegistry()
    registry.add("odd", f"http://127.0.0.1:{server.server_address[1]}", api_key=key)
    return RemoteEngine(registry.config("odd"))


def test_the_context_the_server_reports_is_used(odd_server: ThreadingHTTPServer) -> None:
    assert odd_engine(odd_server, "broken-sse").n_ctx == 2048


def test_a_malformed_stream_is_reported(odd_server: ThreadingHTTPServer) -> None:
    engine = odd_engine(odd_server, "broken-sse")
    with pytest.raises(RemoteServerError, match="an event that is not JSON"):
        engine.chat(QUESTION, GREEDY)


def test_an_error_event_mid_stream_is_reported(odd_server: ThreadingHTTPServer) -> None:
    engine = odd_engine(odd_server, "error-event")
    with pytest.raises(RemoteServerError, match="failed mid-reply: CUDA out of memory"):
        engine.chat(QUESTION, GREEDY)


def test_a_server_error_is_shown_without_the_key(odd_server: ThreadingHTTPServer) -> None:
    engine = odd_engine(odd_server, "echo-500", key="sekrit-token-9876")
    with pytest.raises(RemoteServerError, match=r"failed \(HTTP 500\): upstream exploded") as error:
        engine.chat(QUESTION, GREEDY)
    assert "sekrit" not in error.value.user_text()
    assert error.value.client_status == 502


def test_a_server_that_never_answers_times_out() -> None:
    with socket.socket() as silent:  # accepts connections (the backlog) but never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        config = RemoteConfig(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.5)
        started = time.perf_counter()
        with pytest.raises(RemoteServerError, match="stopped answering") as error:
            RemoteEngine(config)
        assert time.perf_counter() - started < 5
        assert error.value.client_status == 504


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://gpu-box:8000", "http://gpu-box:8000/v1"),
        ("http://gpu-box:11434/v1/", "http://gpu-box:11434/v1"),
        ("https://example.org/api/v1", "https://example.org/api/v1"),
    ],
)
def test_addresses_are_normalised(given: str, expected: str) -> None:
    assert RemoteConfig(given).base_url == expected


@pytest.mark.parametrize(
    "bad", ["gpu-box:8000", "ftp://gpu-box", "http://user:pw@gpu-box:8000/v1", "http://h/v1?x=1"]
)
def test_bad_addresses_are_refused(bad: str) -> None:
    with pytest.raises(RemoteConfigError):
        RemoteConfig(bad)
