"""Several streaming clients at once: `hearthside serve` against llama-server, side by side.

Both servers run in subprocesses as a user would start them, from the same GGUF file, with the
same decode and batch threads, the same context per slot, the same batch sizes, KV-cache type,
flash attention, GPU layers, mmap/mlock, sliding-window cache and speculation (llama-server is
given the settings Hearthside chose for this machine; both are printed in full, and a setting
llama-server cannot be given is named), and the same key. Hearthside runs on a fresh data
folder (a temporary HEARTHSIDE_HOME with the model registered there: no tuned default of yours
can switch speculation on for it) unless `--use-my-data`. llama-server is the one built from
the very llama.cpp that the installed llama-cpp-python vendors
(../shared/tools/build-native-llama.sh). Every client is a process of its own (`_sse_client.py
--on-go`: httpx on loopback, real SSE, every event's JSON parsed); clients import first, then
are released together. Requests are greedy (temperature 0), `max_tokens` 128, one distinct
prompt per client and round (a round tag in front, so no prompt cache on either side can reuse
an earlier round's prompt). Rounds alternate between the servers (Hearthside first, then
llama-server first, ...), after one untimed warm-up round each. `--threads` reaches Hearthside
only where `serve` has a `--threads` option; until then both servers use the threads Hearthside
chooses itself. Each round's line shows the 1-minute load average: on a small shared machine a
busy neighbour can slow a 2-thread decode many times over.

Scenarios and what is measured (computed the same way for both servers):
  4 clients, 4 slots (`--parallel 4`, llama-server `-np 4 -c 4 x ctx`):
    aggregate tok/s = the completion tokens of all 4 streams / (the last stream's [DONE]
                      - the first request sent), i.e. throughput as the clients see it,
                      prompt processing included;
    slowest first token = the largest, over the 4 clients, of (first content piece - that
                      client's request sent).
  1 client, 1 slot:
    decode tok/s  = (completion tokens - 1) / (last content piece - first content piece);
    first token   = first content piece - request sent.
Completion tokens are the `usage.completion_tokens` of the final chunk (`stream_options:
{"include_usage": true}`), which both servers send; a stream without it stops the benchmark
(a content chunk may hold several tokens, so chunks are never counted instead).
Results are the medians per side; ratios (Hearthside / llama-server) are the medians of the
ratios of back-to-back rounds, so slow drifts of the machine cancel.

    .venv/bin/python benchmarks/parallel_clients.py [--rounds 5] [--threads N] [--model GGUF]
        [--llama-server PATH] [--ctx 2048] [--own-defaults] [--use-my-data] [--json]

`--own-defaults` starts each server as a user would without tuning either: `hearthside serve
--model M` and `llama-server -m M`, with only the address and the key besides. Slots, context,
threads, batch sizes and KV cache are then each one's own choice (their loading lines say which),
so the scenarios' slot counts do not apply: the 4 and the 1 client meet whatever slots each
server chose.

Targets: 4 clients aggregate >= 0.9x llama-server, slowest first token <= 2x; 1 client
decode >= 0.97x. It prints PASS/MISS per target and exits 1 on any miss. Until `hearthside
serve` has `--parallel`, Hearthside runs without it (one request at a time) and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import llama_cpp
from _setup import add_data_option, data_home, print_settings
from _sse_client import completion_tokens
from _targets import Direction, Target, report
from _timing import DECODE_RULE, decode_tok_s, median_ratio, paired

from hearthside.app.terminal_chat import load_settings_for
from hearthside.core.engine.config import EngineConfig

MAX_TOKENS = 128
CLIENTS = 4
TARGET_AGGREGATE = 0.9  # 4 clients: aggregate tok/s, Hearthside / llama-server, at least
TARGET_SLOWEST_TTFT = 2.0  # 4 clients: slowest first token, Hearthside / llama-server, at most
TARGET_SINGLE_DECODE = 0.97  # 1 client: decode tok/s, Hearthside / llama-server, at least
START_TIMEOUT_S = 180
# How each server says what it loaded: `hearthside serve`'s status lines, llama-server's slots.
SLOT_LINES = ("Loading ", "Answers ", "n_slots =")
CLIENT = Path(__file__).with_name("_sse_client.py")
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "shared" / "tools" / "build-native-llama.sh"
TOPICS = (
    "Write a long, detailed story about a lighthouse keeper and a storm.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a walk through a busy market in a small coastal town.",
    "Write a long letter from a gardener to a friend about the seasons.",
    "Tell the history of a fictional mountain village over one hundred years.",
    "Explain how to plan, pack and cook for a week of camping.",
    "Write a detailed story about two friends who build a boat together.",
    "Describe, in detail, how bread is made from wheat field to loaf.",
)


def prompts(tag: str, count: int, offset: int) -> list[str]:
    """`count` distinct prompts; the tag in front keeps every round's prompts new to the
    servers' prompt caches."""
    return [f"({tag}.{i}) {TOPICS[(offset + i) % len(TOPICS)]}" for i in range(count)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- the servers ---------------------------------------------------------------------------


@dataclass
class Server:
    """A server in a subprocess of its own, its output in a log file."""

    name: str
    argv: list[str]
    port: int
    log: Path
    stop_signal: int = signal.SIGTERM
    process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: the server and its children
            )

    def wait_ready(self, key: str) -> None:
        """Until GET /v1/models answers 200 (both servers answer it only once loaded)."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        headers = {"Authorization": f"Bearer {key}"}
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"{self.name} exited ({self.process.returncode}):\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/models", headers=headers, timeout=5).is_success:
                    return
            time.sleep(0.25)
        raise SystemExit(f"{self.name} did not answer in {START_TIMEOUT_S} s:\n{self.tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # To the server's own group, as a terminal sends Ctrl-C; a server that does not stop
        # in time is killed with the children it started.
        os.killpg(self.process.pid, self.stop_signal)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def said(self, *starts: str) -> list[str]:
        """The log lines that contain any of `starts` (what each server says of its slots)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [line.strip() for line in text.splitlines() if any(s in line for s in starts)]

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@functools.cache
def serve_options() -> str:
    """`hearthside serve --help`, to see which options this version has."""
    command = [str(hearthside_command()), "serve", "--help"]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def hearthside_command() -> Path:
    command = Path(sys.executable).with_name("hearthside")
    if not command.exists():
        raise SystemExit(f"{command} not found: run `python3 bootstrap.py` first.")
    return command


