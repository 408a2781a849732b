"""Switching models under load: `hearthside serve --max-models 2`, 30 requests at once,
round-robin over 6 installed models, several rounds (issue 36).

The situation that once answered HTTP 500 "The engine is not running." to 5 requests a round:
more models asked for at once than may stay loaded, so every round loads, evicts and reloads.
A request racing a swap must get its answer (200) or, when its model cannot be loaded within
the server's wait, a 503 with Retry-After; never a 500. Memory must stay bounded: at most
`--max-models` engine workers beside the served model's, and a peak that does not grow from
round to round.

The six models are real: the default chat model (SmolLM2 135M Instruct Q4_1) and Gemma 3 270M
Q4_K_M from their packages, and each re-quantized to Q8_0 and Q4_0 by Hearthside's own
quantizer, all registered in a fresh data folder (a temporary HEARTHSIDE_HOME; the re-quantized
files are made once into the cache folder). `hearthside serve` runs in a subprocess as a user
starts it (`--max-models 2` and a key file, its other settings its own, serving the default
model).
Each round, 30 clients (threads with their own httpx connection, released together) each send
one greedy chat request for `max_tokens` 16, the i-th to model i mod 6. The server's process
tree (serve and its engine workers) is sampled every 0.2 s: resident memory summed over the
tree, and how many engine workers are alive.

    .venv/bin/python benchmarks/model_thrash.py [--rounds 3] [--clients 30] [--max-models 2]
        [--json]

Targets: no answer other than 200 or 503; every 503 carries Retry-After; at most
max-models + 1 engine workers at any time; the last round's memory peak <= 1.15x the first's.
It prints PASS/MISS per target and exits 1 on any miss.
"""

from __future__ import annotations

import argparse
import collections
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from _setup import cached_gemma_file, data_home, print_settings, register_model
from _targets import Target, report
from parallel_clients import Server, free_port, hearthside_command

from hearthside.core.models.default_model import GEMMA_MODEL_NAME, cached_default_model_file
from hearthside.core.models.quantize import quantize_model
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import cache_dir

WORKER_MODULE = "hearthside.core.engine.worker"
REQUANTIZED = ("Q8_0", "Q4_0")
REQUEST_TIMEOUT_S = 300.0
SAMPLE_EVERY_S = 0.2
PEAK_GROWTH_BOUND = 1.15  # the last round's memory peak over the first's
ANSWERED = 200
BUSY = 503


@dataclass
class Reply:
    model: str
    status: int  # 0: no HTTP answer at all (the connection failed or timed out)
    seconds: float
    retry_after: bool
    error: str = ""


@dataclass
class Round:
    replies: list[Reply]
    peak_rss_mib: float
    peak_workers: int
    load_average: float

    def statuses(self) -> dict[int, int]:
        return dict(sorted(collections.Counter(reply.status for reply in self.replies).items()))

    def answered_s(self) -> list[float]:
        return sorted(reply.seconds for reply in self.replies if reply.status == ANSWERED)


@dataclass
class Thrash:
    models: list[str]
    max_models: int
    rounds: list[Round] = field(default_factory=list)


# --- the six models --------------------------------------------------------------------------


def requantized_file(source: Path, name: str, quant: str) -> Path:
    """`source` re-quantized to `quant` by Hearthside's quantizer, made once into the cache."""
    target = cache_dir() / "models" / f"{name}-{quant.lower()}.gguf"
    if target.is_file():
        return target
    with (
        tempfile.TemporaryDirectory(prefix="hearthside-thrash-quant-") as folder,
        ModelStore(Path(folder)) as store,
    ):
        record = store.add(source, link=True, name=name, check_native=False)
        variant = quantize_model(store, record.id, quant, check_native=False)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(variant.path, target)
    return target


def register_six_models(home: Path) -> list[str]:
    """The ids of the six models registered in `home`, the default chat model first."""
    sources = {
        "SmolLM2 135M Instruct": cached_default_model_file(),
        GEMMA_MODEL_NAME: cached_gemma_file(),
    }
    files: list[tuple[Path, str]] = []
    for name, source in sources.items():
        files.append((source, name))
        files += [(requantized_file(source, name, q), f"{name} ({q})") for q in REQUANTIZED]
    for path, name in files:
        register_model(home, path, name)
    with ModelStore(home) as store:
        by_path = {record.path.resolve(): record.id for record in store.list()}
    return [by_path[path.resolve()] for path, _ in files]


# --- one round -------------------------------------------------------------------------------


