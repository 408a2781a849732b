"""Issue 36 item 5: a chat request with too many messages is a 400 naming the limit.

30000 one-letter messages fit in the 1 MiB body; the chat template then ran past its 1 s cap
and the client got a 500. The real server on loopback with the real chat model, driven by
httpx.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hearthside.core.server.schemas import MAX_MESSAGES
from tests.core.server.test_api import KEY, Running, serving

MODEL_ID = "gemma-3-270m-q4_k_m"  # the name test_api's server gives the model it serves


@pytest.fixture(scope="module")
def running(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=4) as server:
        yield server


def chat(running: Running, count: int) -> httpx.Response:
    messages = [
        {"role": "user" if index % 2 == 0 else "assistant", "content": "a"}
        for index in range(count)
    ]
    return httpx.post(
        f"{running.base}/chat/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={"model": MODEL_ID, "messages": messages, "max_tokens": 4},
        timeout=60,
    )


@pytest.mark.parametrize("count", [MAX_MESSAGES + 1, 30_000])
def test_more_messages_than_the_limit_get_a_400_naming_it(running: Running, count: int) -> None:
    started = time.monotonic()
    reply = chat(running, count)
    assert reply.status_code == 400
    assert time.monotonic() - started < 5.0
    error = reply.json()["error"]
    assert error["param"] == "messages"
    assert error["type"] == "invalid_request_error"
    assert f"give at most {MAX_MESSAGES} messages; this request has {count}" in error["message"]


def test_the_limit_itself_is_rendered_not_a_500(running: Running) -> None:
    reply = chat(running, MAX_MESSAGES)
    # 2048 turns are more tokens than the test's 2048-token context: the template rendered
    # them all, within its time cap, and the request was then measured against the context.
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["code"] == "context_length_exceeded"