def hearthside_server(
    model: Path, config: EngineConfig, slots: int, ctx: int, key_file: Path, work: Path
) -> Server:
    options = serve_options()
    port = free_port()
    argv = [str(hearthside_command()), "serve", "--model", str(model), "--port", str(port)]
    argv += ["--ctx", str(ctx), "--api-key-file", str(key_file)]
    if "--parallel" in options:
        argv += ["--parallel", str(slots)]
    elif slots > 1:
        print(
            f"  note: `hearthside serve` has no --parallel yet: Hearthside serves one request "
            f"at a time, llama-server gets -np {slots}",
            file=sys.stderr,
        )
    if "--threads" in options:
        argv += ["--threads", str(config.decode_threads)]
    if "--batch-threads" in options:
        argv += ["--batch-threads", str(config.batch_threads)]
    # Ctrl-C is how a user stops `serve`; it shuts down cleanly on SIGINT.
    return Server("Hearthside", argv, port, work / f"hearthside-{slots}.log", signal.SIGINT)


def llama_server(binary: Path, model: Path, config: EngineConfig, key: str, work: Path) -> Server:
    """llama-server with the settings Hearthside chose (its slots and context per slot,
    which a back-off may have made fewer than asked): `-c` is all slots' cells together."""
    port = free_port()
    gpu_layers = "all" if config.n_gpu_layers < 0 else str(config.n_gpu_layers)
    argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["-np", str(config.n_parallel), "-c", str(config.total_context), "-ngl", gpu_layers]
    argv += ["-t", str(config.decode_threads), "-tb", str(config.batch_threads)]
    argv += ["-b", str(config.n_batch), "-ub", str(config.n_ubatch)]
    argv += ["-fa", "on" if config.flash_attn else "off"]
    argv += ["-ctk", config.type_k, "-ctv", config.type_v, "--no-webui", "--api-key", key]
    argv += placement_args(config) + speculation_args(config)
    return Server("llama-server", argv, port, work / f"llama-server-{config.n_parallel}.log")


