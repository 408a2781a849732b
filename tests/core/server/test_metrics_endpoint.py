"""`GET /metrics` on a real server on loopback serving the real default model: the text parses
with Prometheus' own parser, and the counters move by what the requests' `usage` says."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from hearthside.core.engine.config import EngineConfig
from tests.core.server.test_anthropic_api import QUESTION, Server, serving
from tests.core.server.test_api import KEY

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
RESTART_WAIT_S = 60.0


@pytest.fixture(scope="module")
def server(chat_model_file: Path) -> Iterator[Server]:
    with serving(chat_model_file) as running:
        yield running


def scrape(server: Server) -> Samples:
    with server.keyed() as http:
        reply = http.get("/metrics")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def grew(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_move_by_each_requests_usage(server: Server) -> None:
    before = scrape(server)
    message = server.client.messages.create(
        model="default", max_tokens=8, messages=QUESTION, extra_body={"temperature": 0}
    )
    chat = openai.OpenAI(base_url=f"{server.root}/v1", api_key=KEY, max_retries=0)
    completion = chat.chat.completions.create(
        model="default", max_tokens=6, messages=QUESTION, temperature=0
    )
    after = scrape(server)
    assert completion.usage is not None
    tokens_out = message.usage.output_tokens + completion.usage.completion_tokens
    tokens_in = message.usage.input_tokens + completion.usage.prompt_tokens
    assert grew(before, after, "hearthside_output_tokens_total") == tokens_out
    assert grew(before, after, "hearthside_input_tokens_total") == tokens_in
    assert grew(before, after, "hearthside_generations_total") == 2
    for route in ("/v1/messages", "/v1/chat/completions"):
        assert grew(before, after, "hearthside_requests_total", route=route, status="200") == 1
    assert grew(before, after, "hearthside_requests_total", route="/metrics", status="200") == 1
    decode_tok_s = value(after, "hearthside_last_decode_tokens_per_second")
    assert decode_tok_s > 0 and not math.isnan(decode_tok_s)
    assert value(after, "hearthside_queue_depth") == 0
    assert value(after, "hearthside_slots_busy") == 0
    assert value(after, "hearthside_slots_total") == 1


def test_metrics_need_the_key_and_refusals_are_counted(server: Server) -> None:
    before = scrape(server)
    with server.http() as http:
        refused = http.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "missing_api_key"
    with server.keyed() as http:
        assert http.get("/no/such/route").status_code == 404
    after = scrape(server)
    assert grew(before, after, "hearthside_requests_total", route="/metrics", status="401") == 1
    assert grew(before, after, "hearthside_requests_total", route="unmatched", status="404") == 1


def test_model_loads_and_worker_restarts_are_counted(chat_model_file: Path) -> None:
    with serving(chat_model_file) as fresh:
        before = scrape(fresh)
        fresh.service.load(EngineConfig(model_path=str(chat_model_file), n_ctx=2048)).result()
        pid = fresh.service.worker_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(anthropic.InternalServerError):  # the request that finds it dead
            fresh.client.messages.create(model="default", max_tokens=2, messages=QUESTION)
        deadline = time.monotonic() + RESTART_WAIT_S
        while grew(before, after := scrape(fresh), "hearthside_worker_restarts_total") < 1:
            assert time.monotonic() < deadline, "the engine was not restarted"
            time.sleep(0.2)
    assert grew(before, after, "hearthside_model_loads_total") == 1
    assert grew(before, after, "hearthside_worker_crashes_total") == 1
