"""A streaming API client in its own process, as an editor or agent would be: it sends one
chat request and prints, as JSON, a report of when everything arrived.

    _sse_client.py BASE KEY PROMPT MAX_TOKENS            # the report, at once
    _sse_client.py --on-go BASE KEY PROMPT MAX_TOKENS    # says "ready", waits for a line on
                                                         # stdin, then prints the report

`--on-go` lets a benchmark start several clients, let each finish importing, then release them
together. The report (`timed_stream`) holds the time the request was sent, each content
piece's arrival, the end of the stream ([DONE]) and the usage the server reported (asked for
with `stream_options.include_usage`): a piece may hold several tokens, so benchmarks count
tokens from `usage`, never pieces. Times are `time.perf_counter()`, CLOCK_MONOTONIC on
Linux, so the reports of separate client processes share one clock.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import httpx


def main(base: str, key: str, prompt: str, max_tokens: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=base, headers=headers, timeout=300) as client:
        report = timed_stream(client, prompt, max_tokens)
    print(json.dumps(report))


def timed_stream(client: httpx.Client, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One greedy streaming chat: when it was sent, when each content piece and the end
    arrived, and the server's usage (None where the server sent none)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    stamps: list[float] = []
    usage: dict[str, Any] | None = None
    sent = time.perf_counter()
    with client.stream("POST", "/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            reply.read()
            raise SystemExit(f"HTTP {reply.status_code}: {reply.text[:500]}")
        for line in reply.iter_lines():
            if line.startswith("data: [DONE]"):
                break
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                usage = event["usage"]
            choices = event.get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
    done = time.perf_counter()
    return {"sent": sent, "stamps": stamps, "done": done, "usage": usage}


def completion_tokens(report: dict[str, Any]) -> int:
    """The server's own count of the reply's tokens (`usage.completion_tokens`)."""
    usage = report.get("usage") or {}
    if "completion_tokens" not in usage:
        raise SystemExit(
            "the server sent no usage.completion_tokens for a streamed reply (asked for with "
            "stream_options.include_usage): without it the benchmark would count text pieces, "
            "which may hold several tokens each"
        )
    return int(usage["completion_tokens"])


def on_go(base: str, key: str, prompt: str, max_tokens: int) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    # A request queued behind others on a busy machine may wait minutes for its first byte.
    timeout = httpx.Timeout(30, read=1800)
    with httpx.Client(base_url=base, headers=headers, timeout=timeout) as client:
        print("ready", flush=True)
        sys.stdin.readline()
        report = timed_stream(client, prompt, max_tokens)
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1] == "--on-go":
        on_go(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