def placement_args(config: EngineConfig) -> list[str]:
    """Memory and device settings, spelled as llama-server takes them."""
    argv = ["-sm", config.split_mode, "-mg", str(config.main_gpu)]
    if config.tensor_split:
        argv += ["-ts", ",".join(f"{share:g}" for share in config.tensor_split)]
    for override in config.tensor_overrides:
        argv += ["-ot", override.to_flag()]
    if not config.use_mmap:
        argv.append("--no-mmap")
    if config.use_mlock:
        argv.append("--mlock")
    if config.numa != "off":
        argv += ["--numa", config.numa]
    if config.swa_full:
        argv.append("--swa-full")
    return argv


def speculation_args(config: EngineConfig) -> list[str]:
    """A draft model as llama-server takes it; prompt lookup it cannot be given
    (`unmatched_settings` says so)."""
    speculative = config.speculative
    if speculative.mode != "draft_model" or speculative.draft_model_path is None:
        return []
    argv = ["-md", speculative.draft_model_path, "--draft-max", str(speculative.draft_tokens)]
    if speculative.draft_gpu_layers is not None:
        argv += ["-ngld", str(speculative.draft_gpu_layers)]
    if speculative.draft_n_ctx is not None:
        argv += ["-cd", str(speculative.draft_n_ctx)]
    if speculative.draft_threads is not None:
        argv += ["-td", str(speculative.draft_threads)]
    return argv


def unmatched_settings(config: EngineConfig) -> list[str]:
    """Hearthside's settings that llama-server is not given: the comparison is then not like
    for like, and the printout says so."""
    if config.speculative.mode == "prompt_lookup":
        return [
            f"speculation: prompt lookup (k={config.speculative.draft_tokens}, n-gram "
            f"{config.speculative.ngram_size}) on Hearthside, none on llama-server"
        ]
    return []


def hearthside_settings(model: Path, ctx: int, threads: int | None, slots: int) -> Any:
    """What `hearthside serve` loads for this model here (tuned, else planned: a
    `LoadSettings`, with where it came from and why), which llama-server is given too."""
    extra: dict[str, Any] = {}
    if "n_parallel" in inspect.signature(load_settings_for).parameters:
        extra["n_parallel"] = slots
    return load_settings_for(str(model), ctx, threads, None, **extra)


def served_threads(asked: int | None) -> int | None:
    """The threads to ask for: none where `serve` cannot be told (it then uses its own
    choice, and llama-server is given that)."""
    if asked is None or "--threads" in serve_options():
        return asked
    print(
        "  note: `hearthside serve` has no --threads: both servers use Hearthside's own choice",
        file=sys.stderr,
    )
    return None


# --- the clients ---------------------------------------------------------------------------


