"""One hostile client against another's decode: a victim's streaming reply alone and while an
attacker streams `{"type": "string", "minLength": 65536}` (issue 36 1c).

The attack: a JSON string of at least 65536 characters keeps the grammar refusing the closing
quote (and the end of the reply) the model wants to write, and a refusal used to cost a pass
over the whole vocabulary, held by every reply batched beside it (35x slower, measured). The
engine now times each sequence's sampling and keeps a costly one to its fair share of each step
(core/engine/batch.py's FAIR_SAMPLING_SHARE), and the attacker's generation has a time limit
(core/server/generation_limit.py).

`hearthside serve --parallel 2` runs in a subprocess as a user starts it, on a fresh data folder
(a temporary HEARTHSIDE_HOME, the model registered there) unless `--use-my-data`, serving the
default chat model (or `--gemma`: Gemma 3 270M, whose 262144-token vocabulary makes each full
pass costlier; or `--model GGUF`). The victim is a client process of its own (`_sse_client.py`,
greedy, `max_tokens` 128, a new prompt each round); the attacker is another (this script with
`--attacker`), which streams the hostile schema with no `max_tokens` (the server's cap, until
its context is full) and is stopped (it leaves, as a client does) once the victim is done. Each
round measures the victim alone and attacked, the order rotating between rounds, after one
untimed warm-up; in an attacked round the victim starts once the attacker's string has begun
streaming. A third reply per round runs beside a plain client (the attacker's request without
its schema, `--neighbour`): what sharing the engine costs by itself, printed without a target.

    decode tok/s = (usage.completion_tokens - 1) / (last content piece - first content piece)
    slowdown     = median over rounds of (alone decode tok/s / attacked decode tok/s)

    .venv/bin/python benchmarks/hostile_grammar.py [--rounds 5] [--gemma | --model GGUF]
        [--ctx 2048] [--use-my-data] [--json]

Targets: slowdown <= 2x; the attacker was still generating when every attacked victim reply
ended (else that round measured nothing). Prints PASS/MISS and exits 1 on a miss. Each round's
line shows the 1-minute load average: on a small shared machine a busy neighbour moves both.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _setup import add_data_option, data_home
from _sse_client import completion_tokens
from _targets import Target, report
from _timing import DECODE_RULE, decode_tok_s, median_ratio
from parallel_clients import Server, free_port, hearthside_command, prompts, run_clients

TARGET_SLOWDOWN = 2.0  # victim's decode alone / attacked, at most
HOSTILE_SCHEMA = {"type": "string", "minLength": 65536}
SLOTS = 2
KINDS = ("alone", "attacked", "beside plain")


# --- the attacker (a process of its own: `hostile_grammar.py --attacker BASE KEY`) ----------


def attacker_body(hostile: bool) -> dict[str, Any]:
    """The hostile request, or (not `hostile`) the same request without its schema."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Write a long story about the sea."}],
        "stream": True,
    }
    if hostile:
        schema = {"name": "story", "schema": HOSTILE_SCHEMA}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    return body


def attack(base: str, key: str, hostile: bool) -> None:
    """Stream the hostile request; say "streaming" at its first content piece; on SIGTERM
    (or the stream's end) print what came as JSON: pieces, the last one's time, how it ended."""
    seen: dict[str, Any] = {"pieces": 0, "last_piece": None, "ended": "signal", "error": None}
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(0))
    headers = {"Authorization": f"Bearer {key}"}
    timeout = httpx.Timeout(30, read=1800)
    try:
        with (
            httpx.Client(base_url=base, headers=headers, timeout=timeout) as http,
            http.stream("POST", "/chat/completions", json=attacker_body(hostile)) as reply,
        ):
            if reply.status_code != 200:
                reply.read()
                seen["ended"], seen["error"] = "refused", f"HTTP {reply.status_code}: {reply.text}"
                return
            for line in reply.iter_lines():
                note_event(seen, line)
            seen["ended"] = "stream end"
    finally:
        print(json.dumps(seen), flush=True)


