"""Hearthside's chat path against a bare llama-cpp-python loop, side by side in one run.

Both sides drive the very same loaded `llama_cpp.Llama` (so settings, memory placement and
thread pools are identical; two separately loaded copies differ by a few percent on their own)
and see identical prompt tokens. The bare loop runs on the engine thread as a plain job that
touches the Llama directly. Runs alternate (bare first, then Hearthside first, ...) so
machine noise hits both alike, and every time is taken from outside, as a user feels it, by
the same rule on both sides (benchmarks/_timing.py):
  prefill: prompt tokens / (first token out - request made); the bare loop's clock starts
           before it tokenizes, Hearthside's before it queues, renders the template and
           tokenizes; it stops at the first generated token (Hearthside: its one-token job
           done). Both sides count the same prompt tokens (checked equal).
  decode:  (completion tokens - 1) / (last token's arrival - first token's arrival); the bare
           loop stamps each token as it is detokenized, Hearthside each text piece as it
           arrives and counts tokens by the job's metrics (its engine worker sends the pieces
           of fast tokens together, so a piece may hold several tokens; the first and the
           last arrive alone).
Each is reported as the median of the ratios of back-to-back pairs, so slow drifts of the
machine cancel.
Hearthside's side goes through everything a chat goes through: the EngineService queue and
thread, the sandboxed template, tokenizing, prefix-cache checks, UTF-8 and stop handling.

    .venv/bin/python benchmarks/engine_overhead.py [--repetitions 9] [--model GGUF]
        [--threads N] [--use-my-data] [--json]

Runs on a fresh data folder with the default chat model registered there unless
`--use-my-data`. Target: Hearthside >= 0.97x the bare loop for both prefill and decode;
exit status 1 on a miss. On a busy machine, `--threads` below the core count (decode and
prompt threads alike) keeps llama.cpp's threads from waiting on one another for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from _setup import add_data_option, data_home, print_settings
from _targets import Target, report
from _timing import DECODE_RULE, PREFILL_RULE, decode_tok_s, median_ratio, paired, prefill_tok_s

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.service import EngineService

TARGET_RATIO = 0.97
DECODE_TOKENS = 128
STORY = [ChatMessage("user", "Write a long, detailed story about a lighthouse keeper and a storm.")]


@dataclass
class Side:
    """What one side measured, run by run."""

    prefill_tok_s: list[float] = field(default_factory=list)
    decode_tok_s: list[float] = field(default_factory=list)


def prefill_messages(repetition: int) -> list[ChatMessage]:
    """A ~400-token prompt that shares almost nothing with the previous repetition's."""
    notes = " ".join(
        f"Note {repetition}-{i}: the number {i * 7 + repetition} is kept." for i in range(40)
    )
    return [ChatMessage("user", f"Request {repetition}. Read these notes, then say OK. {notes}")]


class BareLoop:
    """What a minimal llama-cpp-python script does: tokenize, generate, detokenize."""

    def __init__(self, llama: llama_cpp.Llama) -> None:
        self.llama = llama
        self.vocab = llama._model.vocab

    def tokenize(self, text: str) -> list[int]:
        return self.llama.tokenize(text.encode(), add_bos=False, special=True)

    def prefill(self, prompt: str) -> float:
        self.llama.reset()
        start = time.perf_counter()
        tokens = self.tokenize(prompt)
        for _token in self.llama.generate(tokens, temp=0.0):
            return prefill_tok_s(len(tokens), start, time.perf_counter())
        raise RuntimeError("no token generated")

    def decode(self, prompt: str) -> float:
        self.llama.reset()
        stamps: list[float] = []
        for token in self.llama.generate(self.tokenize(prompt), temp=0.0):
            if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                break
            self.llama.detokenize([token])
            stamps.append(time.perf_counter())
            if len(stamps) == DECODE_TOKENS:
                break
        return decode_tok_s(len(stamps), stamps[0], stamps[-1])


class HearthsideChat:
    """The same work, submitted as chat jobs to a running EngineService."""

    def __init__(self, service: EngineService) -> None:
        self.service = service

    def prefill(self, messages: list[ChatMessage]) -> float:
        self.service.call(lambda engine: engine.clear_cache()).result()
        start = time.perf_counter()
        # One token: the reply is over when the first token is out. (Its text may be empty —
        # leading whitespace is trimmed — so the end of the job is the clock, not on_text.)
        result = self.service.chat(messages, SamplingParams(temperature=0, max_tokens=1)).result()
        return prefill_tok_s(result.metrics.prompt_tokens_evaluated, start, time.perf_counter())

    def decode(self, messages: list[ChatMessage]) -> float:
        self.service.call(lambda engine: engine.clear_cache()).result()
        stamps: list[float] = []
        sampling = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS)
        job = self.service.chat(messages, sampling, lambda _p: stamps.append(time.perf_counter()))
        tokens = job.result().metrics.completion_tokens
        return decode_tok_s(tokens, stamps[0], stamps[-1])

    def prompt_as_text(self, messages: list[ChatMessage]) -> str:
        """Our prompt as text with BOS written out, so the bare loop gets the same tokens."""

        def text(engine: Engine) -> str:
            rendered = engine.render_chat(messages)
            bos = engine.chat_template.bos_token
            return rendered if rendered.startswith(bos) else bos + rendered

        return self.service.call(text).result()

    def prompt_tokens(self, messages: list[ChatMessage]) -> list[int]:
        job = self.service.call(lambda e: e.tokenize_prompt(e.render_chat(messages)))
        return job.result()


