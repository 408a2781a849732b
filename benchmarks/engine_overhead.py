"""Hearthside's chat path against a bare llama-cpp-python loop, side by side in one run.

Both sides drive the very same loaded `llama_cpp.Llama` (so settings, memory placement and
thread pools are identical; two separately loaded copies differ by a few percent on their own)
and see identical prompt tokens. The bare loop runs on the engine thread as a plain job that
touches the Llama directly. Runs alternate (bare first, then Hearthside first, ...) so
machine noise hits both alike, and every time is taken from outside, as a user feels it:
  prefill: prompt tokens / (time from the request to the first token); the bare loop's
           clock starts before it tokenizes, Hearthside's before it queues, renders the
           template and tokenizes, and stops when its one-token job is done. Reported as the
           median of the ratios of back-to-back pairs.
  decode:  the bare loop: 1 / the median gap between consecutive tokens (the median
           shrugs off the hiccups of a shared machine); Hearthside: the tokens after the
           first over the time their pieces took to arrive (its engine worker sends the
           pieces of fast tokens together, 20 ms apart at least). Reported as the median of
           the ratios of back-to-back pairs of runs, so slow drifts of the machine cancel.
Hearthside's side goes through everything a chat goes through: the EngineService queue and
thread, the sandboxed template, tokenizing, prefix-cache checks, UTF-8 and stop handling.

    .venv/bin/python benchmarks/engine_overhead.py [--repetitions 9] [--json]

Target: Hearthside >= 0.97x the bare loop for both prefill and decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp
from _timing import median_ratio, paired, rate_from_stamps

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.service import EngineService
from hearthside.core.models.default_model import ensure_default_model
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir

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
            return len(tokens) / (time.perf_counter() - start)
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
        return rate_from_stamps(stamps)


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
        return result.metrics.prompt_tokens_evaluated / (time.perf_counter() - start)

    def decode(self, messages: list[ChatMessage]) -> float:
        self.service.call(lambda engine: engine.clear_cache()).result()
        stamps: list[float] = []
        sampling = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS)
        job = self.service.chat(messages, sampling, lambda _p: stamps.append(time.perf_counter()))
        tokens = job.result().metrics.completion_tokens
        # The worker sends pieces that come within 20 ms of its last frame together, so a
        # piece may hold several tokens: the tokens after the first over the time they took
        # to arrive (the first piece goes alone, at once).
        return (tokens - 1) / (stamps[-1] - stamps[0])

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=9)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with ModelStore(data_dir()) as store:
        model = args.model or ensure_default_model(store).path
    config = EngineConfig(model_path=str(model), n_ctx=2048)
    print(
        f"engine_overhead: {model.name}, threads {config.decode_threads}/"
        f"{config.batch_threads}, {args.repetitions} interleaved runs",
        file=sys.stderr,
    )
    summary = summarise(*measure(config, args.repetitions))
    if args.json:
        print(json.dumps(summary, indent=2))
    for label in ("prefill", "decode"):
        ratio = summary[f"{label}_ratio"]
        verdict = "ok" if ratio >= TARGET_RATIO else f"BELOW the {TARGET_RATIO} target"
        print(
            f"{label:8} Hearthside {summary[f'{label}_hearthside_tok_s']:7.1f} tok/s   "
            f"bare {summary[f'{label}_bare_tok_s']:7.1f} tok/s   ratio {ratio:.3f}  {verdict}",
            file=sys.stderr if args.json else sys.stdout,
        )
    return 0 if min(summary["prefill_ratio"], summary["decode_ratio"]) >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
