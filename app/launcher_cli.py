"""`hearthside install-launcher [--uninstall] [--dry-run] [--desktop]`.

Puts Hearthside in the applications menu (Linux), ~/Applications (macOS) or the Start menu
(Windows), pointing at this installation; `--uninstall` removes exactly what it wrote.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from hearthside.app.cli_support import reports_errors
from hearthside.app.launcher import (
    describe_plan,
    install,
    installed_files,
    plan_install,
    render_icons,
    this_machine,
    uninstall,
)
from hearthside.core.paths import data_dir

NOTHING_INSTALLED = "nothing to remove: no launcher was installed from this data folder"


def add_launcher_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "install-launcher",
        help="add Hearthside to the applications menu (double-click to start)",
        description="Add a Hearthside launcher for this installation: a desktop entry and icon "
        "on Linux, an app in ~/Applications on macOS, a Start-menu shortcut on Windows.",
    )
    parser.add_argument(
        "--uninstall", action="store_true", help="remove the launcher files installed earlier"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be done, change nothing"
    )
    parser.add_argument("--desktop", action="store_true", help="also put a launcher on the desktop")
    parser.set_defaults(handler=reports_errors(run_launcher_command))


def run_launcher_command(args: argparse.Namespace) -> int:
    root = data_dir()
    if args.uninstall:
        return _uninstall(root, args.dry_run)
    plan = plan_install(this_machine(root, _version()), render_icons(), desktop=args.desktop)
    if args.dry_run:
        for line in describe_plan(plan):
            print(f"would {line}" if not line.startswith(" ") else line)
        return 0
    report = install(plan, root)
    for path in report.written:
        print(f"wrote {path}")
    for command in report.commands:
        print(f"ran {command}")
    for warning in report.warnings:
        print(f"note: {warning}", file=sys.stderr)
    print("Hearthside is in your applications now (undo: hearthside install-launcher --uninstall)")
    return 0


def _uninstall(root: Path, dry_run: bool) -> int:
    if dry_run:
        for path in installed_files(root):
            print(f"would remove {path} (if unchanged)")
        if not installed_files(root):
            print(NOTHING_INSTALLED)
        return 0
    report = uninstall(root)
    for path in report.removed:
        print(f"removed {path}")
    for path, why in report.kept:
        print(f"kept {path} ({why})", file=sys.stderr)
    if not report.removed and not report.kept:
        print(NOTHING_INSTALLED)
    return 0


def _version() -> str:
    try:
        return version("hearthside")
    except PackageNotFoundError:
        return "0"
