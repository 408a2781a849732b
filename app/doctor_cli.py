"""`hearthside doctor`: everything someone helping you needs, on one screen — the version,
where the data, logs and crash reports are, the engine build and its self-test, and the
models. It only reads; nothing is installed or rebuilt."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hearthside.app.cli_support import hearthside_version, reports_errors
from hearthside.core.logs import crash_reports, log_file
from hearthside.core.models.store import DB_FILE_NAME, ModelStore
from hearthside.core.paths import cache_dir, data_dir
from hearthside.core.probe.engine_ladder import (
    library_identity,
    read_record,
    record_rows,
)


def add_doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = subparsers.add_parser(
        "doctor",
        help="where the logs are, the engine build and its self-test, the models",
        description="Print what someone helping you needs: version, folders, logs, crash "
        "reports, the engine build and its self-test, and the installed models.",
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.set_defaults(handler=_doctor)


@reports_errors
def _doctor(args: argparse.Namespace) -> int:
    report = doctor_report(data_dir())
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(doctor_lines(report)))
    return 0


def doctor_report(root: Path) -> dict[str, Any]:
    record = read_record(root)
    current = record is not None and record.self_test.library == library_identity()
    return {
        "version": hearthside_version(),
        "python": sys.version.split()[0],
        "data_folder": str(root),
        "cache_folder": str(cache_dir()),
        "log_file": str(log_file(root)),
        "crash_reports": [str(path) for path in crash_reports(root)],
        "engine": record.to_dict() if record is not None else None,
        "engine_rows": record_rows(record, current),
        "self_test_current": current,
        "models": _models(root),
    }


def _models(root: Path) -> list[dict[str, Any]]:
    if not (root / DB_FILE_NAME).exists():
        return []  # do not create a registry just to look
    with ModelStore(root) as store:
        return [
            {
                "id": record.id,
                "path": str(record.path),
                "present": record.path.is_file(),
                "size_bytes": record.size_bytes,
                "default": record.is_default,
            }
            for record in store.list()
        ]


def doctor_lines(report: dict[str, Any]) -> list[str]:
    lines = [
        f"Hearthside {report['version']} (Python {report['python']})",
        f"data folder:   {report['data_folder']}",
        f"cache folder:  {report['cache_folder']}",
        f"log file:      {report['log_file']}",
    ]
    crashes = report["crash_reports"]
    lines.append(f"crash reports: {len(crashes) or 'none'}")
    lines += [f"  {path}" for path in crashes]
    lines.append("engine:")
    lines += [f"  {label.lower()}: {text}" for label, text in report["engine_rows"]]
    models = report["models"]
    lines.append(f"models: {len(models) or 'none installed yet'}")
    for model in models:
        flags = " (default)" if model["default"] else ""
        missing = "" if model["present"] else "  FILE MISSING"
        lines.append(f"  {model['id']}{flags}: {model['path']}{missing}")
    return lines
