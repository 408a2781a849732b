"""The `hearthside` command: gui, chat, models, bench... With no subcommand it opens the window.

Only what every command needs is imported here: each subcommand's module (and the engine,
numpy, the API server it may pull in) is imported when the parser is built, and `gui` skips
even that, so a double-click shows the window quickly.

Every command logs to the data dir's log file and keeps a crash report ready (`core/logs.py`);
an unexpected error prints one line naming the log, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from hearthside.app.cli_support import (
    EXIT_ERROR,
    announce_crash_reports,
    error_line,
    hearthside_version,
    start_logging,
)
from hearthside.app.gui_cli import bare_command


def build_parser() -> argparse.ArgumentParser:
    from hearthside.app.calibrate_cli import add_calibrate_parser
    from hearthside.app.chat_cli import add_bench_parser, add_chat_parser
    from hearthside.app.doctor_cli import add_doctor_parser
    from hearthside.app.engine_cli import add_engine_parser
    from hearthside.app.gui_cli import add_gui_parser
    from hearthside.app.launcher_cli import add_launcher_parser
    from hearthside.app.models_cli import add_models_parser
    from hearthside.app.plan_cli import add_plan_parser
    from hearthside.app.probe_cli import add_probe_parser
    from hearthside.app.quality_cli import add_quality_parser
    from hearthside.app.recipe_cli import add_recipe_parser
    from hearthside.app.remote_cli import add_remote_parser
    from hearthside.app.serve_cli import add_serve_parser
    from hearthside.app.tune_cli import add_tune_parser
    from hearthside.app.wisdom_cli import add_wisdom_parser

    parser = argparse.ArgumentParser(
        prog="hearthside",
        description="Run open-weight LLMs on this machine, tuned to this machine.",
    )
    parser.add_argument("--version", action="version", version=f"hearthside {hearthside_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    add_chat_parser(subparsers)
    add_models_parser(subparsers)
    add_bench_parser(subparsers)
    add_probe_parser(subparsers)
    add_engine_parser(subparsers)
    add_serve_parser(subparsers)
    add_plan_parser(subparsers)
    add_recipe_parser(subparsers)
    add_remote_parser(subparsers)
    add_wisdom_parser(subparsers)
    add_tune_parser(subparsers)
    add_quality_parser(subparsers)
    add_calibrate_parser(subparsers)
    add_gui_parser(subparsers)
    add_launcher_parser(subparsers)
    add_doctor_parser(subparsers)
    return parser


def _with_default_command(argv: list[str]) -> list[str]:
    """`hearthside` alone opens the window (the terminal chat where there is no display);
    with only chat options (`hearthside --stats`) it means chat."""
    if not argv:
        return [bare_command()]
    if argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version"):
        return ["chat", *argv]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    arguments = _with_default_command(list(sys.argv[1:] if argv is None else argv))
    if arguments[:1] == ["gui"]:
        from hearthside.app.gui_cli import gui_main

        return gui_main(arguments[1:])
    args = build_parser().parse_args(arguments)
    start_logging(f"hearthside {args.command}")
    announce_crash_reports()
    try:
        return int(args.handler(args))
    except BrokenPipeError:
        return _reader_went_away()
    except Exception as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _reader_went_away() -> int:
    """`hearthside … | head` closed the pipe: not an error. stdout goes to /dev/null so the
    interpreter's last flush does not fail again (Python's documented recipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # what a shell reports for SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