def ask(base: str, key: str, model: str, go: threading.Event) -> Reply:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(timeout=REQUEST_TIMEOUT_S, headers=headers) as client:
        go.wait()
        started = time.monotonic()
        try:
            response = client.post(f"{base}/chat/completions", json=body)
        except httpx.HTTPError as exc:
            return Reply(model, 0, time.monotonic() - started, False, repr(exc))
        seconds = time.monotonic() - started
        error = "" if response.status_code == ANSWERED else response.text[:200]
        retry_after = "retry-after" in response.headers
        return Reply(model, response.status_code, seconds, retry_after, error)


class TreeSampler:
    """Samples the server's process tree until stopped: summed RSS and live engine workers."""

    def __init__(self, pid: int) -> None:
        self._root = psutil.Process(pid)
        self._stop = threading.Event()
        self.peak_rss = 0
        self.peak_workers = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> None:
        rss, workers = 0, 0
        for process in [self._root, *self._root.children(recursive=True)]:
            try:
                rss += process.memory_info().rss
                workers += WORKER_MODULE in " ".join(process.cmdline())
            except psutil.Error:  # it ended between the listing and the reading
                continue
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_workers = max(self.peak_workers, workers)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_EVERY_S)


def one_round(base: str, key: str, pid: int, models: Sequence[str], clients: int) -> Round:
    go = threading.Event()
    replies: list[Reply] = [Reply("", 0, 0.0, False)] * clients

    def client(index: int) -> None:
        replies[index] = ask(base, key, models[index % len(models)], go)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    with TreeSampler(pid) as sampler:
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # every client has its connection object before the release
        go.set()
        for thread in threads:
            thread.join()
    load = psutil.getloadavg()[0]
    return Round(replies, sampler.peak_rss / 2**20, sampler.peak_workers, load)


# --- targets and report ----------------------------------------------------------------------


def targets(thrash: Thrash) -> list[Target]:
    replies = [reply for round_ in thrash.rounds for reply in round_.replies]
    other = sum(1 for reply in replies if reply.status not in (ANSWERED, BUSY))
    busy_without_retry = sum(1 for r in replies if r.status == BUSY and not r.retry_after)
    peaks = [round_.peak_rss_mib for round_ in thrash.rounds]
    growth = peaks[-1] / peaks[0] if peaks and peaks[0] > 0 else None
    workers = max((round_.peak_workers for round_ in thrash.rounds), default=None)
    return [
        Target("answers other than 200 or 503", float(other), 0, "at most", ""),
        Target("503s without Retry-After", float(busy_without_retry), 0, "at most", ""),
        Target(
            "engine workers alive at once",
            None if workers is None else float(workers),
            thrash.max_models + 1,
            "at most",
            "",
        ),
        Target("memory peak, last round / first", growth, PEAK_GROWTH_BOUND, "at most"),
    ]


def print_round(number: int, round_: Round) -> None:
    answered = round_.answered_s()
    slowest = f"{answered[-1]:.1f} s" if answered else "none"
    median = f"{statistics.median(answered):.1f} s" if answered else "none"
    print(
        f"round {number}: statuses {round_.statuses()}; 200s median {median}, slowest "
        f"{slowest}; peak {round_.peak_rss_mib:.0f} MiB over the tree, "
        f"{round_.peak_workers} engine workers; load {round_.load_average:.1f}"
    )
    for reply in round_.replies:
        if reply.status not in (ANSWERED, BUSY):
            print(f"  {reply.model}: {reply.status} after {reply.seconds:.1f} s: {reply.error}")


def run(rounds: int, clients: int, max_models: int, work: Path) -> Thrash:
    with data_home(use_my_data=False) as home:
        print(home.describe(), file=sys.stderr)
        models = register_six_models(home.path)
        port = free_port()
        key = secrets.token_urlsafe(32)
        key_file = work / "api_key"
        key_file.write_text(key + "\n")
        key_file.chmod(0o600)
        argv = [str(hearthside_command()), "serve", "--port", str(port)]
        argv += ["--api-key-file", str(key_file), "--max-models", str(max_models)]
        print_settings(
            "hearthside serve",
            {"argv": " ".join(argv), "models (round-robin)": models, "clients": clients},
        )
        server = Server("hearthside", argv, port, work / "serve.log")
        server.start()
        thrash = Thrash(models, max_models)
        try:
            server.wait_ready(key)
            assert server.process is not None
            for number in range(1, rounds + 1):
                round_ = one_round(server.base_url, key, server.process.pid, models, clients)
                print_round(number, round_)
                thrash.rounds.append(round_)
        finally:
            server.stop()
        return thrash


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--max-models", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="also print every reply as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hearthside-thrash-") as work:
        thrash = run(args.rounds, args.clients, args.max_models, Path(work))
    if args.json:
        print(json.dumps(asdict(thrash), indent=1))
    return report(targets(thrash))


if __name__ == "__main__":
    sys.exit(main())
