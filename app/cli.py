"""The `hearthside` command: gui, chat, models, bench... With no subcommand it opens the window.

Only what every command needs is imported here: the module of the command being run (and the
engine, numpy, the API server it may pull in) is imported when its parser is built, the other
commands' modules never, and `gui` skips even that, so a double-click shows the window quickly.

Every command logs to the data dir's log file and keeps a crash report ready (`core/logs.py`);
an unexpected error prints one line naming the log, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
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

# Each command, in the order `hearthside --help` lists them, with the module and function that
# add it. Only the module of the command being run is imported: `hearthside models list` need
# not load the engine, numpy and the API server that `serve` and `tune` import (1.3 s to 0.4 s).
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("chat", "hearthside.app.chat_cli", "add_chat_parser"),
    ("models", "hearthside.app.models_cli", "add_models_parser"),
    ("bench", "hearthside.app.chat_cli", "add_bench_parser"),
    ("probe", "hearthside.app.probe_cli", "add_probe_parser"),
    ("engine", "hearthside.app.engine_cli", "add_engine_parser"),
    ("serve", "hearthside.app.serve_cli", "add_serve_parser"),
    ("plan", "hearthside.app.plan_cli", "add_plan_parser"),
    ("recipe", "hearthside.app.recipe_cli", "add_recipe_parser"),
    ("remote", "hearthside.app.remote_cli", "add_remote_parser"),
    ("wisdom", "hearthside.app.wisdom_cli", "add_wisdom_parser"),
    ("tune", "hearthside.app.tune_cli", "add_tune_parser"),
    ("quality", "hearthside.app.quality_cli", "add_quality_parser"),
    ("calibrate", "hearthside.app.calibrate_cli", "add_calibrate_parser"),
    ("gui", "hearthside.app.gui_cli", "add_gui_parser"),
    ("install-launcher", "hearthside.app.launcher_cli", "add_launcher_parser"),
    ("doctor", "hearthside.app.doctor_cli", "add_doctor_parser"),
)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of `command` alone when it is one of them (the others
    are then neither imported nor offered)."""
    parser = argparse.ArgumentParser(
        prog="hearthside",
        description="Run open-weight LLMs on this machine, tuned to this machine.",
    )
    parser.add_argument("--version", action="version", version=f"hearthside {hearthside_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    known = {name for name, _module, _adder in COMMANDS}
    for name, module, adder in COMMANDS:
        if command in known and name != command:
            continue
        getattr(importlib.import_module(module), adder)(subparsers)
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
    args = build_parser(arguments[0]).parse_args(arguments)
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