def run_clients(base_url: str, key: str, texts: list[str]) -> list[dict[str, Any]]:
    """One client process per prompt, released together once all have imported."""
    command = [sys.executable, str(CLIENT), "--on-go", base_url, key]
    clients = [
        subprocess.Popen(
            [*command, text, str(MAX_TOKENS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for text in texts
    ]
    for client in clients:
        assert client.stdout is not None
        if client.stdout.readline().strip() != "ready":
            raise SystemExit("a benchmark client failed to start")
    for client in clients:
        assert client.stdin is not None
        client.stdin.write("go\n")
        client.stdin.flush()
    reports = []
    for client in clients:
        printed, _ = client.communicate()
        if client.returncode != 0:
            raise SystemExit(f"a benchmark client of {base_url} failed ({client.returncode})")
        reports.append(json.loads(printed))
    return reports


@dataclass
class Side:
    """Every round's client reports for one server."""

    rounds: list[list[dict[str, Any]]] = field(default_factory=list)


def aggregate_tok_s(reports: list[dict[str, Any]]) -> float:
    wall = max(r["done"] for r in reports) - min(r["sent"] for r in reports)
    return sum(completion_tokens(r) for r in reports) / wall


def slowest_first_token_s(reports: list[dict[str, Any]]) -> float:
    return max(r["stamps"][0] - r["sent"] for r in reports)


def single_decode_tok_s(reports: list[dict[str, Any]]) -> float:
    (one,) = reports
    return decode_tok_s(completion_tokens(one), one["stamps"][0], one["stamps"][-1])


def first_token_s(reports: list[dict[str, Any]]) -> float:
    (report,) = reports
    return report["stamps"][0] - report["sent"]


def timed_round(side: Side, server: Server, key: str, texts: list[str]) -> None:
    side.rounds.append(run_clients(server.base_url, key, texts))


Metric = Callable[[list[dict[str, Any]]], float]
Bound = tuple[float, Direction]  # the ratio Hearthside / llama-server must meet


@dataclass
class Scenario:
    title: str
    slots: int
    clients: int
    metrics: tuple[tuple[str, Metric, Bound | None], ...]


SCENARIOS = (
    Scenario(
        f"{CLIENTS} clients, {CLIENTS} slots",
        CLIENTS,
        CLIENTS,
        (
            ("aggregate tok/s", aggregate_tok_s, (TARGET_AGGREGATE, "at least")),
            ("slowest first token s", slowest_first_token_s, (TARGET_SLOWEST_TTFT, "at most")),
        ),
    ),
    Scenario(
        "1 client, 1 slot",
        1,
        1,
        (
            ("decode tok/s", single_decode_tok_s, (TARGET_SINGLE_DECODE, "at least")),
            ("first token s", first_token_s, None),
        ),
    ),
)


ServerPair = Callable[[str, Path], tuple[Server, Server]]  # (key, key file) -> (ours, theirs)


def matched_servers(
    scenario: Scenario, model: Path, config: EngineConfig, ctx: int, binary: Path, work: Path
) -> ServerPair:
    def pair(key: str, key_file: Path) -> tuple[Server, Server]:
        ours = hearthside_server(model, config, scenario.slots, ctx, key_file, work)
        return ours, llama_server(binary, model, config, key, work)

    return pair


def servers_at_their_defaults(
    scenario: Scenario, model: Path, binary: Path, work: Path
) -> ServerPair:
    """Each server as a user starts it with nothing but the model, the address and the key:
    slots, context, threads, batch sizes and KV cache are each one's own choice (their
    loading lines, printed at start, say what they chose)."""

    def pair(key: str, key_file: Path) -> tuple[Server, Server]:
        port = free_port()
        argv = [str(hearthside_command()), "serve", "--model", str(model), "--port", str(port)]
        argv += ["--api-key-file", str(key_file)]
        log = work / f"hearthside-defaults-{scenario.slots}.log"
        ours = Server("Hearthside", argv, port, log, signal.SIGINT)
        port = free_port()
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--no-webui", "--api-key", key]
        log = work / f"llama-server-defaults-{scenario.slots}.log"
        return ours, Server("llama-server", argv, port, log)

    return pair


def measure(scenario: Scenario, servers: ServerPair, rounds: int, work: Path) -> tuple[Side, Side]:
    key = secrets.token_urlsafe(32)
    key_file = work / f"api_key-{scenario.slots}"
    key_file.write_text(key + "\n")
    os.chmod(key_file, 0o600)
    ours, theirs = servers(key, key_file)
    hearthside, native = Side(), Side()
    try:
        for server in (ours, theirs):
            print(f"  starting {server.name}: {' '.join(server.argv)}", file=sys.stderr)
            server.start()
        for server in (ours, theirs):
            server.wait_ready(key)
            for line in server.said(*SLOT_LINES):
                print(f"  {server.name}: {line}", file=sys.stderr)
            began = time.perf_counter()
            run_clients(server.base_url, key, prompts("warm-up", scenario.clients, 0))
            took = time.perf_counter() - began
            print(f"  {server.name}: warm-up round took {took:.1f} s", file=sys.stderr)
        for number in range(rounds):
            texts = prompts(f"round {number + 1}", scenario.clients, number)
            paired(
                functools.partial(timed_round, hearthside, ours, key, texts),
                functools.partial(timed_round, native, theirs, key, texts),
                flip=number % 2 == 1,
            )
            figures = "; ".join(
                f"{name} Hearthside {metric(hearthside.rounds[-1]):.2f}, "
                f"llama-server {metric(native.rounds[-1]):.2f}"
                for name, metric, _target in scenario.metrics
            )
            load = os.getloadavg()[0]  # a busy neighbour on a small machine shows here
            print(
                f"  {scenario.title}, round {number + 1}/{rounds}: {figures} (load {load:.1f})",
                file=sys.stderr,
            )
    finally:
        for server in (ours, theirs):
            server.stop()
    return hearthside, native


# --- the report ----------------------------------------------------------------------------


def summarise(results: list[tuple[Scenario, Side, Side]]) -> dict[str, Any]:
    rows = []
    for scenario, hearthside, native in results:
        for name, metric, bound in scenario.metrics:
            ours = [metric(one) for one in hearthside.rounds]
            theirs = [metric(one) for one in native.rounds]
            rows.append(
                {
                    "scenario": scenario.title,
                    "metric": name,
                    "hearthside": statistics.median(ours),
                    "llama_server": statistics.median(theirs),
                    "ratio": median_ratio(ours, theirs),
                    "bound": None if bound is None else bound[0],
                    "direction": None if bound is None else bound[1],
                }
            )
    per_stream = {
        name: statistics.mean(
            completion_tokens(r)
            for _scenario, *sides in results
            for one in sides[index].rounds
            for r in one
        )
        for index, name in enumerate(("hearthside", "llama_server"))
    }
    return {
        "tokens_counted_by": "usage.completion_tokens",
        "decode_timing": DECODE_RULE,
        "mean_tokens_per_stream": per_stream,
        "rows": rows,
    }


def targets_of(summary: dict[str, Any]) -> list[Target]:
    """The rows with a bound: their ratio Hearthside / llama-server against it."""
    return [
        Target(
            f"{row['scenario']}: {row['metric']}, Hearthside / llama-server",
            row["ratio"],
            row["bound"],
            row["direction"],
        )
        for row in summary["rows"]
        if row["bound"] is not None
    ]


def print_table(summary: dict[str, Any], out: Any) -> None:
    print(
        f"{'scenario':22} {'metric':22} {'Hearthside':>10} {'llama-server':>12} {'ratio':>7}",
        file=out,
    )
    for row in summary["rows"]:
        print(
            f"{row['scenario']:22} {row['metric']:22} {row['hearthside']:10.3f} "
            f"{row['llama_server']:12.3f} {row['ratio']:7.3f}",
            file=out,
        )
    tokens = summary["mean_tokens_per_stream"]
    print(
        f"tokens counted by {summary['tokens_counted_by']}; mean per stream: Hearthside "
        f"{tokens['hearthside']:.1f}, llama-server {tokens['llama_server']:.1f} "
        f"(max_tokens {MAX_TOKENS}); {summary['decode_timing']}",
        file=out,
    )


def default_llama_server() -> Path:
    return (
        Path.home()
        / ".cache"
        / "hearthside-native"
        / llama_cpp.__version__
        / "build"
        / "bin"
        / "llama-server"
    )


def print_scenario_settings(scenario: Scenario, chosen: Any, home_note: str, out: Any) -> list[str]:
    """Everything Hearthside loads with (and where it came from), every setting llama-server
    cannot be given; returns the latter."""
    config: EngineConfig = chosen.config
    unmatched = unmatched_settings(config)
    print_settings(
        f"{scenario.title}: Hearthside (`hearthside serve`)",
        {
            "data folder": home_note,
            "chosen by": f"{chosen.source}: {chosen.why}",
            **config.to_dict(),
            "decode_threads": config.decode_threads,
            "batch_threads": config.batch_threads,
        },
        out,
    )
    print(
        "  llama-server is given the same settings (its full command line follows at start)"
        + ("; NOT matched: " + "; ".join(unmatched) if unmatched else ""),
        file=out,
    )
    return unmatched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per side (>= 3)")
    parser.add_argument("--model", type=Path, help="GGUF to serve (default: the default model)")
    parser.add_argument("--threads", type=int, help="decode threads (default: Hearthside's)")
    parser.add_argument("--ctx", type=int, default=2048, help="context tokens per slot")
    parser.add_argument("--llama-server", type=Path, default=None, help="llama-server binary")
    parser.add_argument(
        "--own-defaults",
        action="store_true",
        help="start each server with only the model, address and key: what a user gets "
        "without tuning either (--threads and --ctx then do not apply)",
    )
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    # A plain `kill` or `timeout` still runs the `finally` that stops both servers.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    if args.rounds < 3:
        parser.error("--rounds must be at least 3: these machines are noisy")
    binary = args.llama_server or default_llama_server()
    if not os.access(binary, os.X_OK):
        script = BUILD_SCRIPT if BUILD_SCRIPT.exists() else "../shared/tools/build-native-llama.sh"
        raise SystemExit(
            f"llama-server is not built ({binary} not found). Build it from the llama.cpp that "
            f"llama-cpp-python {llama_cpp.__version__} vendors with `bash {script}` (4-8 min "
            "on 2 cores; it prints the bin folder), or pass --llama-server PATH."
        )
    out = sys.stderr if args.json else sys.stdout
    results = []
    unmatched: list[str] = []
    with (
        data_home(args.use_my_data) as home,
        tempfile.TemporaryDirectory(prefix="hearthside-parallel-") as scratch,
    ):
        model = (args.model or home.default_chat_model()).resolve()
        print(home.describe(), file=out)
        work = Path(scratch)
        for scenario in SCENARIOS:
            if args.own_defaults:
                print(
                    f"{scenario.title}: both servers at their own defaults (only the model, "
                    "the address and the key given; the slot count is each one's own)",
                    file=out,
                )
                servers = servers_at_their_defaults(scenario, model, binary, work)
            else:
                threads = served_threads(args.threads)
                chosen = hearthside_settings(model, args.ctx, threads, scenario.slots)
                unmatched += print_scenario_settings(scenario, chosen, home.describe(), out)
                servers = matched_servers(scenario, model, chosen.config, args.ctx, binary, work)
            hearthside, native = measure(scenario, servers, args.rounds, work)
            results.append((scenario, hearthside, native))
    summary = summarise(results)
    summary["hearthside_parallel_flag"] = "--parallel" in serve_options()
    summary["settings_not_matched"] = unmatched
    if args.json:
        print(json.dumps(summary, indent=2))
    print_table(summary, out)
    if unmatched:
        print(
            "settings llama-server could not be given: " + "; ".join(unmatched) + ". The ratios "
            "are not like for like; run without --use-my-data for a fresh data folder.",
            file=out,
        )
    return report(targets_of(summary), out)


if __name__ == "__main__":
    sys.exit(main())
