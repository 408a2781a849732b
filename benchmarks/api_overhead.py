"""Decode speed through the local API (streaming) against the engine directly, side by side
in one run.

Both sides use the same loaded model in the same EngineService with the same prompt and
greedy settings. Direct: a chat job whose pieces are time-stamped on arrival. API: the same
chat sent to Hearthside's server on loopback by a streaming httpx client in its own process
(as an editor or agent is; `_sse_client.py` parses every SSE event's JSON, as the `openai`
package does), pieces time-stamped as that client receives them: HTTP, SSE framing, JSON and
the event-loop hop are all inside the measurement. The rate is 1 / the median gap between
pieces; the result is the median ratio of back-to-back pairs.

    .venv/bin/python benchmarks/api_overhead.py [--repetitions 15] [--json]

Target: API >= 0.95x direct. On a machine whose every core decodes (2 cores here), the
server and its client must take CPU time from the decode threads for each token; `--threads`
below the core count separates that contention from the server's own overhead.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

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
    job.result()
    return rate_from_stamps(stamps)


def api_rate(service: EngineService, base_url: str) -> float:
    service.call(lambda engine: engine.clear_cache()).result()
    client = [sys.executable, str(CLIENT), base_url, KEY, PROMPT, str(DECODE_TOKENS)]
    printed = subprocess.run(client, capture_output=True, text=True, check=True).stdout
    return rate_from_stamps(json.loads(printed))


def measure(model: Path, repetitions: int, threads: int | None) -> tuple[list[float], list[float]]:
    direct: list[float] = []
    api: list[float] = []
    with EngineService() as service:
        config = EngineConfig(model_path=str(model), n_ctx=2048, n_threads=threads)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=15)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--threads", type=int, help="decode threads (default: all physical cores)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with ModelStore(data_dir()) as store:
        model = args.model or ensure_default_model(store).path
    api, direct = measure(model, args.repetitions, args.threads)
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
