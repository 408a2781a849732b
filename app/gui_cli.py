"""`hearthside gui`, and which front end a bare `hearthside` opens.

A bare `hearthside` opens the window where there is a display to put it on, and the terminal
chat (with a one-line notice on stderr) where there is none, e.g. over SSH. PySide6 is
imported only once the window is really wanted, so terminal commands stay quick.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from hearthside.app.cli_support import (
    EXIT_ERROR,
    add_thread_options,
    error_line,
    parallel_requests,
    start_logging,
)
from hearthside.core.errors import HearthsideError
from hearthside.core.paths import data_dir
from hearthside.core.settings import Settings

# Platform plugins that draw on an X server or a Wayland compositor, and what tells us one
# is there. Any other plugin the user names (offscreen, minimal, vnc, eglfs, linuxfb...)
# needs no display server, so it is taken at its word.
_DISPLAY_SERVER_PLUGINS = {"xcb": "DISPLAY", "wayland": "WAYLAND_DISPLAY"}
ALREADY_RUNNING_NOTICE = "Hearthside is already running: its window has been brought to the front."
NO_DISPLAY_NOTICE = (
    "No display found (DISPLAY and WAYLAND_DISPLAY are not set): starting the terminal chat. "
    "Use `hearthside gui` in a desktop session to open the window."
)


def _plugin_has_display(plugin: str, env: Mapping[str, str]) -> bool:
    name = plugin.split(":", 1)[0].strip().lower()
    family = "wayland" if name.startswith("wayland") else name
    variable = _DISPLAY_SERVER_PLUGINS.get(family)
    return bool(env.get(variable)) if variable else bool(name)


def display_available(env: Mapping[str, str] | None = None, platform: str | None = None) -> bool:
    """True when Qt can open a window here (always on macOS and Windows)."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux") and "bsd" not in platform:
        return True
    requested = env.get("QT_QPA_PLATFORM", "").strip()
    if requested:
        return any(_plugin_has_display(plugin, env) for plugin in requested.split(";"))
    return bool(env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"))


def bare_command(env: Mapping[str, str] | None = None, platform: str | None = None) -> str:
    """The subcommand a bare `hearthside` runs: "gui", or "chat" (with a notice)."""
    if display_available(env, platform):
        return "gui"
    print(NO_DISPLAY_NOTICE, file=sys.stderr)
    return "chat"


def add_gui_parser(subparsers: argparse._SubParsersAction) -> None:
    gui = subparsers.add_parser("gui", help="open the Hearthside window (the default command)")
    add_gui_arguments(gui)


def add_gui_arguments(gui: argparse.ArgumentParser) -> None:
    settings = Settings()
    gui.add_argument(
        "--model", default="default", help="registered model id, a GGUF path, or 'default'"
    )
    gui.add_argument("--ctx", type=int, default=settings.context_size, help="context tokens")
    add_thread_options(gui, settings.threads, settings.batch_threads)
    gui.add_argument(
        "--parallel",
        type=parallel_requests,
        default=settings.parallel,
        metavar="N",
        help="requests answered at once, 1 to 64 (default: the window's setting, else the "
        "planner's choice)",
    )
    # For tests, benchmarks and the bundle's smoke run; not shown in --help.
    gui.add_argument("--smoke", action="store_true", help=argparse.SUPPRESS)
    gui.add_argument("--no-probe", action="store_true", help=argparse.SUPPRESS)
    gui.set_defaults(handler=run_gui_command)


def gui_main(argv: Sequence[str]) -> int:
    """`hearthside gui ARGS` without building the whole CLI, whose other subcommands import
    the engine, numpy and the API server at module level: the double-click path stays quick."""
    parser = argparse.ArgumentParser(prog="hearthside gui")
    add_gui_arguments(parser)
    args = parser.parse_args(list(argv))
    start_logging("hearthside gui")
    try:
        return run_gui_command(args)
    except Exception as exc:
        print(error_line(exc), file=sys.stderr)
        return EXIT_ERROR


def run_gui_command(args: argparse.Namespace) -> int:
    if not display_available():
        raise HearthsideError(
            "There is no display to open the Hearthside window on.",
            hint="Run it in a desktop session (or set DISPLAY), or chat in the terminal with "
            "`hearthside chat`.",
        )
    if not args.smoke and _handed_to_running_instance(args):
        return 0
    from hearthside.app.gui.app import run_gui

    return run_gui(args)


def _handed_to_running_instance(args: argparse.Namespace) -> bool:
    """Ask a running Hearthside to show its window, before loading anything heavy."""
    from hearthside.app.gui.single_instance import (
        ActivationRequest,
        ForwardResult,
        forward_to_running_instance,
        instance_key,
    )

    request = ActivationRequest(model=None if args.model == "default" else args.model)
    result = forward_to_running_instance(instance_key(data_dir()), request)
    if result is ForwardResult.NOT_RESPONDING:
        raise HearthsideError(
            "Hearthside is already running but its window is not responding.",
            hint="Wait a moment and start it again, or close the running Hearthside first.",
        )
    if result is ForwardResult.FORWARDED:
        print(ALREADY_RUNNING_NOTICE, file=sys.stderr)
    return result is ForwardResult.FORWARDED
