"""The `hearthside` command: gui, chat, models, bench... With no subcommand it opens the window."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hearthside.app.calibrate_cli import add_calibrate_parser
from hearthside.app.engine_cli import add_engine_parser
from hearthside.app.gui_cli import add_gui_parser, bare_command
from hearthside.app.models_cli import add_models_parser
from hearthside.app.plan_cli import add_plan_parser
from hearthside.app.probe_cli import add_probe_parser
from hearthside.app.progress import ProgressLine
from hearthside.app.recipe_cli import add_recipe_parser
from hearthside.app.serve_cli import add_serve_parser
from hearthside.app.terminal_chat import (
    ChatOptions,
    engine_config_for,
    run_one_prompt,
    run_repl,
    status,
)
from hearthside.app.tune_cli import add_tune_parser
from hearthside.app.wisdom_cli import add_wisdom_parser
from hearthside.core.engine.bench import BenchReport, run_bench
from hearthside.core.engine.engine import Engine
from hearthside.core.engine.service import EngineService
from hearthside.core.errors import HearthsideError
from hearthside.core.settings import Settings


def hearthside_version() -> str:
    try:
        return version("hearthside")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hearthside",
        description="Run open-weight LLMs on this machine, tuned to this machine.",
    )
    parser.add_argument("--version", action="version", version=f"hearthside {hearthside_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_chat_parser(subparsers)
    add_models_parser(subparsers)
    _add_bench_parser(subparsers)
    add_probe_parser(subparsers)
    add_engine_parser(subparsers)
    add_serve_parser(subparsers)
    add_plan_parser(subparsers)
    add_recipe_parser(subparsers)
    add_wisdom_parser(subparsers)
    add_tune_parser(subparsers)
    add_calibrate_parser(subparsers)
    add_gui_parser(subparsers)
    return parser


def _add_model_options(parser: argparse.ArgumentParser, settings: Settings) -> None:
    parser.add_argument(
        "--model", default="default", help="registered model id, a GGUF path, or 'default'"
    )
    parser.add_argument("--ctx", type=int, default=settings.context_size, help="context tokens")
    parser.add_argument("--threads", type=int, default=settings.threads, help="decode threads")
    parser.add_argument(
        "--batch-threads", type=int, default=settings.batch_threads, help="prompt threads"
    )


def _add_chat_parser(subparsers: argparse._SubParsersAction) -> None:
    settings = Settings()
    chat = subparsers.add_parser("chat", help="chat in the terminal (the default command)")
    _add_model_options(chat, settings)
    chat.add_argument("--prompt", help="answer this one prompt on stdout and exit")
    chat.add_argument("--system", help="system prompt")
    chat.add_argument("--max-tokens", type=int, default=None, help="longest reply, in tokens")
    chat.add_argument("--temperature", type=float, default=settings.temperature)
    chat.add_argument("--seed", type=int, default=None, help="sampling seed")
    chat.add_argument("--stats", action="store_true", help="print speed after each reply")
    chat.set_defaults(handler=_run_chat)


def _add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
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

        def measure(engine: Engine) -> BenchReport:
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


def _with_default_command(argv: list[str]) -> list[str]:
    """`hearthside` alone opens the window (the terminal chat where there is no display);
    with only chat options (`hearthside --stats`) it means chat."""
    if not argv:
        return [bare_command()]
    if argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        return ["chat", *argv]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_with_default_command(list(sys.argv[1:] if argv is None else argv)))
    try:
        return int(args.handler(args))
    except HearthsideError as exc:
        print(f"error: {exc.user_text()}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
