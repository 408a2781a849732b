"""A chat template that fails on a request is a 400 saying so, never a 500 (issue 36).

The model's template is applied to each request's messages; when it runs past Hearthside's
1 s cap or refuses the conversation, that request cannot be served as sent, and the client
reads why. The real server on loopback serves a real one-layer llama GGUF whose template
loops on one message and refuses another, driven by httpx.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from hearthside.core.engine.templates import RENDER_TIME_LIMIT_S
from tests.core.server.test_api import KEY, Running, serving
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

MODEL_ID = "gemma-3-270m-q4_k_m"  # the name test_api's server gives the model it serves
TEMPLATE = (
    "{% if messages[-1]['content'] == 'Loop' %}"
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    "{% elif messages[-1]['content'] == 'Refuse' %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant') }}"
    "{% endif %}"
    "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    folder = tmp_path_factory.mktemp("template-errors")
    model = write_tiny_gguf(folder / "looping.gguf", loadable=True, chat_template=TEMPLATE)
    with serving(model, max_queue=4) as server:
        yield server


def post(running: Running, path: str, content: str, **extra: object) -> httpx.Response:
    body = {"model": MODEL_ID, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        f"{running.base}/{path}",
        headers={"Authorization": f"Bearer {KEY}", "x-api-key": KEY},
        json={**body, "max_tokens": 4, **extra},
        timeout=60,
    )


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_template_past_its_time_cap_is_a_400_saying_so(running: Running, stream: bool) -> None:
    reply = post(running, "chat/completions", "Loop", stream=stream)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "chat_template_error"
    assert f"chat template ran longer than {RENDER_TIME_LIMIT_S:g} s" in error["message"]
    assert "shorter conversation" in error["message"]  # what the client can do


def test_a_template_that_refuses_the_conversation_is_a_400_with_its_words(
    running: Running,
) -> None:
    reply = post(running, "chat/completions", "Refuse")
    assert reply.status_code == 400, reply.text
    assert "roles must alternate" in reply.json()["error"]["message"]


def test_the_messages_route_answers_400_too_and_the_server_serves_on(running: Running) -> None:
    refused = post(running, "messages", "Loop")
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert "ran longer than" in refused.json()["error"]["message"]

    served = post(running, "chat/completions", "Hello")
    assert served.status_code == 200, served.text
    assert served.json()["choices"][0]["finish_reason"] in ("stop", "length")
