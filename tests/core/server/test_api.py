"""The local API with real clients (the `openai` package, httpx) against a real server on
loopback, serving the real default model through the shared EngineService."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

KEY = "test-key-" + "x" * 20


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Running:
    def __init__(self, controller: ServerController, service: EngineService) -> None:
        self.controller = controller
        self.service = service
        self.base = controller.url
        self.client = openai.OpenAI(base_url=self.base, api_key=KEY, max_retries=0)

    def http(self, **kwargs: object) -> httpx.Client:
        headers = {"Authorization": f"Bearer {KEY}"}
        return httpx.Client(base_url=self.base, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]


def start_server(model: Path, max_queue: int) -> tuple[ServerController, EngineService]:
    service = EngineService(max_queue=max_queue).start()
    service.load(EngineConfig(model_path=str(model), n_ctx=2048)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id="gemma-3-270m-q4_k_m")
    controller = ServerController(settings, service)
    controller.start()
    return controller, service


@contextmanager
def serving(model: Path, max_queue: int) -> Iterator[Running]:
    """A real server on loopback over its own EngineService, stopped afterwards."""
    controller, service = start_server(model, max_queue)
    try:
        yield Running(controller, service)
    finally:
        controller.stop()
        service.stop()


@pytest.fixture(scope="module")
def server(default_model_file: Path) -> Iterator[Running]:
    with serving(default_model_file, max_queue=32) as running:
        yield running


def ask(running: Running, prompt: str, max_tokens: int = 24, **extra: object) -> str:
    reply = running.client.chat.completions.create(
        model="gemma-3-270m-q4_k_m",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=max_tokens,
        **extra,  # type: ignore[arg-type]
    )
    return reply.choices[0].message.content or ""


def test_models_lists_the_loaded_model(server: Running) -> None:
    models = server.client.models.list()
    assert [model.id for model in models.data] == ["gemma-3-270m-q4_k_m", "default"]


def test_chat_answers_with_usage_and_finish_reason(server: Running) -> None:
    reply = server.client.chat.completions.create(
        model="gemma-3-270m-q4_k_m",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        temperature=0,
        max_tokens=24,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streaming_gives_the_same_reply_as_a_whole_one(server: Running) -> None:
    whole = ask(server, "Write one sentence about the sea.")
    stream = server.client.chat.completions.create(
        model="gemma-3-270m-q4_k_m",
        messages=[{"role": "user", "content": "Write one sentence about the sea."}],
        temperature=0,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("stop", "length") and finishes.count(None) == len(finishes) - 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_completions_continue_a_raw_prompt(server: Running) -> None:
    reply = server.client.completions.create(
        model="gemma-3-270m-q4_k_m",
        prompt="Question: What is the capital of France?\nAnswer:",
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].text.startswith(" Paris")  # a continuation keeps its space


def test_json_schema_output_parses(server: Running) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["colour", "count"],
    }
    text = ask(
        server,
        "Name a colour and a number.",
        max_tokens=60,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    reply = json.loads(text)
    assert isinstance(reply["colour"], str) and isinstance(reply["count"], int)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_a_tool_call_whose_arguments_validate(server: Running) -> None:
    reply = server.client.chat.completions.create(
        model="gemma-3-270m-q4_k_m",
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        temperature=0,
        max_tokens=60,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(arguments["city"], str)


def test_a_streamed_tool_call_matches_the_whole_one(server: Running) -> None:
    request = {
        "model": "gemma-3-270m-q4_k_m",
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 60,
    }
    whole = server.client.chat.completions.create(**request)  # type: ignore[call-overload]
    chunks = list(server.client.chat.completions.create(**request, stream=True))  # type: ignore[call-overload]
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or []) if c.choices]
    names = [d.function.name for d in deltas if d.function and d.function.name]
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert names == ["get_weather"]
    assert arguments == whole.choices[0].message.tool_calls[0].function.arguments  # type: ignore[index,union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_sixteen_concurrent_clients_each_get_their_own_reply(server: Running) -> None:
    prompts = [f"What is {n} plus {n}?" for n in range(16)]
    alone = {prompt: ask(server, prompt) for prompt in prompts[:4]}
    with ThreadPoolExecutor(16) as pool:
        together = dict(zip(prompts, pool.map(lambda p: ask(server, p), prompts), strict=True))
    assert len(together) == 16 and all(together.values())
    for prompt, reply in alone.items():
        assert together[prompt] == reply


def test_invalid_parameters_get_openai_shaped_400s(server: Running) -> None:
    with server.http() as http:
        bad = http.post("/chat/completions", json={"messages": [], "temperature": 9})
        assert bad.status_code == 400
        error = bad.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        too_many = http.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 100_000},
        )
        assert too_many.status_code == 400 and "max_tokens" in too_many.json()["error"]["message"]
        unknown = http.post(
            "/chat/completions",
            json={
                "messages": [{"role": "user", "content": "Name a colour."}],
                "max_tokens": 4,
                "temperature": 0,
                "logit_bias_magic": {"x": 1},
            },
        )
        assert unknown.status_code == 200


def test_a_prompt_too_long_for_the_context_is_a_400(server: Running) -> None:
    with server.http() as http:
        reply = http.post(
            "/chat/completions",
            json={"messages": [{"role": "user", "content": "word " * 1000}], "max_tokens": 1500},
        )
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_embeddings_are_a_clear_error(server: Running) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        server.client.embeddings.create(model="gemma-3-270m-q4_k_m", input="hello")
    assert "does not provide embeddings" in str(error.value)


def test_a_client_that_leaves_mid_stream_stops_its_generation(server: Running) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "temperature": 0,
        "stream": True,
    }
    with server.http() as http, http.stream("POST", "/chat/completions", json=body) as reply:
        for count, _line in enumerate(reply.iter_lines()):
            if count > 6:
                break
    left_at = time.monotonic()
    # Were the dragon story still running, this would wait behind up to 1500 tokens.
    assert ask(server, "Name a colour.")
    assert time.monotonic() - left_at < 3.0


def test_a_client_that_times_out_stops_its_whole_reply(server: Running) -> None:
    body = {
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 1500,
        "temperature": 0,
    }
    with server.http() as http, pytest.raises(httpx.ReadTimeout):
        http.post("/chat/completions", json=body, timeout=1.0)
    left_at = time.monotonic()
    assert ask(server, "Name a colour.")
    assert time.monotonic() - left_at < 3.0


def test_a_full_queue_answers_503_at_once(default_model_file: Path) -> None:
    controller, service = start_server(default_model_file, max_queue=1)
    running = Running(controller, service)
    long_story = {
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 120,  # seconds of decoding: the queue fills and refuses within them
        "temperature": 0,
    }
    try:
        with ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(_post, running, long_story)]
            _wait_until(lambda: service.busy)
            busy.append(pool.submit(_post, running, long_story))
            _wait_until(lambda: service.waiting_jobs == 1)
            with running.http() as http:
                started = time.monotonic()
                refused = http.post("/chat/completions", json=long_story)
                # A queued reply would take many seconds; a refusal is an HTTP round trip.
                assert time.monotonic() - started < 2.0
            assert refused.status_code == 503
            assert refused.headers["Retry-After"] == "1"
            assert refused.json()["error"]["code"] == "queue_full"
            assert [future.result().status_code for future in busy] == [200, 200]
    finally:
        controller.stop()
        service.stop()


def _wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the server"
        time.sleep(0.02)


def _post(running: Running, body: dict[str, object]) -> httpx.Response:
    with running.http() as http:
        return http.post("/chat/completions", json=body)


def test_the_window_keeps_chatting_while_the_api_serves(server: Running) -> None:
    """The GUI and the API share one service: a direct job and an API call both finish."""
    from hearthside.core.engine.config import SamplingParams
    from hearthside.core.engine.engine import ChatMessage

    api_reply: list[str] = []
    worker = threading.Thread(target=lambda: api_reply.append(ask(server, "Name a fruit.")))
    worker.start()
    direct = server.service.chat(
        [ChatMessage("user", "Name a colour.")], SamplingParams(temperature=0, max_tokens=8)
    ).result(timeout=60)
    worker.join(60)
    assert direct.text and api_reply and api_reply[0]
