"""Does speculative decoding pay on this machine? Prompt lookup and a draft model, side by side.

On the default model (Gemma 3 270M Q4_K_M) and a code-editing prompt (the reply repeats the
file it was shown) and a free-form prompt (chat):
1. speed-up ratios of decode with prompt lookup and with a draft model (the default model
   re-quantized to Q4_0, made here) over plain decode, measured in alternating runs in the
   same session (`compare_speculation`), with acceptance and TTFT;
2. the tuner's decision for each workload (`decide_speculation`, a fresh autotune DB), which
   switches a kind on only where its measured gain is above 1.05x.

    .venv/bin/python benchmarks/speculative.py [--repetitions 3] [--first-prompt-only] [--json]
        [--parallel N] [--use-my-data]

Targets: prompt lookup (its better k) on the code edit >= 1.05x (the tuner's MIN_GAIN), and
the tuner switches prompt lookup on there; on the free-form prompt (chat) the tuner leaves
speculation off unless it measured a gain above 1.05x. Exit status 1 on any miss.

With `--parallel N` the model loads with N slots and the ratios are those of a single client
on that server: it generates alone, so it speculates (core/engine/batch.py); the tuner's
decisions, measured with one slot, are left out, and so are their targets. Compare the ratios
with a one-slot run's by eye. Runs on a fresh data folder unless `--use-my-data` (the tuner's
decisions always go to a private autotune DB).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import llama_cpp
from _setup import add_data_option, data_home, print_settings
from _targets import Target, report

from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.speculative import (
    MIN_GAIN,
    SpeculationDecision,
    Workload,
    describe,
    load_workloads,
)
from hearthside.autotune.tuner import decide_speculation
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.bench import compare_speculation
from hearthside.core.engine.config import EngineConfig, SamplingParams, SpeculativeConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.probe.runner import probe_hardware

Q4_0 = 2  # llama_ftype


def requantized(source: Path, folder: Path) -> Path:
    target = folder / f"{source.stem}-Q4_0.gguf"
    if not target.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = Q4_0
        params.allow_requantize = True
        returned = llama_cpp.llama_model_quantize(
            str(source).encode(), str(target).encode(), ctypes.byref(params)
        )
        if returned != 0:
            raise SystemExit("quantizing the draft failed")
    return target


def settings(draft: Path) -> dict[str, SpeculativeConfig]:
    return {
        "prompt lookup k=8": SpeculativeConfig(mode="prompt_lookup", draft_tokens=8, ngram_size=3),
        "prompt lookup k=4": SpeculativeConfig(mode="prompt_lookup", draft_tokens=4, ngram_size=3),
        "draft Q4_0 k=4": SpeculativeConfig(
            mode="draft_model", draft_tokens=4, draft_model_path=str(draft)
        ),
    }


def measure_ratios(
    engine: Engine, workloads: list[Workload], draft: Path, repetitions: int, first_only: bool
) -> list[dict[str, Any]]:
    rows = []
    for workload in workloads:
        chosen = workload.prompts[:1] if first_only else workload.prompts
        prompts = [engine.tokenize_prompt(prompt.completion) for prompt in chosen]
        sampling = SamplingParams(
            temperature=workload.temperature, seed=workload.seed, max_tokens=workload.max_tokens
        )
        for name, speculative in settings(draft).items():
            comparison = compare_speculation(
                engine, prompts, speculative, sampling, repetitions=repetitions
            )
            rows.append({"workload": workload.id, "setting": name, **comparison.to_dict()})
            print(_row_text(rows[-1]), file=sys.stderr, flush=True)
    return rows


def tuner_decisions(
    model: Path, workloads: list[Workload], draft: Path, folder: Path
) -> list[SpeculationDecision]:
    profile = probe_hardware()
    key = tuning_key(profile, model)
    config = EngineConfig(str(model), n_ctx=2048).to_dict()
    with WisdomDB(folder / "wisdom.db") as wisdom:
        return list(
            decide_speculation(wisdom, key, model, config, workloads=workloads, drafts=[draft])
        )


def _row_text(row: dict[str, Any]) -> str:
    stats = row["stats"] or {}
    rate = stats.get("acceptance_rate")
    ttft = f"{row['plain_ttft_s'] or 0:.2f}/{row['speculative_ttft_s'] or 0:.2f}"
    return (
        f"{row['workload']:10} {row['setting']:18} {row['plain_decode_tok_s']:6.1f} -> "
        f"{row['speculative_decode_tok_s']:6.1f} tok/s  {row['speedup']:5.2f}x  "
        f"acceptance {'-' if rate is None else f'{rate:4.0%}'}  "
        f"mean accepted {stats.get('mean_accepted_length') or 0:4.1f}  TTFT s {ttft}  "
        f"{'same tokens' if row['identical'] else 'tokens differ (batch rounding)'}"
    )


def targets_of(rows: Sequence[dict[str, Any]], decisions: Sequence[dict[str, Any]]) -> list[Target]:
    """`rows`: the measured ratios (`measure_ratios`); `decisions`: the tuner's per workload
    (`SpeculationDecision.to_dict()`), empty where they were not measured (`--parallel`)."""
    lookup = [
        row["speedup"]
        for row in rows
        if row["workload"] == "code_edit" and row["setting"].startswith("prompt lookup")
    ]
    targets = [
        Target("code edit: prompt lookup speed-up (better k)", max(lookup, default=None), MIN_GAIN)
    ]
    if not decisions:
        return targets
    by_workload = {decision["workload"]: decision for decision in decisions}
    code_edit, chat = by_workload.get("code_edit"), by_workload.get("chat")
    targets.append(
        Target.holds(
            "code edit: the tuner switches prompt lookup on",
            None if code_edit is None else code_edit["chosen"]["mode"] == "prompt_lookup",
        )
    )
    targets.append(
        Target.holds(
            f"chat: speculation off unless its measured gain > {MIN_GAIN}",
            None if chat is None else _off_or_paid(chat),
        )
    )
    return targets


def _off_or_paid(decision: dict[str, Any]) -> bool:
    if decision["chosen"]["mode"] == "off":
        return True
    return decision["gain"] is not None and decision["gain"] > MIN_GAIN


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument(
        "--first-prompt-only", action="store_true", help="one prompt per workload (a busy machine)"
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--parallel", type=int, default=1, help="slots the model loads with")
    add_data_option(parser)
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    by_id = {workload.id: workload for workload in load_workloads()}
    workloads = [by_id["code_edit"], by_id["chat"]]
    with (
        data_home(args.use_my_data) as home,
        tempfile.TemporaryDirectory(prefix="hearthside-spec-") as name,
    ):
        folder = Path(name)
        model = home.gemma_model()
        draft = requantized(model, folder)
        config = EngineConfig(str(model), n_ctx=2048, n_parallel=args.parallel)
        print(home.describe(), file=out)
        print_settings(
            "engine (plain and speculative runs alike)",
            {
                **config.to_dict(),
                "decode_threads": config.decode_threads,
                "batch_threads": config.batch_threads,
                "speculative settings": {k: asdict(v) for k, v in settings(draft).items()},
                "workloads": [w.id for w in workloads],
                "repetitions": args.repetitions,
                "prompts": "first per workload" if args.first_prompt_only else "all",
                "tuner": "fresh autotune DB" if args.parallel == 1 else "not run (--parallel)",
            },
            out,
        )
        engine = Engine(config)
        try:
            rows = measure_ratios(
                engine, workloads, draft, args.repetitions, args.first_prompt_only
            )
        finally:
            engine.close()
        decisions = tuner_decisions(model, workloads, draft, folder) if args.parallel == 1 else []
    decided = [decision.to_dict() for decision in decisions]
    if args.json:
        print(json.dumps({"ratios": rows, "decisions": decided}, indent=1, default=str))
    else:
        print_results(rows, decisions, args.parallel)
    return report(targets_of(rows, decided), out)


def print_results(
    rows: list[dict[str, Any]], decisions: list[SpeculationDecision], slots: int
) -> None:
    shown = f", {slots} slots, one client" if slots > 1 else ""
    print(f"speed-up over plain decode, same session, alternating runs (median of runs){shown}:")
    for row in rows:
        print("  " + _row_text(row))
    if decisions:
        print("tuner's decision per workload:")
    for decision in decisions:
        chosen = describe(decision.chosen)
        print(f"  {decision.workload:10} {chosen:28} {decision.reason}")


if __name__ == "__main__":
    sys.exit(main())
