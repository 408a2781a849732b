"""Hostile structured-output requests against a real server on loopback (the real engine on the
real SmolLM2 chat model): each gets a clear OpenAI-shaped 400 naming the limit, quickly, and
the server answers a normal chat right after. The schemas that used to crash it are served."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

KEY = "hostile-key-" + "z" * 20
HELLO = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def client(base: str, timeout: float = 120) -> httpx.Client:
    headers = {"Authorization": f"Bearer {KEY}"}
    return httpx.Client(base_url=base, headers=headers, timeout=timeout)


@pytest.fixture(scope="module")
def base(chat_model_file: Path) -> Iterator[str]:
    service = EngineService(max_queue=32).start()
    service.load(EngineConfig(model_path=str(chat_model_file), n_ctx=1024)).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id="m")
    controller = ServerController(settings, service)
    controller.start()
    yield controller.url
    controller.stop()
    service.stop()


def as_response_format(schema: Any) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


def as_tool(schema: Any) -> dict[str, Any]:
    tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
    return {"tools": [tool], "tool_choice": "required"}


def chat(base: str, extra: dict[str, Any], **options: Any) -> httpx.Response:
    with client(base) as http:
        return http.post("/chat/completions", json={**HELLO, **extra}, **options)


def assert_still_serving(base: str) -> None:
    reply = chat(base, {})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"]


def nested_properties(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def nested_default(levels: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return {"type": "object", "default": value}


def doubling_all_of(levels: int) -> dict[str, Any]:
    """Each level's property pulls in the next level twice: 2**levels visits for the converter."""
    defs: dict[str, Any] = {
        f"d{i}": {
            "type": "object",
            "properties": {"a": {"allOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2}},
        }
        for i in range(levels)
    }
    defs[f"d{levels}"] = {"type": "object", "properties": {"z": {"type": "integer"}}}
    return {"$defs": defs, "type": "object", "properties": {"x": {"$ref": "#/$defs/d0"}}}


def string_property(**bounds: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"s": {"type": "string", **bounds}}, "required": ["s"]}


HOSTILE_SCHEMAS = {
    "maxLength 1e9": (string_property(maxLength=10**9), ["`maxLength`", "1000000000", "65536"]),
    "minLength 1e9": (string_property(minLength=10**9), ["`minLength`", "1000000000", "65536"]),
    "maxItems 1e9": (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 10**9},
        ["`maxItems`", "1000000000", "65536"],
    ),
    "minItems 1e9": (
        {"type": "array", "items": {"type": "integer"}, "minItems": 10**9},
        ["`minItems`", "1000000000", "65536"],
    ),
    "20000-value enum": ({"enum": [f"v{i}" for i in range(20000)]}, ["`enum`", "20000", "256"]),
    "enum values in all": (
        {"type": "object", "properties": {f"p{i}": {"enum": list(range(250))} for i in range(5)}},
        ["1024", "`enum`/`const` values"],
    ),
    "300 properties": (
        {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(300)}},
        ["`properties`", "300", "256"],
    ),
    "300 KB schema": (
        {"type": "object", "description": "x" * 300_000},
        ["bytes", "262144"],
    ),
    "subschemas 40 deep": (nested_properties(40), ["32 levels"]),
    "JSON 120 deep": (nested_default(120), ["100 levels"]),
    "pattern {0,5000}": ({"type": "string", "pattern": "^a{0,5000}$"}, ["5000", "200"]),
    "groups 300 deep": (
        {"type": "string", "pattern": "^" + "(" * 300 + "a" + ")" * 300 + "$"},
        ["256 levels", "300"],
    ),
    "doubling allOf": (doubling_all_of(30), ["Turning this JSON schema into a grammar takes"]),
}


@pytest.mark.parametrize("wrap", [as_response_format, as_tool], ids=["response_format", "tool"])
@pytest.mark.parametrize("case", list(HOSTILE_SCHEMAS), ids=list(HOSTILE_SCHEMAS))
def test_a_hostile_schema_gets_a_400_naming_the_limit(base: str, case: str, wrap: Any) -> None:
    schema, named = HOSTILE_SCHEMAS[case]
    started = time.monotonic()
    reply = chat(base, wrap(schema))
    elapsed = time.monotonic() - started
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    for part in named:
        assert part in error["message"], error["message"]
    assert elapsed < 4.0  # the slowest (doubling allOf) stops at the 2 s conversion deadline
    assert_still_serving(base)


def test_a_billion_character_max_length_is_refused_at_once_in_little_memory(base: str) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    reply = chat(base, as_response_format(string_property(maxLength=10**9)))
    elapsed = time.monotonic() - started
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before
    assert reply.status_code == 400
    assert elapsed < 1.0
    assert grown_kib < 64 * 1024  # building the old grammar took ~8 bytes per character


