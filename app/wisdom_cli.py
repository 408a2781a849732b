"""`hearthside wisdom export|import|show`: share what this machine has measured.

A wisdom file carries the autotune database's measurements (runs, a model's chosen settings,
efficiency factors, calibrations) keyed by machine, engine and model fingerprints, so a file
exported on one machine helps only an identical one — and never overrides what that machine
measures itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hearthside.autotune.wisdom import WisdomDB, WisdomError


def add_wisdom_parser(subparsers: argparse._SubParsersAction) -> None:
    wisdom = subparsers.add_parser("wisdom", help="export or import tuning results (JSON)")
    commands = wisdom.add_subparsers(dest="wisdom_command", required=True, metavar="COMMAND")
    exporting = commands.add_parser("export", help="write every measurement to a JSON file")
    exporting.add_argument("file", type=Path, help="where to write ('-' for stdout)")
    exporting.set_defaults(handler=_export)
    importing = commands.add_parser("import", help="merge a file made by `wisdom export`")
    importing.add_argument("file", type=Path)
    importing.set_defaults(handler=_import)
    showing = commands.add_parser("show", help="how much is known, per table")
    showing.set_defaults(handler=_show)


def _export(args: argparse.Namespace) -> int:
    with WisdomDB() as db:
        text = json.dumps(db.export(), indent=1) + "\n"
        if str(args.file) == "-":
            sys.stdout.write(text)
        else:
            args.file.write_text(text, encoding="utf-8")
            print(f"Wrote {args.file}", file=sys.stderr)
    return 0


def _import(args: argparse.Namespace) -> int:
    with WisdomDB() as db:
        try:
            document = json.loads(args.file.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise WisdomError(
                f"Cannot read {args.file} as a wisdom file ({exc}).",
                hint="Choose a file made by `hearthside wisdom export`.",
            ) from exc
        added = db.import_(document)
    print(", ".join(f"{count} {table}" for table, count in added.items()) + " added")
    return 0


def _show(_args: argparse.Namespace) -> int:
    with WisdomDB() as db:
        document = db.export()
    for table in ("machines", "runs", "defaults", "efficiency", "calibrations"):
        print(f"{table:13} {len(document[table])}")
    return 0
