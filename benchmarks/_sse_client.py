"""A streaming API client in its own process, as an editor or agent would be: it sends one
chat request and prints, as JSON, the arrival time of every content piece."""

from __future__ import annotations

import json
import sys
import time

import httpx


def main(base: str, key: str, prompt: str, max_tokens: int) -> None:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
    }
    stamps: list[float] = []
    headers = {"Authorization": f"Bearer {key}"}
    with (
        httpx.Client(base_url=base, headers=headers, timeout=300) as client,
        client.stream("POST", "/chat/completions", json=body) as reply,
    ):
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                stamps.append(time.perf_counter())
    print(json.dumps(stamps))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