@pytest.mark.parametrize("max_length", [10_000, 20_000])
@pytest.mark.parametrize("wrap", [as_response_format, as_tool], ids=["response_format", "tool"])
def test_the_max_lengths_that_crashed_the_server_are_served(
    base: str, max_length: int, wrap: Any
) -> None:
    # enough tokens for a call's name: a call cut off before it is no call at all
    reply = chat(base, {**wrap(string_property(maxLength=max_length)), "max_tokens": 16})
    assert reply.status_code == 200, reply.text[:500]
    message = reply.json()["choices"][0]["message"]
    if wrap is as_tool:  # the grammar holds: a call of the one tool there is
        assert [call["function"]["name"] for call in message["tool_calls"]] == ["f"]
    else:
        assert message["content"].lstrip()[:1] == "{"
    assert_still_serving(base)


def test_short_length_bounds_hold_in_the_reply(base: str) -> None:
    schema = {
        "type": "object",
        "properties": {
            "word": {"type": "string", "minLength": 3, "maxLength": 5},
            "numbers": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 3,
            },
        },
        "required": ["word", "numbers"],
        "additionalProperties": False,
    }
    reply = chat(base, {**as_response_format(schema), "max_tokens": 60, "temperature": 0})
    assert reply.status_code == 200
    value = json.loads(reply.json()["choices"][0]["message"]["content"])
    assert 3 <= len(value["word"]) <= 5 and 2 <= len(value["numbers"]) <= 3, value


LEFT_RECURSIVE = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_grammar_llama_cpp_refuses_is_a_400(base: str, stream: bool) -> None:
    body = {**HELLO, **as_response_format(LEFT_RECURSIVE), "stream": stream}
    with client(base) as http:
        reply = http.post("/chat/completions", json=body)
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "llama.cpp refused it" in error["message"]
    assert_still_serving(base)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "hi \ud800 there"}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
            "messages.0.content",
        ),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": ["\ud83d"]}, "stop"),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                **as_response_format({"enum": ["\ud800"]}),
            },
            "response_format",
        ),
    ],
    ids=["content", "content part", "stop", "schema"],
)
def test_a_lone_surrogate_is_a_400_saying_so(
    base: str, body: dict[str, Any], param: str, stream: bool
) -> None:
    raw = json.dumps({**body, "max_tokens": 4, "stream": stream})  # writes "\ud800" escapes
    assert "\\ud8" in raw or "\\udf" in raw
    with client(base) as http:
        reply = http.post(
            "/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "not valid Unicode" in error["message"] and "surrogate" in error["message"]
    assert_still_serving(base)


def test_a_valid_surrogate_pair_is_an_ordinary_character(base: str) -> None:
    raw = json.dumps({**HELLO, "messages": [{"role": "user", "content": "Say \U0001f600."}]})
    assert "\\ud83d\\ude00" in raw
    with client(base) as http:
        reply = http.post(
            "/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    assert reply.status_code == 200


def test_slow_conversions_never_stall_other_requests(base: str) -> None:
    """Four schemas that each take the converter its whole 2 s budget, sent at once: /health
    still answers within a second all the while (on the event loop, each would wait 2 s)."""
    slowest: list[float] = []
    stop = threading.Event()

    def poll_health() -> None:
        with client(base.removesuffix("/v1"), timeout=30) as http:
            while not stop.is_set():
                started = time.monotonic()
                assert http.get("/health").status_code == 200
                slowest.append(time.monotonic() - started)
                time.sleep(0.05)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            replies = list(
                pool.map(lambda _: chat(base, as_response_format(doubling_all_of(30))), range(4))
            )
    finally:
        stop.set()
        poller.join()
    assert [reply.status_code for reply in replies] == [400] * 4
    assert len(slowest) > 5 and max(slowest) < 1.0, max(slowest)


CHILD_SERVER = """
import sys
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

model, port, key = sys.argv[1], int(sys.argv[2]), sys.argv[3]
service = EngineService(max_queue=8).start()
service.load(EngineConfig(model_path=model, n_ctx=1024)).result()
controller = ServerController(ServerSettings(port=port, api_key=key, model_id="m"), service)
controller.start()
print("ready", flush=True)
sys.stdin.read()
controller.stop()
service.stop()
"""


@pytest.mark.slow
def test_a_server_process_survives_every_request_that_crashed_or_stalled_it(
    chat_model_file: Path,
) -> None:
    port = free_port()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_SERVER, str(chat_model_file), str(port), KEY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child_base = f"http://127.0.0.1:{port}/v1"
        hostile = [
            (as_response_format(string_property(maxLength=20_000)), 200),
            (as_tool(string_property(maxLength=20_000)), 200),
            (as_response_format(string_property(maxLength=10**9)), 400),
            (as_response_format({"enum": [f"v{i}" for i in range(20000)]}), 400),
            (as_response_format(LEFT_RECURSIVE), 400),
            (as_response_format(doubling_all_of(30)), 400),
        ]
        for extra, status in hostile:
            assert chat(child_base, extra).status_code == status
            assert child.poll() is None, "the server process died"
        assert_still_serving(child_base)
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
