"""What a grammar-enforced tool call costs against a plain reply of as many tokens (issue 34).

Starts `hearthside serve` fresh (a temporary data folder, the default model SmolLM2 135M, the
planner's slots), waits for /health, then with the `openai` client:

  first   the first request after start: a tool call naming its function
  named   later tool calls naming the function
  required, parallel   `tool_choice: "required"`, one call and two calls in one reply

Each is compared with unconstrained generation of the same number of tokens (`usage`): the
same conversation with the server's tool paragraph sent as an ordinary system message,
`tool_choice: "none"` (no grammar), the last user message asking for plain prose so the
reply runs to `max_tokens`, which is set to the tool call's completion tokens. The prompts
thus differ by a few tokens; both sides reuse the same cached prefix. The first call is
compared with a plain reply whose prompt starts with a fresh word, so nothing of it is
cached either. Both sides are streamed and timed to their last token. Later ratios come
from back-to-back pairs whose order alternates, the order's effect cancelled
(`order_free_ratio`). A plain reply that stops before the call's length is counted at its own
decode pace for the rest.

    .venv/bin/python benchmarks/tool_call_cost.py [--repetitions 5] [--json]

Target: every ratio (tool call seconds / plain seconds) at most 1.5; exit status 1 on a miss.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
from _setup import add_data_option, data_home
from _targets import Target, report

from hearthside.core.server.structured import parse_tools, tool_prompt

TARGET_RATIO = 1.5
START_TIMEOUT_S = 300.0
HEARTHSIDE = Path(sys.executable).parent / "hearthside"
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": CITY,
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The current time in a city.",
        "parameters": CITY,
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ONE_CITY = [{"role": "user", "content": "What is the weather in Paris?"}]
# An earlier turn with two calls: with it SmolLM2 answers a two-city question with two calls.
TWO_CITIES = [
    {"role": "user", "content": "What is the weather in Rome and in Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}
            for i, city in enumerate(("Rome", "Oslo"))
        ],
    },
    {"role": "tool", "tool_call_id": "call_0", "content": "Sunny"},
    {"role": "tool", "tool_call_id": "call_1", "content": "Rain"},
    {"role": "assistant", "content": "Rome is sunny and Oslo is rainy."},
    {"role": "user", "content": "What is the weather in Paris and in Tokyo?"},
]  # fmt: skip
PROSE = " Answer in plain prose, at length, without any JSON."


@dataclass(frozen=True)
class Case:
    """One kind of tool call: its conversation, tools and `tool_choice`."""

    name: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    tool_choice: Any
    calls_expected: int = 1

    def request(self) -> dict[str, Any]:
        return {"messages": self.messages, "tools": self.tools, "tool_choice": self.tool_choice}

    def plain_request(self, fresh_prefix: bool = False) -> dict[str, Any]:
        """The same conversation without a grammar: the tool paragraph as a system message."""
        parallel = not isinstance(self.tool_choice, dict)
        paragraph = tool_prompt(parse_tools(self.tools), parallel=parallel)
        if fresh_prefix:
            paragraph = f"({secrets.token_hex(4)}) {paragraph}"
        last = {**self.messages[-1], "content": self.messages[-1]["content"] + PROSE}
        messages = [{"role": "system", "content": paragraph}, *self.messages[:-1], last]
        return {"messages": messages, "tools": self.tools, "tool_choice": "none"}


CASES = (
    Case("named", ONE_CITY, [WEATHER], NAMED),
    Case("required", ONE_CITY, [WEATHER, TIME], "required"),
    Case("parallel", TWO_CITIES, [WEATHER, TIME], "required", calls_expected=2),
)


@dataclass(frozen=True)
class Timed:
    seconds: float  # request sent -> the last token's chunk
    first_token_s: float  # request sent -> the first token's chunk
    completion_tokens: int
    calls: int


def timed(client: openai.OpenAI, body: dict[str, Any], max_tokens: int) -> Timed:
    """One request, streamed (both sides alike), timed to its first and last token."""
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model="default",
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        **body,
    )
    first = last = None
    tokens, calls = 0, set()
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content or delta.tool_calls:
                last = time.perf_counter() - started
                first = last if first is None else first
            calls.update(call.index for call in delta.tool_calls or ())
    if first is None or last is None or not tokens:
        raise SystemExit(f"a request gave no tokens or no usage: {body}")
    return Timed(last, first, tokens, len(calls))


def plain_seconds(plain: Timed, tokens: int) -> float:
    """The plain reply's time for `tokens` tokens: measured, or when the model stopped
    sooner, its first token's time plus its own decode pace for the rest (scaling the whole
    time would scale the prompt's evaluation too and flatter the tool call)."""
    if plain.completion_tokens >= tokens:
        return plain.seconds
    print(
        f"  note: the plain reply stopped at {plain.completion_tokens} of {tokens} tokens; "
        "the rest is counted at its own decode pace",
        file=sys.stderr,
    )
    decode_s = plain.seconds - plain.first_token_s
    per_token = decode_s / max(plain.completion_tokens - 1, 1)
    return plain.first_token_s + per_token * (tokens - 1)


