"""Decode speed through the local API (streaming, the `openai` client) against the engine
directly, side by side in one run.

Both sides use the same loaded model in the same EngineService with the same prompt and
greedy settings. Direct: a chat job whose pieces are time-stamped on arrival. API: the same
chat sent to `hearthside`'s server on loopback, pieces time-stamped as the client receives
them (HTTP, SSE framing, JSON and the event loop hop are all inside the measurement). The
rate is 1 / the median gap between pieces; the result is the median ratio of back-to-back
pairs.

    .venv/bin/python benchmarks/api_overhead.py [--repetitions 9] [--json]

Target: API >= 0.95x direct.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path

import openai
from _timing import median_ratio, paired, rate_from_stamps

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage
from hearthside.core.engine.service import EngineService
from hearthside.core.models.default_model import ensure_default_model
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController

TARGET_RATIO = 0.95
DECODE_TOKENS = 128
PROMPT = "Write a long, detailed story about a lighthouse keeper and a storm."
KEY = "benchmark-key-0123456789"


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
    job.result()
    return rate_from_stamps(stamps)


def api_rate(service: EngineService, client: openai.OpenAI) -> float:
    stamps: list[float] = []
    service.call(lambda engine: engine.clear_cache()).result()
    stream = client.chat.completions.create(
        model="bench",
        messages=[{"role": "user", "content": PROMPT}],
        temperature=0,
        max_tokens=DECODE_TOKENS,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    return rate_from_stamps(stamps)


def measure(model: Path, repetitions: int) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    api: list[float] = []
    with EngineService() as service:
        service.load(EngineConfig(model_path=str(model), n_ctx=2048)).result()
        settings = ServerSettings(port=free_port(), api_key=KEY, model_id="bench")
        controller = ServerController(settings, service)
        controller.start()
        client = openai.OpenAI(base_url=controller.url, api_key=KEY, max_retries=0)
        try:
            for repetition in range(repetitions):
                paired(
                    lambda: direct.append(direct_rate(service)),
                    lambda: api.append(api_rate(service, client)),
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with ModelStore(data_dir()) as store:
        model = args.model or ensure_default_model(store).path
    api, direct = measure(model, args.repetitions)
    summary = {
        "api_decode_tok_s": statistics.median(api),
        "direct_decode_tok_s": statistics.median(direct),
        "ratio": median_ratio(api, direct),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    verdict = "ok" if summary["ratio"] >= TARGET_RATIO else f"BELOW the {TARGET_RATIO} target"
    print(
        f"decode   API {summary['api_decode_tok_s']:6.1f} tok/s   direct "
        f"{summary['direct_decode_tok_s']:6.1f} tok/s   ratio {summary['ratio']:.3f}  {verdict}",
        file=sys.stderr if args.json else sys.stdout,
    )
    return 0 if summary["ratio"] >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