PREFILL_PAIRS_PER_RUN = 3


def measure(config: EngineConfig, repetitions: int) -> tuple[Side, Side]:
    bare, ours = Side(), Side()
    # In-process, so the bare loop can drive the very same Llama (benchmarks/worker_overhead.py
    # compares the worker process with this in-process engine).
    with EngineService(engine_factory=Engine) as service:
        service.load(config).result()
        bare_loop = BareLoop(service.call(lambda engine: engine.llama).result())
        chat = HearthsideChat(service)
        story = chat.prompt_as_text(STORY)

        def bare_job(fn: Callable[[], float]) -> float:
            return service.call(lambda _engine: fn()).result()

        for repetition in range(repetitions):
            for pair in range(PREFILL_PAIRS_PER_RUN):
                messages = prefill_messages(repetition * PREFILL_PAIRS_PER_RUN + pair)
                prompt = chat.prompt_as_text(messages)
                if bare_loop.tokenize(prompt) != chat.prompt_tokens(messages):
                    raise RuntimeError("both sides must evaluate the same tokens")
                paired(
                    lambda p=prompt: bare.prefill_tok_s.append(
                        bare_job(lambda: bare_loop.prefill(p))
                    ),
                    lambda m=messages: ours.prefill_tok_s.append(chat.prefill(m)),
                    flip=pair % 2 == 1,
                )
            paired(
                lambda: bare.decode_tok_s.append(bare_job(lambda: bare_loop.decode(story))),
                lambda: ours.decode_tok_s.append(chat.decode(STORY)),
                flip=repetition % 2 == 1,
            )
            print(
                f"  run {repetition + 1}/{repetitions}: prefill {ours.prefill_tok_s[-1]:6.1f} vs "
                f"{bare.prefill_tok_s[-1]:6.1f} tok/s, decode {ours.decode_tok_s[-1]:5.1f} vs "
                f"{bare.decode_tok_s[-1]:5.1f} tok/s",
                file=sys.stderr,
            )
    return ours, bare


def summarise(ours: Side, bare: Side) -> dict[str, float]:
    summary = {}
    for label in ("prefill", "decode"):
        mine, theirs = getattr(ours, f"{label}_tok_s"), getattr(bare, f"{label}_tok_s")
        summary[f"{label}_hearthside_tok_s"] = statistics.median(mine)
        summary[f"{label}_bare_tok_s"] = statistics.median(theirs)
        summary[f"{label}_ratio"] = median_ratio(mine, theirs)
    return summary


def targets_of(summary: dict[str, float]) -> list[Target]:
    return [
        Target(f"{label} tok/s, Hearthside / bare loop", summary[f"{label}_ratio"], TARGET_RATIO)
        for label in ("prefill", "decode")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument(
        "--threads", type=int, help="decode and prompt threads (default: the engine's own)"
    )
    parser.add_argument("--json", action="store_true")
    add_data_option(parser)
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    with data_home(args.use_my_data) as home:
        model = args.model or home.default_chat_model()
        config = EngineConfig(
            model_path=str(model), n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads
        )
        print(home.describe(), file=out)
        print_settings(
            "both sides (one Engine, one loaded llama_cpp.Llama)",
            {
                **config.to_dict(),
                "decode_threads": config.decode_threads,
                "batch_threads": config.batch_threads,
                "decode prompt": STORY[0].content,
                "max_tokens": DECODE_TOKENS,
                "temperature": 0,
                "interleaved runs": args.repetitions,
                "prefill pairs per run": PREFILL_PAIRS_PER_RUN,
                "prefill timing": PREFILL_RULE,
                "decode timing": DECODE_RULE,
                "tokens counted by": "bare loop: tokens generated; Hearthside: the job's metrics",
                "load average": os.getloadavg(),
            },
            out,
        )
        summary = summarise(*measure(config, args.repetitions))
    if args.json:
        print(json.dumps(summary, indent=2))
    for label in ("prefill", "decode"):
        print(
            f"{label:8} Hearthside {summary[f'{label}_hearthside_tok_s']:7.1f} tok/s   "
            f"bare {summary[f'{label}_bare_tok_s']:7.1f} tok/s   ratio "
            f"{summary[f'{label}_ratio']:.3f}",
            file=out,
        )
    return report(targets_of(summary), out)


if __name__ == "__main__":
    sys.exit(main())