def pair(client: openai.OpenAI, case: Case, tokens: int, flip: bool) -> tuple[float, Timed]:
    """One tool call and one plain reply of `tokens` tokens (the call's length at
    temperature 0), back to back in either order: (ratio, the call)."""
    if flip:
        plain = timed(client, case.plain_request(), tokens)
        tool = timed(client, case.request(), tokens)
    else:
        tool = timed(client, case.request(), tokens)
        plain = timed(client, case.plain_request(), tokens)
    return tool.seconds / plain_seconds(plain, tool.completion_tokens), tool


def order_free_ratio(ratios: Sequence[float]) -> float:
    """The ratio with the order's effect cancelled: the geometric mean of the median ratio
    with the tool call first (even positions) and with the plain reply first (odd ones).
    Whichever request goes second finds the other's prompt in the cache (measured: 0.84x
    one way, 1.13x the other), so a plain median leans to the order that ran more often."""
    tool_first, plain_first = ratios[0::2], ratios[1::2]
    if not plain_first:
        return statistics.median(tool_first)
    return math.sqrt(statistics.median(tool_first) * statistics.median(plain_first))


def tool_call_ratios(client: openai.OpenAI, repetitions: int, max_tokens: int) -> dict[str, Any]:
    first_case = CASES[0]
    first = timed(client, first_case.request(), max_tokens)
    cold_plain = timed(client, first_case.plain_request(fresh_prefix=True), first.completion_tokens)
    figures: dict[str, Any] = {
        "first": {
            "tool_s": first.seconds,
            "tokens": first.completion_tokens,
            "calls": first.calls,
            "plain_s": cold_plain.seconds,
            "ratio": first.seconds / plain_seconds(cold_plain, first.completion_tokens),
        }
    }
    for case in CASES:
        tokens = timed(client, case.request(), max_tokens).completion_tokens  # its length
        runs = [pair(client, case, tokens, flip=i % 2 == 1) for i in range(repetitions)]
        figures[case.name] = {
            "ratio": order_free_ratio([ratio for ratio, _ in runs]),
            "ratios": [round(ratio, 3) for ratio, _ in runs],
            "tokens": [call.completion_tokens for _, call in runs],
            "calls": [call.calls for _, call in runs],
            "tool_s": [round(call.seconds, 3) for _, call in runs],
        }
    return figures


def targets_for(figures: dict[str, Any]) -> list[Target]:
    """Pure: every case's measured ratio against TARGET_RATIO; a case never measured misses."""
    return [
        Target(
            f"{name} tool call / plain tokens",
            figures.get(name, {}).get("ratio"),
            TARGET_RATIO,
            "at most",
        )
        for name in ("first", *(case.name for case in CASES))
    ]


# ---- the server ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_serve(port: int, key_file: Path, extra: Sequence[str]) -> subprocess.Popen[bytes]:
    command = [str(HEARTHSIDE), "serve", "--port", str(port), "--api-key-file", str(key_file)]
    return subprocess.Popen([*command, *extra], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_until_serving(base: str, key: str, server: subprocess.Popen[bytes]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < START_TIMEOUT_S:
        if server.poll() is not None:
            error = server.stderr.read().decode(errors="replace") if server.stderr else ""
            raise SystemExit(f"hearthside serve stopped (exit {server.returncode}):\n{error}")
        try:
            health = httpx.get(f"{base}/health", headers={"Authorization": f"Bearer {key}"})
            if health.status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"hearthside serve did not answer within {START_TIMEOUT_S:.0f} s")


def stop(server: subprocess.Popen[bytes]) -> None:
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def measure(repetitions: int, max_tokens: int, serve_args: Sequence[str]) -> dict[str, Any]:
    port = free_port()
    key = "bench-" + secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="hearthside-bench-key-") as folder:
        key_file = Path(folder) / "key"
        key_file.write_text(key)
        os.chmod(key_file, 0o600)
        server = start_serve(port, key_file, serve_args)
        try:
            base = f"http://127.0.0.1:{port}"
            start_s = wait_until_serving(base, key, server)
            client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=600)
            figures = tool_call_ratios(client, repetitions, max_tokens)
            figures["serve_start_s"] = start_s
            return figures
        finally:
            stop(server)


def print_figures(figures: dict[str, Any], out: Callable[[str], None]) -> None:
    first = figures["first"]
    out(f"hearthside serve answered /health after {figures['serve_start_s']:.1f} s")
    out(
        f"first   tool call {first['tool_s']:.2f} s for {first['tokens']} tokens "
        f"({first['calls']} call), plain (uncached prompt) {first['plain_s']:.2f} s "
        f"-> {first['ratio']:.2f}x"
    )
    for case in CASES:
        row = figures[case.name]
        out(
            f"{case.name:9}{row['ratio']:.2f}x  ratios (tool first, plain first, ...) "
            f"{row['ratios']}  tokens "
            f"{row['tokens']}  calls {row['calls']}  tool s {row['tool_s']}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64, help="limit of each tool call")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("serve_args", nargs="*", help="extra `hearthside serve` options")
    add_data_option(parser)
    args = parser.parse_args(argv)
    with data_home(args.use_my_data) as home:
        print(home.describe(), file=sys.stderr)
        home.default_chat_model()  # registered (no copy) as the default `serve` loads
        figures = measure(args.repetitions, args.max_tokens, args.serve_args)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print_figures(figures, print)
    return report(targets_for(figures))


if __name__ == "__main__":
    sys.exit(main())
