"""Smaller points of OpenAI conformance (issue 21), through the real `openai` client and httpx
against a real server on loopback serving the real default model: errors in OpenAI's shape for
unknown routes, context overflow refused before a stream starts, [DONE] after an error in a
stream, SSE headers for proxies, image parts refused by a text-only model, `n` > 1, prompt
arrays and token-id prompts."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from tests.core.server.test_api import KEY, Running, free_port, serving

pytestmark = pytest.mark.beside

MODEL = "gemma-3-270m-q4_k_m"  # the name start_server serves the model under
STORY = "Write a long story about a ship."
FRANCE = "Question: What is the capital of France?\nAnswer:"
ITALY = "Question: What is the capital of Italy?\nAnswer:"


@pytest.fixture(scope="module")
def server(default_model_file: Path) -> Iterator[Running]:
    """One slot: the choices of a request run one after another."""
    with serving(default_model_file, max_queue=32) as running:
        yield running


def serve(service: EngineService) -> Running:
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id=MODEL)
    controller = ServerController(settings, service)
    controller.start()
    return Running(controller, service)


def sse_payloads(response: httpx.Response) -> list[str]:
    return [
        line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")
    ]


def assert_unbuffered(response: httpx.Response) -> None:
    """The headers that keep proxies (nginx) from holding a stream back."""
    assert response.headers["X-Accel-Buffering"] == "no"
    assert response.headers["Cache-Control"] == "no-cache"


def stream_events(
    running: Running, route: str, body: dict[str, Any]
) -> tuple[httpx.Response, list[str]]:
    with running.http() as http, http.stream("POST", route, json=body) as response:
        return response, sse_payloads(response)


# ---- unknown routes and methods --------------------------------------------------------------


def test_an_unknown_route_is_a_404_in_openais_shape(server: Running) -> None:
    with server.http() as http:
        missing = http.post("/no/such/route", json={})
    assert missing.status_code == 404
    body = missing.json()
    assert set(body) == {"error"}  # not FastAPI's {"detail": ...}
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "not_found" and body["error"]["param"] is None
    assert "POST /v1/chat/completions" in body["error"]["message"]  # says what it does serve
    with pytest.raises(openai.NotFoundError) as error:
        server.client.get("/no/such/route", cast_to=object)
    assert error.value.code == "not_found"


def test_a_wrong_method_is_a_405_in_openais_shape(server: Running) -> None:
    with server.http() as http:
        wrong = http.get("/chat/completions")
    assert wrong.status_code == 405
    assert wrong.headers["Allow"] == "POST"
    error = wrong.json()["error"]
    assert error["code"] == "method_not_allowed" and "takes POST" in error["message"]


def test_an_unknown_route_still_needs_the_key_first(server: Running) -> None:
    refused = httpx.get(f"{server.base}/no/such/route")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "missing_api_key"


# ---- context overflow, errors in streams, SSE headers ---------------------------------------


def test_a_streamed_prompt_too_long_is_refused_before_the_stream(server: Running) -> None:
    too_long = [{"role": "user", "content": "word " * 3000}]
    with pytest.raises(openai.BadRequestError) as error:
        server.client.chat.completions.create(
            model=MODEL,
            messages=too_long,
            max_tokens=8,
            stream=True,  # type: ignore[arg-type]
        )
    assert error.value.code == "context_length_exceeded"
    message = str(error.value.message)
    assert "This model's maximum context length is 2048 tokens." in message
    assert "However, you requested" in message and "8 in the completion" in message
    with server.http() as http:
        plain = http.post("/completions", json={"prompt": "word " * 3000, "stream": True})
    assert plain.status_code == 400 and plain.headers["content-type"] == "application/json"
    assert "16 in the completion" in plain.json()["error"]["message"]  # OpenAI's default


def test_a_prompt_alone_too_long_says_how_long_it_was(server: Running) -> None:
    with server.http() as http:
        reply = http.post(
            "/chat/completions", json={"messages": [{"role": "user", "content": "word " * 3000}]}
        )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert (
        "maximum context length is 2048 tokens. However, your messages resulted in"
        in (error["message"])
    )


def test_a_choice_failing_mid_stream_still_ends_it_with_done(server: Running) -> None:
    """One slot: prompt 0 streams its text before prompt 1 (a token id past the vocabulary)
    is even looked at, so its error can only come inside the stream."""
    good = server.service.call(lambda engine: engine.tokenize(FRANCE, add_bos=True)).result()
    body = {"prompt": [good, [10**9]], "max_tokens": 4, "temperature": 0, "stream": True}
    response, events = stream_events(server, "/completions", body)
    assert response.status_code == 200
    assert_unbuffered(response)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "invalid_token_id" and error["param"] == "prompt"


class _BrokenStreamServer(BaseHTTPRequestHandler):
    """An OpenAI-like server whose stream breaks after its first chunk."""

    def do_GET(self) -> None:
        card = {"id": "far-model", "object": "model", "max_model_len": 2048}
        self._send(200, "application/json", json.dumps({"object": "list", "data": [card]}))

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        good = json.dumps({"model": "far", "choices": [{"index": 0, "delta": {"content": "Hi"}}]})
        self._send(200, "text/event-stream", f"data: {good}\n\ndata: {{not json\n\n")

    def _send(self, status: int, content_type: str, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: object) -> None:
        pass


def test_a_relayed_stream_that_breaks_ends_with_an_error_and_done() -> None:
    far = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenStreamServer)
    threading.Thread(target=far.serve_forever, daemon=True).start()
    service = EngineService().start()
    try:
        service.load(RemoteConfig(f"http://127.0.0.1:{far.server_address[1]}")).result(30)
        running = serve(service)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
        response, events = stream_events(running, "/chat/completions", chat)
        running.controller.stop()
    finally:
        service.stop()
        far.shutdown()
        far.server_close()
    assert_unbuffered(response)
    assert json.loads(events[0])["model"] == MODEL  # relayed, renamed
    assert "not JSON" in json.loads(events[1])["error"]["message"]
    assert events[2:] == ["[DONE]"]


# ---- image parts to a text-only model --------------------------------------------------------


@pytest.mark.parametrize(
    ("part", "cannot"),
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            "see images",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            "hear audio",
        ),
    ],
)
def test_media_parts_to_a_text_only_model_are_a_clear_400(
    server: Running, part: dict[str, Any], cannot: str
) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is in this?"}, part]},
    ]
    with pytest.raises(openai.BadRequestError) as error:
        server.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8)  # type: ignore[arg-type]
    assert error.value.code == "unsupported_content"
    assert error.value.param == "messages[1].content[1]"
    assert f"The model {MODEL} reads text only; it cannot {cannot}." in error.value.message


# ---- n > 1 -----------------------------------------------------------------------------------


def chat_texts(running: Running, max_tokens: int = 8, **request: Any) -> tuple[list[str], Any]:
    reply = running.client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": STORY}], max_tokens=max_tokens, **request
    )
    assert [choice.index for choice in reply.choices] == list(range(len(reply.choices)))
    return [choice.message.content or "" for choice in reply.choices], reply.usage


def settle_the_cache_on_story(running: Running) -> None:
    """After one request with STORY, every later one finds its prompt in the KV cache and
    evaluates only the last token, so seeded replies compare exactly. (A prompt evaluated
    from another cached prefix is cut into other chunks, which round differently, and
    sampling at temperature 1 then drifts: see tests/core/engine/test_batch.py.)"""
    chat_texts(running, max_tokens=1, temperature=0)


def test_n_choices_are_each_their_own_seeded_generation(server: Running) -> None:
    settle_the_cache_on_story(server)
    both, usage = chat_texts(server, n=2, seed=7, temperature=1.0)
    alone = [chat_texts(server, seed=seed, temperature=1.0) for seed in (7, 8)]
    assert both == [alone[0][0][0], alone[1][0][0]]  # choice j samples with seed + j
    assert both[0] != both[1]
    assert usage.prompt_tokens == alone[0][1].prompt_tokens  # the prompt counted once
    assert usage.completion_tokens == sum(single.completion_tokens for _, single in alone)


def test_n_above_the_cap_is_refused(server: Running) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        chat_texts(server, n=9)
    assert error.value.param == "n"


def streamed_choices(
    running: Running, body: dict[str, Any]
) -> tuple[list[int], dict[int, str], list[Any]]:
    """The choice index of each content chunk in arrival order, each choice's text, and the
    parsed events."""
    response, events = stream_events(running, "/chat/completions", body)
    assert_unbuffered(response)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(event) for event in events[:-1]]
    order: list[int] = []
    texts: dict[int, str] = defaultdict(str)
    for event in parsed:
        for choice in event["choices"]:
            content = choice["delta"].get("content")
            if content:
                order.append(choice["index"])
                texts[choice["index"]] += content
    return order, texts, parsed


def test_streamed_choices_carry_their_index_and_one_usage(server: Running) -> None:
    body = {
        "messages": [{"role": "user", "content": STORY}],
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 3,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    settle_the_cache_on_story(server)
    order, texts, parsed = streamed_choices(server, body)
    whole, usage = chat_texts(server, n=2, seed=3, temperature=1.0)
    assert [texts[0], texts[1]] == whole
    assert order == sorted(order)  # one slot: choice 1 starts after choice 0 ends
    finishes = {
        c["index"]: c["finish_reason"] for e in parsed for c in e["choices"] if c["finish_reason"]
    }
    assert set(finishes) == {0, 1}
    usages = [event["usage"] for event in parsed if event.get("usage")]
    assert len(usages) == 1 and usages[0]["completion_tokens"] == usage.completion_tokens


def test_with_two_slots_the_choices_decode_together(default_model_file: Path) -> None:
    service = EngineService(max_queue=8).start()
    config = EngineConfig(
        model_path=str(default_model_file), n_ctx=512, n_parallel=2, n_threads=1, n_threads_batch=1
    )
    service.load(config).result()
    running = serve(service)
    try:
        body = {
            "messages": [{"role": "user", "content": STORY}],
            "max_tokens": 16,
            "temperature": 0,
            "n": 2,
            "stream": True,
        }
        order, texts, _parsed = streamed_choices(running, body)
    finally:
        running.controller.stop()
        service.stop()
    assert set(order) == {0, 1} and texts[0] and texts[1]
    # Together: choice 1 has text before choice 0 is done (one slot gives 0…0 1…1).
    assert order.index(1) < len(order) - 1 - order[::-1].index(0)


# ---- completions: prompt arrays and token ids ------------------------------------------------


def completion_texts(running: Running, prompt: Any, **request: Any) -> tuple[list[str], Any]:
    reply = running.client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, temperature=0, **request
    )
    assert [choice.index for choice in reply.choices] == list(range(len(reply.choices)))
    return [choice.text for choice in reply.choices], reply.usage


def test_a_prompt_array_gives_n_choices_per_prompt_in_order(server: Running) -> None:
    texts, usage = completion_texts(server, [FRANCE, ITALY], n=2)
    (france,), france_usage = completion_texts(server, FRANCE)
    (italy,), italy_usage = completion_texts(server, ITALY)
    assert texts == [france, france, italy, italy]  # index = prompt * n + j
    assert "Paris" in france and italy != france
    assert usage.prompt_tokens == france_usage.prompt_tokens + italy_usage.prompt_tokens
    assert usage.completion_tokens == 2 * (
        france_usage.completion_tokens + italy_usage.completion_tokens
    )


def test_token_id_prompts_are_continued_as_sent(server: Running) -> None:
    france_ids = server.service.call(lambda engine: engine.tokenize(FRANCE, add_bos=True)).result()
    italy_ids = server.service.call(lambda engine: engine.tokenize(ITALY, add_bos=True)).result()
    from_text = [completion_texts(server, prompt)[0][0] for prompt in (FRANCE, ITALY)]
    (from_ids,), usage = completion_texts(server, france_ids)
    assert from_ids == from_text[0] and usage.prompt_tokens == len(france_ids)
    both, _ = completion_texts(server, [france_ids, italy_ids])
    assert both == from_text


def test_a_token_id_outside_the_vocabulary_is_a_400(server: Running) -> None:
    n_vocab = server.service.call(lambda engine: engine.n_vocab).result()
    for bad in ([[2, n_vocab - 1], [2, n_vocab]], [5, -1]):
        with pytest.raises(openai.BadRequestError) as error:
            completion_texts(server, bad)
        assert error.value.code == "invalid_token_id" and error.value.param == "prompt"
        assert "not in this model's vocabulary" in error.value.message


def test_more_choices_than_the_cap_over_prompts_are_refused(server: Running) -> None:
    with pytest.raises(openai.BadRequestError) as error:
        completion_texts(server, [FRANCE, ITALY, FRANCE], n=3)
    assert error.value.code == "too_many_choices" and error.value.param == "prompt"
