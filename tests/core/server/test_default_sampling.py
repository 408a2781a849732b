"""What a client that sends no sampling fields gets (the openai SDK and LangChain send none):
llama.cpp's defaults, as llama-server applies them — measured through the real API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.server.app import LLAMA_CPP_SAMPLING
from tests.core.server.test_api import Running, serving

pytestmark = pytest.mark.beside

QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def chat_server(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


def answer(running: Running, max_tokens: int = 16, **fields: float) -> str:
    reply = running.http().post(
        "/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": max_tokens,
            **fields,
        },
    )
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def test_the_defaults_are_llama_cpps() -> None:
    assert LLAMA_CPP_SAMPLING == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}


@pytest.mark.slow
def test_a_client_that_sends_no_sampling_gets_llama_cpps_defaults(chat_server: Running) -> None:
    """Same seed, same reply as with llama.cpp's defaults spelled out; the raw distribution the
    server used to sample from (temperature 1, no truncation) answers differently. Every request
    after the first finds the same prompt cached, so all of them sample from the same logits."""
    raw = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0}
    answer(chat_server, max_tokens=1)  # the prompt is cached from here on
    differed = 0
    for seed in range(1, 7):
        unset = answer(chat_server, seed=seed)
        assert unset == answer(chat_server, seed=seed, **LLAMA_CPP_SAMPLING)
        differed += unset != answer(chat_server, seed=seed, **raw)
    assert differed >= 1


@pytest.mark.slow
def test_llama_cpp_extensions_top_k_and_min_p_are_honoured(chat_server: Running) -> None:
    """top_k 1 leaves one candidate: the same reply whatever the temperature and seed."""
    first = answer(chat_server, temperature=2.0, top_k=1, min_p=0.0, seed=1)
    assert answer(chat_server, temperature=2.0, top_k=1, min_p=0.0, seed=2) == first
    assert first == answer(chat_server, temperature=0.0)


def test_a_client_that_sets_no_max_tokens_stops_at_the_servers_cap(chat_model_file: Path) -> None:
    """A reply nobody bounded stops at `max_tokens_cap`, not at a full context."""
    from hearthside.core.engine.config import EngineConfig
    from hearthside.core.engine.service import EngineService
    from hearthside.core.server.app import ServerSettings
    from hearthside.core.server.controller import ServerController
    from tests.core.server.test_api import KEY, free_port

    service = EngineService().start()
    service.load(EngineConfig(model_path=str(chat_model_file), n_ctx=1024)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, max_tokens_cap=6, model_id="m")
    controller = ServerController(settings, service)
    controller.start()
    try:
        reply = Running(controller, service).client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "Write a long story about a dragon."}],
        )
    finally:
        controller.stop()
        service.stop()
    assert reply.usage is not None and reply.usage.completion_tokens == 6
    assert reply.choices[0].finish_reason == "length"
