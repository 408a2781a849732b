"""A crash of the engine worker during an API request: the request in flight gets an
OpenAI-shaped 500 (or, once streaming, an error event and [DONE]); the next one is served."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.core.server.test_api import Running, serving

pytestmark = pytest.mark.beside

STORY = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]


@pytest.fixture
def api(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


def worker_pid(running: Running) -> int:
    pid = running.service.worker_pid
    assert pid is not None
    return pid


def test_a_crash_mid_stream_ends_it_with_an_error_event_and_the_next_request_works(
    api: Running,
) -> None:
    pid = worker_pid(api)
    raw = api.http().stream(
        "POST",
        "/chat/completions",
        json={"model": "default", "messages": STORY, "max_tokens": 400, "stream": True},
    )
    events: list[str] = []
    with raw as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(line.removeprefix("data: "))
                if len(events) == 4:
                    os.kill(pid, signal.SIGSEGV)
    assert events[-1] == "[DONE]"
    assert '"engine_crashed"' in events[-2] and "SIGSEGV" in events[-2]
    reply = api.client.chat.completions.create(
        model="default", messages=STORY, max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
    assert worker_pid(api) != pid


def test_a_crash_during_a_plain_request_is_a_500_in_openais_shape(api: Running) -> None:
    pid = worker_pid(api)
    # SIGKILL once the reply is under way: the request is in flight, its answer not yet sent.
    timer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    timer.start()
    with pytest.raises(openai.InternalServerError) as error:
        api.client.chat.completions.create(
            model="default", messages=STORY, max_tokens=2000, temperature=0
        )
    timer.join()
    body = error.value.body
    assert isinstance(body, dict) and body["code"] == "engine_crashed"
    assert "SIGKILL" in body["message"]
    reply = api.client.chat.completions.create(
        model="default", messages=STORY, max_tokens=8, temperature=0
    )
    assert reply.choices[0].message.content
