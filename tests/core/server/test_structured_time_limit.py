"""A generation under a grammar that runs past its time limit is stopped and told why (issue 36
1c), against a real server on loopback with the real engine on the default chat model. The
server's limit is made tiny here (5 s) so that the hostile schema `{"type": "string",
"minLength": 65536}`, which keeps the model writing for thousands of tokens, reaches it at once;
a plain reply runs past such a limit untouched."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from hearthside.core.server.generation_limit import StructuredTimeLimit
from tests.core.server.test_hostile_schemas import KEY, as_response_format, client, free_port

LIMIT_S = 5.0  # ample for the first piece of the string to stream, even on a busy machine
# grace LIMIT_S and a rate no model reaches: every structured request here gets about LIMIT_S
TINY_LIMIT = StructuredTimeLimit(grace_s=LIMIT_S, min_tokens_per_s=1e9)
HOSTILE = as_response_format({"type": "string", "minLength": 65536})
WRITE = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2048}
ANSWER_WITHIN_S = LIMIT_S + 15.0  # the limit, then one (costly) step and the reply, busy machine


@contextmanager
def serving(model: Path, limit: StructuredTimeLimit) -> Iterator[tuple[str, EngineService]]:
    service = EngineService(max_queue=8).start()
    service.load(EngineConfig(model_path=str(model), n_ctx=4096)).result()
    settings = ServerSettings(
        port=free_port(), api_key=KEY, model_id="m", structured_time_limit=limit
    )
    controller = ServerController(settings, service)
    controller.start()
    try:
        with client(controller.url) as http:  # warm: the first reply's start is not timed
            http.post("/chat/completions", json={**WRITE, "max_tokens": 4}).raise_for_status()
        yield controller.url, service
    finally:
        controller.stop()
        service.stop()


@pytest.fixture(scope="module")
def served(chat_model_file: Path) -> Iterator[tuple[str, EngineService]]:
    with serving(chat_model_file, TINY_LIMIT) as running:
        yield running


def engine_idle_soon(service: EngineService, within_s: float = 1.0) -> bool:
    """The job is counted out just after its answer is sent: give that a moment."""
    deadline = time.monotonic() + within_s
    while service.running_jobs and time.monotonic() < deadline:
        time.sleep(0.02)
    return service.running_jobs == 0


def assert_told_too_slow(error: dict[str, Any]) -> None:
    assert error["code"] == "structured_output_too_slow", error
    assert f"after {LIMIT_S:g} s" in error["message"]
    assert "Loosen the schema" in error["message"]  # what to do about it


def test_a_structured_reply_past_its_limit_gets_a_400_that_says_why(
    served: tuple[str, EngineService],
) -> None:
    base, service = served
    started = time.monotonic()
    with client(base) as http:
        reply = http.post("/chat/completions", json={**WRITE, **HOSTILE})
    took = time.monotonic() - started
    assert reply.status_code == 400, reply.text
    assert_told_too_slow(reply.json()["error"])
    assert LIMIT_S <= took < ANSWER_WITHIN_S
    assert engine_idle_soon(service)  # its sequence is gone from the engine


def test_a_stream_past_its_limit_ends_with_an_error_event_and_done(
    served: tuple[str, EngineService],
) -> None:
    base, service = served
    body = {**WRITE, **HOSTILE, "stream": True}
    with client(base) as http, http.stream("POST", "/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        events = [line[6:] for line in reply.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(event) for event in events[:-1]]
    written = "".join(
        (chunk.get("choices") or [{}])[0].get("delta", {}).get("content") or "" for chunk in parsed
    )
    assert written.startswith('"')  # the JSON string was streaming when the limit stopped it
    assert_told_too_slow(parsed[-1]["error"])
    assert engine_idle_soon(service)


def test_a_generation_without_a_grammar_has_no_such_limit(chat_model_file: Path) -> None:
    limit_s = 0.05  # a few tokens' time: any reply outlasts it
    limit = StructuredTimeLimit(grace_s=limit_s, min_tokens_per_s=1e9)
    with serving(chat_model_file, limit) as (base, _service), client(base) as http:
        started = time.monotonic()
        reply = http.post("/chat/completions", json={**WRITE, "max_tokens": 40})
        took = time.monotonic() - started
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 20
    assert took > limit_s


def test_the_limit_grows_with_max_tokens_and_applies_only_under_a_grammar() -> None:
    from hearthside.core.engine.config import SamplingParams

    limit = StructuredTimeLimit()
    assert limit.seconds_for(SamplingParams(max_tokens=100)) is None
    short = limit.seconds_for(SamplingParams(max_tokens=100, grammar='root ::= "x"'))
    long = limit.seconds_for(SamplingParams(default_max_tokens=4096, grammar='root ::= "x"'))
    assert short is not None and long is not None
    assert 60 <= short < long  # at least a minute: an ordinary reply never comes near it
