"""Decode speed through the local API (streaming) against the engine directly, side by side
in one run.

Both sides use the same loaded model in the same EngineService with the same prompt and
greedy settings. Direct: a chat job whose text pieces are time-stamped on arrival. API: the
same chat sent to Hearthside's server on loopback by a streaming httpx client in its own
process (as an editor or agent is; `_sse_client.py` parses every SSE event's JSON, as the
`openai` package does), pieces time-stamped as that client receives them: HTTP, SSE framing,
JSON and the event-loop hop are all inside the measurement.

Both sides are timed by one rule (benchmarks/_timing.py):
    decode tok/s = (completion tokens - 1) / (last piece's arrival - first piece's arrival)
with the completion tokens counted by the engine (direct: the job's metrics; API: the
server's `usage.completion_tokens`), never by pieces: the engine worker sends the pieces of
fast tokens together, so a piece may hold two or three tokens. The result is the median
ratio of back-to-back pairs (who goes first alternates).

    .venv/bin/python benchmarks/api_overhead.py [--repetitions 15] [--threads N]
        [--model GGUF] [--use-my-data] [--json]

Runs on a fresh data folder with the default chat model registered there unless
`--use-my-data`. Target: API >= 0.95x direct; exit status 1 on a miss. On a machine whose
every core decodes (2 cores here), the server and its client must take CPU time from the
decode threads for each token; `--threads` below the core count separates that contention
from the server's own overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from _setup import add_data_option, data_home, print_settings
from _sse_client import completion_tokens
from _targets import Target, report
from _timing import DECODE_RULE, decode_tok_s, median_ratio, paired

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage
from hearthside.core.engine.service import EngineService
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

TARGET_RATIO = 0.95
DECODE_TOKENS = 128
PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."
KEY = "benchmark-key-0123456789abcdef0123456789"
CLIENT = Path(__file__).with_name("_sse_client.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def direct_rate(service: EngineService) -> float:
    stamps: list[float] = []
    service.call(lambda engine: engine.clear_cache()).result()
    sampling = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS)
    job = service.chat(
        [ChatMessage("user", PROMPT)], sampling, lambda _p: stamps.append(time.perf_counter())
    )
    tokens = job.result().metrics.completion_tokens
    return decode_tok_s(tokens, stamps[0], stamps[-1])


def api_rate(service: EngineService, base_url: str) -> float:
    service.call(lambda engine: engine.clear_cache()).result()
    client = [sys.executable, str(CLIENT), base_url, KEY, PROMPT, str(DECODE_TOKENS)]
    printed = subprocess.run(client, capture_output=True, text=True, check=True).stdout
    stream = json.loads(printed)
    return decode_tok_s(completion_tokens(stream), stream["stamps"][0], stream["stamps"][-1])


def measure(config: EngineConfig, repetitions: int) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    api: list[float] = []
    with EngineService() as service:
        service.load(config).result()
        settings = ServerSettings(port=free_port(), api_key=KEY, model_id="bench")
        controller = ServerController(settings, service)
        controller.start()
        try:
            for repetition in range(repetitions):
                paired(
                    lambda: direct.append(direct_rate(service)),
                    lambda: api.append(api_rate(service, controller.url)),
                    flip=repetition % 2 == 1,
                )
                print(
                    f"  run {repetition + 1}/{repetitions}: API {api[-1]:5.1f} vs "
                    f"direct {direct[-1]:5.1f} tok/s",
                    file=sys.stderr,
                )
        finally:
            controller.stop()
    return api, direct


def summarise(api: list[float], direct: list[float]) -> dict[str, float]:
    return {
        "api_decode_tok_s": statistics.median(api),
        "direct_decode_tok_s": statistics.median(direct),
        "ratio": median_ratio(api, direct),
    }


def targets_of(summary: Mapping[str, float]) -> list[Target]:
    return [Target("decode tok/s, API / direct", summary["ratio"], TARGET_RATIO, "at least")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--threads", type=int, help="decode threads (default: all physical cores)")
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    with data_home(args.use_my_data) as home:
        model = args.model or home.default_chat_model()
        config = EngineConfig(model_path=str(model), n_ctx=2048, n_threads=args.threads)
        print(home.describe(), file=out)
        print_settings(
            "both sides (one EngineService, one loaded model)",
            {
                **config.to_dict(),
                "decode_threads": config.decode_threads,
                "batch_threads": config.batch_threads,
                "prompt": PROMPT,
                "max_tokens": DECODE_TOKENS,
                "temperature": 0,
                "repetitions": args.repetitions,
                "timing": DECODE_RULE,
                "tokens counted by": "direct: the job's metrics; API: usage.completion_tokens",
                "load average": os.getloadavg(),
            },
            out,
        )
        summary = summarise(*measure(config, args.repetitions))
    if args.json:
        print(json.dumps(summary, indent=2))
    print(
        f"decode   API {summary['api_decode_tok_s']:6.1f} tok/s   direct "
        f"{summary['direct_decode_tok_s']:6.1f} tok/s   ratio {summary['ratio']:.3f}",
        file=out,
    )
    return report(targets_of(summary), out)


if __name__ == "__main__":
    sys.exit(main())
