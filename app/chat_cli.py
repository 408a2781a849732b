"""`hearthside chat` (the terminal chat) and `hearthside bench`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from hearthside.app.cli_support import add_thread_options
from hearthside.app.progress import ProgressLine
from hearthside.app.terminal_chat import (
    DEFAULT_MAX_TOKENS,
    ChatOptions,
    engine_config_for,
    run_one_prompt,
    run_repl,
    status,
)
from hearthside.app.terminal_history import LATEST, Resume
from hearthside.core.engine.bench import BenchReport, run_bench
from hearthside.core.engine.service import EngineService
from hearthside.core.engine.worker_engine import LocalEngine
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
    config = engine_config_for(args.model, args.ctx, args.threads, args.batch_threads)
    status(f"Loading {Path(config.model_path).name} …")
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
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        _print_bench_table(report)
    return 0


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