def note_event(seen: dict[str, Any], line: str) -> None:
    if not line.startswith("data: {"):
        return
    event = json.loads(line[6:])
    if "error" in event:
        seen["error"] = event["error"].get("message")
    choices = event.get("choices") or [{}]
    if choices[0].get("delta", {}).get("content"):
        if seen["pieces"] == 0:
            print("streaming", flush=True)
        seen["pieces"] += 1
        seen["last_piece"] = time.perf_counter()


class Attacker:
    """The attacker process, from its first streamed piece until `stop`."""

    def __init__(self, base: str, key: str, hostile: bool = True) -> None:
        kind = "--attacker" if hostile else "--neighbour"
        command = [sys.executable, __file__, kind, base, key]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

    def wait_streaming(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()  # "streaming", or its summary
        if line != "streaming":
            self.process.wait()
            raise SystemExit(f"the attacker never streamed: {line}")

    def stop(self) -> dict[str, Any]:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        printed, _ = self.process.communicate(timeout=30)
        lines = printed.strip().splitlines()
        return dict(json.loads(lines[-1])) if lines else {"ended": "no report"}


# --- rounds and what they measure --------------------------------------------------------


@dataclass
class Round:
    """One victim reply alone and one attacked, with the attacker's report for the latter;
    and one beside a plain client (the same request without its schema): what sharing the
    engine costs on its own, a figure without a target."""

    alone: dict[str, Any]
    attacked: dict[str, Any]
    attacker: dict[str, Any]
    beside_plain: dict[str, Any] | None = None
    load: float = field(default_factory=lambda: os.getloadavg()[0])


def victim_decode_tok_s(victim: dict[str, Any]) -> float:
    return decode_tok_s(completion_tokens(victim), victim["stamps"][0], victim["stamps"][-1])


def attacker_outlasted(attacker: dict[str, Any]) -> bool:
    """The attacker was still generating when the victim's reply ended: it streamed, and was
    stopped by us, not by an error, a refusal or the end of its own stream."""
    return attacker.get("ended") == "signal" and attacker.get("pieces", 0) > 0


def slowdown(alone_tok_s: Sequence[float], attacked_tok_s: Sequence[float]) -> float:
    """The median of each round's alone / attacked decode rates."""
    return median_ratio(alone_tok_s, attacked_tok_s)


def targets_of(rounds: Sequence[Round]) -> list[Target]:
    """The victim's slowdown under attack, and whether every attacked round had an attack."""
    if not rounds:
        return [Target("victim decode slowdown, alone / attacked", None, TARGET_SLOWDOWN)]
    alone = [victim_decode_tok_s(one.alone) for one in rounds]
    attacked = [victim_decode_tok_s(one.attacked) for one in rounds]
    return [
        Target(
            "victim decode slowdown, alone / attacked",
            slowdown(alone, attacked),
            TARGET_SLOWDOWN,
            "at most",
        ),
        Target.holds(
            "the attacker was generating throughout every attacked reply",
            all(attacker_outlasted(one.attacker) for one in rounds),
        ),
    ]


def victim_alone(server: Server, key: str, text: str) -> dict[str, Any]:
    (victim,) = run_clients(server.base_url, key, [text])
    return victim


def victim_attacked(
    server: Server, key: str, text: str, hostile: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    attacker = Attacker(server.base_url, key, hostile)
    try:
        attacker.wait_streaming()
        (victim,) = run_clients(server.base_url, key, [text])
    finally:
        seen = attacker.stop()
    return victim, seen


def measure_round(server: Server, key: str, number: int) -> Round:
    """The victim alone, attacked and beside a plain client, in an order that rotates."""
    texts = {kind: prompts(f"round {number} {kind}", 1, number)[0] for kind in KINDS}
    replies: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {}
    for kind in KINDS[number % 3 :] + KINDS[: number % 3]:
        if kind == "alone":
            replies[kind] = (victim_alone(server, key, texts[kind]), None)
        else:
            replies[kind] = victim_attacked(server, key, texts[kind], kind == "attacked")
    (alone, _), (attacked, seen), (plain, _) = (replies[kind] for kind in KINDS)
    assert seen is not None
    return Round(alone, attacked, seen, plain)


def describe(one: Round, number: int, rounds: int) -> str:
    alone, attacked = victim_decode_tok_s(one.alone), victim_decode_tok_s(one.attacked)
    plain = "" if one.beside_plain is None else plain_text(alone, one.beside_plain)
    return (
        f"  round {number}/{rounds}: victim alone {alone:.1f} tok/s, attacked {attacked:.1f} "
        f"tok/s ({alone / attacked:.2f}x){plain}; attacker {one.attacker.get('pieces')} "
        f"pieces, ended by {one.attacker.get('ended')} (load {one.load:.1f})"
    )


def plain_text(alone: float, beside_plain: dict[str, Any]) -> str:
    rate = victim_decode_tok_s(beside_plain)
    return f", beside a plain client {rate:.1f} tok/s ({alone / rate:.2f}x)"


# --- the server and main -----------------------------------------------------------------


def serve(model: Path, ctx: int, key_file: Path, work: Path) -> Server:
    port = free_port()
    argv = [str(hearthside_command()), "serve", "--model", str(model), "--port", str(port)]
    argv += ["--ctx", str(ctx), "--api-key-file", str(key_file), "--parallel", str(SLOTS)]
    return Server("Hearthside", argv, port, work / "hearthside.log", signal.SIGINT)


def run_rounds(model: Path, ctx: int, rounds: int, work: Path) -> list[Round]:
    key = secrets.token_urlsafe(32)
    key_file = work / "api_key"
    key_file.write_text(key + "\n")
    os.chmod(key_file, 0o600)
    server = serve(model, ctx, key_file, work)
    print(f"  starting: {' '.join(server.argv)}", file=sys.stderr)
    server.start()
    measured = []
    try:
        server.wait_ready(key)
        for line in server.said("Loading ", "Answers "):
            print(f"  Hearthside: {line}", file=sys.stderr)
        victim_alone(server, key, prompts("warm-up", 1, 0)[0])
        for number in range(1, rounds + 1):
            measured.append(measure_round(server, key, number))
            print(describe(measured[-1], number, rounds), file=sys.stderr)
    finally:
        server.stop()
    return measured


def summary_of(rounds: Sequence[Round]) -> dict[str, Any]:
    alone = [victim_decode_tok_s(one.alone) for one in rounds]
    attacked = [victim_decode_tok_s(one.attacked) for one in rounds]
    return {
        "decode_timing": DECODE_RULE,
        "victim_alone_tok_s": alone,
        "victim_attacked_tok_s": attacked,
        "median_alone_tok_s": statistics.median(alone),
        "median_attacked_tok_s": statistics.median(attacked),
        "slowdown": slowdown(alone, attacked),
        "slowdown_beside_plain": slowdown(
            alone, [victim_decode_tok_s(one.beside_plain or one.alone) for one in rounds]
        ),
        "load_1min": [one.load for one in rounds],
        "attacker": [one.attacker for one in rounds],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="paired rounds (>= 2)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, help="GGUF to serve (default: the default model)")
    which.add_argument("--gemma", action="store_true", help="serve Gemma 3 270M instead")
    parser.add_argument("--ctx", type=int, default=2048, help="context tokens per slot")
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))  # `finally` stops serve
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    out = sys.stderr if args.json else sys.stdout
    with (
        data_home(args.use_my_data) as home,
        tempfile.TemporaryDirectory(prefix="hearthside-hostile-") as scratch,
    ):
        model = args.model or (home.gemma_model() if args.gemma else home.default_chat_model())
        print(home.describe(), file=out)
        print(f"model: {model}", file=out)
        rounds = run_rounds(model.resolve(), args.ctx, args.rounds, Path(scratch))
    summary = summary_of(rounds)
    if args.json:
        print(json.dumps(summary, indent=2))
    print(
        f"victim decode: alone {summary['median_alone_tok_s']:.1f} tok/s, attacked "
        f"{summary['median_attacked_tok_s']:.1f} tok/s (medians); slowdown beside a plain "
        f"client (no target) {summary['slowdown_beside_plain']:.2f}x; {DECODE_RULE}",
        file=out,
    )
    return report(targets_of(rounds), out)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("--attacker", "--neighbour"):
        attack(sys.argv[2], sys.argv[3], hostile=sys.argv[1] == "--attacker")
        sys.exit(0)
    sys.exit(main())
