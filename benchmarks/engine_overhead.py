"""Hearthside's chat path against a bare llama-cpp-python loop, side by side in one run.

Both sides load the default model with identical llama.cpp settings and see identical prompts.
Runs alternate (bare first, then Hearthside first, ...) so machine noise hits both alike, and
every time is taken from outside, the way a user would feel it:
  prefill: prompt tokens evaluated / (time from request to the first streamed text)
  decode:  (streamed tokens - 1) / (first to last streamed token)
Hearthside's side goes through everything a chat goes through: the EngineService queue and
thread, the sandboxed template, tokenizing, prefix-cache checks, UTF-8 and stop handling.

    .venv/bin/python benchmarks/engine_overhead.py [--repetitions 5] [--json]

Target: Hearthside >= 0.97x the bare loop for both prefill and decode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage
from hearthside.core.engine.service import EngineService
from hearthside.core.models.default_model import ensure_default_model
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir

TARGET_RATIO = 0.97
DECODE_TOKENS = 128
STORY = "Write a long, detailed story about a lighthouse keeper and a storm."


@dataclass
class Sample:
    prefill_tok_s: float
    decode_tok_s: float


def prefill_prompt(repetition: int) -> str:
    """A ~400-token prompt that shares almost nothing with the previous repetition's."""
    facts = " ".join(f"Fact {repetition}-{i}: the number {i * 7 + repetition} is noted." for i in range(40))
    return f"Request {repetition}. Read these notes and reply with OK. {facts}"


class BareLoop:
    """What a minimal llama-cpp-python script does: tokenize, generate, detokenize."""

    def __init__(self, config: EngineConfig) -> None:
        self.llama = llama_cpp.Llama(**config.llama_kwargs(), verbose=False)

    def prefill(self, tokens: list[int]) -> float:
        self.llama.reset()
        start = time.perf_counter()
        for _token in self.llama.generate(tokens, temp=0.0):
            return len(tokens) / (time.perf_counter() - start)
        raise RuntimeError("no token generated")

    def decode(self, tokens: list[int]) -> float:
        self.llama.reset()
        stamps = []
        for token in self.llama.generate(tokens, temp=0.0):
            if llama_cpp.llama_vocab_is_eog(self.llama._model.vocab, token):
                break
            self.llama.detokenize([token])
            stamps.append(time.perf_counter())
            if len(stamps) == DECODE_TOKENS:
                break
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


class HearthsideChat:
    """The same work submitted as chat jobs to a running EngineService."""

    def __init__(self, service: EngineService) -> None:
        self.service = service

    def prefill(self, messages: list[ChatMessage]) -> tuple[float, int]:
        first_text = threading.Event()
        stamp: list[float] = []

        def on_text(_piece: str) -> None:
            if not stamp:
                stamp.append(time.perf_counter())
                first_text.set()

        start = time.perf_counter()
        job = self.service.chat(messages, SamplingParams(temperature=0, max_tokens=1), on_text)
        result = job.result()
        evaluated = result.metrics.prompt_tokens_evaluated
        return evaluated / (stamp[0] - start), evaluated

    def decode(self, messages: list[ChatMessage]) -> float:
        stamps: list[float] = []
        sampling = SamplingParams(temperature=0, max_tokens=DECODE_TOKENS)
        self.service.chat(messages, sampling, lambda _p: stamps.append(time.perf_counter())).result()
        return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def prompt_tokens(service: EngineService, messages: list[ChatMessage]) -> list[int]:
    job = service.call(lambda engine: engine.tokenize_prompt(engine.render_chat(messages)))
    return job.result()


def clear_cache(service: EngineService) -> None:
    """Start Hearthside's decode runs from an empty KV cache, as the bare loop does."""
    service.call(lambda engine: engine.clear_cache()).result()


def measure(config: EngineConfig, repetitions: int) -> tuple[list[Sample], list[Sample]]:
    bare = BareLoop(config)
    bare_samples: list[Sample] = []
    ours: list[Sample] = []
    with EngineService() as service:
        service.load(config).result()
        chat = HearthsideChat(service)
        story = [ChatMessage("user", STORY)]
        story_tokens = prompt_tokens(service, story)
        for repetition in range(repetitions):
            messages = [ChatMessage("user", prefill_prompt(repetition))]
            tokens = prompt_tokens(service, messages)

            def run_bare(tokens: list[int] = tokens) -> None:
                bare_samples.append(Sample(bare.prefill(tokens), bare.decode(story_tokens)))

            def run_ours(messages: list[ChatMessage] = messages) -> None:
                clear_cache(service)
                prefill, _ = chat.prefill(messages)
                clear_cache(service)
                ours.append(Sample(prefill, chat.decode(story)))

            first, second = (run_bare, run_ours) if repetition % 2 == 0 else (run_ours, run_bare)
            first()
            second()
            print(
                f"  run {repetition + 1}/{repetitions}: prefill {ours[-1].prefill_tok_s:7.1f} vs "
                f"{bare_samples[-1].prefill_tok_s:7.1f} tok/s, decode {ours[-1].decode_tok_s:6.1f} "
                f"vs {bare_samples[-1].decode_tok_s:6.1f} tok/s",
                file=sys.stderr,
            )
    bare.llama.close()
    return ours, bare_samples


def summarise(ours: list[Sample], bare: list[Sample]) -> dict[str, float]:
    def median(samples: list[Sample], field: str) -> float:
        return statistics.median(getattr(sample, field) for sample in samples)

    summary = {}
    for field, label in (("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
        summary[f"{label}_hearthside_tok_s"] = median(ours, field)
        summary[f"{label}_bare_tok_s"] = median(bare, field)
        ratios = [getattr(a, field) / getattr(b, field) for a, b in zip(ours, bare, strict=True)]
        summary[f"{label}_ratio"] = statistics.median(ratios)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--model", type=Path, help="GGUF to use (default: the default model)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    model = args.model or ensure_default_model(ModelStore(data_dir())).path
    config = EngineConfig(model_path=str(model), n_ctx=2048)
    print(f"engine_overhead: {model.name}, threads {config.decode_threads}/"
          f"{config.batch_threads}, {args.repetitions} interleaved runs", file=sys.stderr)
    summary = summarise(*measure(config, args.repetitions))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for label in ("prefill", "decode"):
            ratio = summary[f"{label}_ratio"]
            verdict = "ok" if ratio >= TARGET_RATIO else f"BELOW the {TARGET_RATIO} target"
            print(
                f"{label:8} Hearthside {summary[f'{label}_hearthside_tok_s']:8.1f} tok/s   "
                f"bare {summary[f'{label}_bare_tok_s']:8.1f} tok/s   ratio {ratio:.3f}  {verdict}"
            )
    return 0 if min(summary["prefill_ratio"], summary["decode_ratio"]) >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
