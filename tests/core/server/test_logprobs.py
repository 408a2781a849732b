"""`logprobs`/`top_logprobs` (chat) and `logprobs` (completions) through the real `openai`
client and httpx, against a real server on loopback serving the real SmolLM2 135M model."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import openai
import pytest

from tests.core.server.openapi_check import assert_matches
from tests.core.server.test_api import Running, serving

pytestmark = pytest.mark.beside

MODEL = "gemma-3-270m-q4_k_m"  # the id start_server gives the model it loads
QUESTION = [{"role": "user", "content": "Write one sentence about the sea."}]
PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Running]:
    with serving(chat_model_file, max_queue=8) as running:
        yield running


def check_ranked(chosen: float, alternatives: list[float], n_top: int) -> None:
    """Greedy: the chosen token is the most likely one, alternatives sorted, a distribution."""
    assert len(alternatives) == n_top
    assert alternatives == sorted(alternatives, reverse=True)
    assert chosen <= 0 and chosen == pytest.approx(alternatives[0], abs=1e-9)
    assert sum(math.exp(value) for value in alternatives) <= 1 + 1e-9


def check_chat_entries(entries: list[Any], content: str) -> None:
    assert entries and "".join(entry.token for entry in entries) == content
    for entry in entries:
        assert entry.bytes == list(entry.token.encode())
        check_ranked(entry.logprob, [top.logprob for top in entry.top_logprobs], 3)


def chat(server: Running, **extra: Any) -> Any:
    return server.client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=12, **extra
    )


def test_chat_logprobs_cover_the_reply_with_ranked_alternatives(server: Running) -> None:
    reply = chat(server, logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    assert choice.logprobs is not None and choice.logprobs.refusal is None
    check_chat_entries(choice.logprobs.content or [], choice.message.content or "")
    assert_matches(reply.model_dump(exclude_unset=True), "CreateChatCompletionResponse")


def test_streamed_chat_logprobs_come_with_their_text(server: Running) -> None:
    chunks = list(chat(server, logprobs=True, top_logprobs=3, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    entries = [
        entry
        for chunk in chunks
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content or []
    ]
    check_chat_entries(entries, content)
    shown = carried = ""
    for chunk in chunks:  # an entry comes with its text or after it, never before
        choice = chunk.choices[0]
        shown += choice.delta.content or ""
        carried += (
            "".join(e.token for e in (choice.logprobs.content or [])) if choice.logprobs else ""
        )
        assert shown.startswith(carried)
    for chunk in chunks:
        assert_matches(chunk.model_dump(exclude_unset=True), "CreateChatCompletionStreamResponse")


def check_completion_logprobs(logprobs: Any, text: str) -> None:
    assert logprobs is not None and "".join(logprobs.tokens) == text
    offsets = [len(PROMPT) + len("".join(logprobs.tokens[:i])) for i in range(len(logprobs.tokens))]
    assert logprobs.text_offset == offsets
    for token, chosen, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        alternatives = sorted(top.values(), reverse=True)
        check_ranked(chosen, alternatives, 2)
        assert top[token] == chosen


def test_completion_logprobs_whole_and_streamed(server: Running) -> None:
    asked: dict[str, Any] = {"model": MODEL, "prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    whole = server.client.completions.create(**asked, logprobs=2)
    check_completion_logprobs(whole.choices[0].logprobs, whole.choices[0].text)
    assert_matches(whole.model_dump(exclude_unset=True), "CreateCompletionResponse")

    chunks = [c for c in server.client.completions.create(**asked, logprobs=2, stream=True)]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    merged: dict[str, list[Any]] = {
        "tokens": [],
        "token_logprobs": [],
        "top_logprobs": [],
        "text_offset": [],
    }
    for chunk in chunks:
        if chunk.choices and chunk.choices[0].logprobs:
            for key, values in merged.items():
                values.extend(getattr(chunk.choices[0].logprobs, key))
    check_completion_logprobs(SimpleNamespace(**merged), text)


def raw_choices(server: Running, route: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Every choice of the reply (or of every stream chunk) as sent, JSON only."""
    with server.http() as http:
        if not body.get("stream"):
            reply = http.post(f"/{route}", json=body)
            assert reply.status_code == 200, reply.text
            return list(reply.json()["choices"])
        with http.stream("POST", f"/{route}", json=body) as events:
            lines = [line[6:] for line in events.iter_lines() if line.startswith("data: {")]
    return [choice for line in lines for choice in json.loads(line).get("choices", [])]


@pytest.mark.parametrize("stream", [False, True])
def test_requests_without_logprobs_get_null(server: Running, stream: bool) -> None:
    asked = {"model": MODEL, "temperature": 0, "max_tokens": 2, "stream": stream}
    chat_choices = raw_choices(server, "chat/completions", {**asked, "messages": QUESTION})
    text_choices = raw_choices(server, "completions", {**asked, "prompt": PROMPT})
    for choice in chat_choices + text_choices:
        assert "logprobs" in choice and choice["logprobs"] is None


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        ("chat", {"top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("completions", {"logprobs": 6}, "logprobs"),
    ],
)
def test_logprob_requests_openai_refuses_are_refused(
    server: Running, route: str, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        if route == "chat":
            server.client.chat.completions.create(
                model=MODEL, messages=QUESTION, max_tokens=4, **body
            )
        else:
            server.client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, **body)
    assert refused.value.status_code == 400 and refused.value.param == param
