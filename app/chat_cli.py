"""`hearthside chat` (the terminal chat) and `hearthside bench`."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hearthside.app.cli_support import add_thread_options
from hearthside.app.progress import ProgressLine
from hearthside.app.terminal_chat import (
    DEFAULT_MAX_TOKENS,
    ChatOptions,
    load_settings_for,
    run_one_prompt,
    run_repl,
    status,
)
from hearthside.app.terminal_history import LATEST, Resume
from hearthside.autotune.speed_limit import MachineLoad
from hearthside.autotune.speed_meter import LoadSampler, bench_reading, limit_for_config
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.bench import BenchReport, run_bench
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import LocalEngine
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.settings import Settings


def _add_model_options(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument(
        "--model", default="default", help="registered model id, a GGUF path, or 'default'"
    )
    parser.add_argument("--ctx", type=int, default=settings.context_size, help="context tokens")
    add_thread_options(parser, settings.threads, settings.batch_threads)


def add_chat_parser(subparsers: argparse._SubParsersAction) -> None:
    settings = Settings()
    chat = subparsers.add_parser("chat", help="chat in the terminal (the default command)")
    _add_model_options(chat, settings)
    chat.add_argument("--prompt", help="answer this one prompt on stdout and exit")
    chat.add_argument("--system", help="system prompt")
    chat.add_argument(
        "--max-tokens",
        type=_reply_tokens,
        default=DEFAULT_MAX_TOKENS,
        help=f"longest reply, in tokens (default {DEFAULT_MAX_TOKENS}, as in the window; "
        "0: until the model stops or the context is full)",
    )
    chat.add_argument("--temperature", type=float, default=settings.temperature)
    chat.add_argument("--seed", type=int, default=None, help="sampling seed")
    chat.add_argument("--stats", action="store_true", help="print speed after each reply")
    chat.add_argument(
        "--resume",
        nargs="?",
        const=LATEST,
        type=_chat_id,
        metavar="ID",
        help="continue a saved chat (the latest without ID; /history lists them)",
    )
    chat.add_argument(
        "--no-history", action="store_true", help="do not save this chat in the history"
    )
    chat.set_defaults(handler=_run_chat)


def _reply_tokens(text: str) -> int | None:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"a number of tokens (0: no limit), not {text!r}")
    return int(text) or None


def _chat_id(text: str) -> Resume:
    if text == LATEST:  # argparse passes the bare flag's const through here too
        return LATEST
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"a chat id is a number (see /history), not {text!r}")
    return int(text)


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    settings = Settings()
    bench = subparsers.add_parser("bench", help="measure prompt and generation speed")
    _add_model_options(bench, settings)
    bench.add_argument("-p", "--n-prompt", type=int, default=512, help="prompt tokens (ppN)")
    bench.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens (tgN)")
    bench.add_argument("-r", "--repetitions", type=int, default=5, help="timed repetitions")
    bench.add_argument("--warmup-s", type=float, default=1.0, help="warm-up time per test")
    bench.add_argument("--json", action="store_true", help="print the report as JSON")
    bench.set_defaults(handler=_run_bench)


def _chat_options(args: argparse.Namespace) -> ChatOptions:
    return ChatOptions(
        model=args.model,
        n_ctx=args.ctx,
        n_threads=args.threads,
        n_threads_batch=args.batch_threads,
        system_prompt=args.system,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        seed=args.seed,
        show_stats=args.stats,
        resume=args.resume,
        keep_history=not args.no_history,
    )


def _run_chat(args: argparse.Namespace) -> int:
    options = _chat_options(args)
    if args.prompt is not None:
        return run_one_prompt(options, args.prompt)
    return run_repl(options)


def _run_bench(args: argparse.Namespace) -> int:
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    chosen = load_settings_for(
        args.model, args.ctx, args.threads, args.batch_threads, profile, n_parallel=1
    )
    config = chosen.config  # one slot: what the bench measures is one request
    status(f"Loading {Path(config.model_path).name} …")
    sampler = LoadSampler(profile.cpu.numa_nodes)
    with EngineService() as service, ProgressLine("Measuring") as line:
        service.load(config).result()

        def measure(engine: LocalEngine) -> BenchReport:
            return run_bench(
                engine,
                n_prompt=args.n_prompt,
                n_gen=args.n_gen,
                repetitions=args.repetitions,
                warmup_s=args.warmup_s,
                progress=lambda test, done, total: line.show(f"{test}, run {done} of {total}"),
            )

        report = service.call(measure, "bench").result()
        load = sampler.sample()  # what else ran meanwhile: while the worker still counts as ours
    report = replace(report, speed_of_light=bench_speed_of_light(report, config, profile, load))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_bench_table(report)
        print(speed_of_light_text(report.speed_of_light))
    return 0


def bench_speed_of_light(
    report: BenchReport, config: EngineConfig, profile: HardwareProfile, load: MachineLoad
) -> dict[str, Any] | None:
    """The tgN median against this machine's limit for `config` as it ran (its threads
    resolved), with the likely cause when it is far below; None without a limit."""
    decode = report.decode
    if decode is None:
        return None
    as_run = config.with_changes(n_threads=report.config["n_threads"])
    with WisdomDB() as wisdom:
        limit = limit_for_config(as_run, profile, wisdom)
    if limit is None:
        return None
    speed = bench_reading(limit, decode.median_tok_s, decode.n_tokens, load)
    return {"test": decode.test, **speed.to_dict(), "limit": limit.to_dict()}


def speed_of_light_text(figures: dict[str, Any] | None) -> str:
    """The bench's line on the share of this machine's limit, and why when it is low."""
    if figures is None:
        return (
            "speed of light: unknown, because this machine's memory bandwidth has not been "
            "measured (`hearthside calibrate` measures it)."
        )
    lines = [
        f"speed of light: {figures['test']} reached {figures['summary']} "
        f"({figures['measured_tps']:.1f} of {figures['limit_tps']:.1f} tok/s).",
        f"  {figures['explanation']}",
    ]
    if figures["cause"]:
        lines += [f"  Why it is slower: {figures['cause']}", f"  What to do: {figures['fix']}"]
    return "\n".join(lines)


def _print_bench_table(report: BenchReport) -> None:
    config = report.config
    print(f"model: {report.model}   llama-cpp-python {report.engine_version}")
    print(
        f"threads {config['n_threads']}/{config['n_threads_batch']}   ctx {config['n_ctx']}   "
        f"batch {config['n_batch']}   gpu layers {config['n_gpu_layers']}"
    )
    print(f"{'test':>8} {'tok/s (median)':>16} {'± stdev':>10} {'runs':>5}")
    for stat in report.results:
        print(
            f"{stat.test:>8} {stat.median_tok_s:16.1f} {stat.stdev_tok_s:10.1f} "
            f"{len(stat.samples_tok_s):5d}"
        )
