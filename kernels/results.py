"""`CalibrationReport`: every measurement of one calibration run, and its JSON file form.

The report is frozen data with a JSON round-trip (`schema` versioned, like the hardware
profile). The autotune database keeps them (`autotune/calibration.py`, under the machine's
fingerprint); a JSON file is only an export (`hearthside calibrate --export FILE`) or the
`calibration.json` that Hearthside kept in the data folder before the database did, which is
imported once (`LEGACY_FILE_NAME`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from hearthside.core.errors import HearthsideError
from hearthside.core.paths import make_private_file
from hearthside.core.serialize import from_jsonable, to_jsonable
from hearthside.kernels.measurement import Measurement

SCHEMA_VERSION = 1
# Where reports lived before the autotune database took them over; read only to import them.
LEGACY_FILE_NAME = "calibration.json"
_RECALIBRATE_HINT = "Run `hearthside calibrate` to measure this machine again."


class CalibrationError(HearthsideError):
    """A stored calibration cannot be read."""


def hearthside_version() -> str:
    try:
        return version("hearthside")
    except PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True)
class CalibrationReport:
    schema: int
    created_at: str  # ISO 8601, UTC
    hearthside_version: str
    machine: dict[str, Any]  # a short hardware summary (see calibrate.summarize_machine)
    measurements: tuple[Measurement, ...]
    anomalies: tuple[str, ...]  # plain-language flags, one sentence each
    duration_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(to_jsonable(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CalibrationReport:
        if data.get("schema", SCHEMA_VERSION) > SCHEMA_VERSION:
            raise CalibrationError(
                "This calibration comes from a newer Hearthside.", hint=_RECALIBRATE_HINT
            )
        return from_jsonable(cls, data)

    @classmethod
    def from_json(cls, text: str) -> CalibrationReport:
        return cls.from_dict(json.loads(text))

    def measured(self, kind: str, device: str | None = None) -> list[Measurement]:
        """The successful measurements of `kind` (on `device`, when given)."""
        return [
            m
            for m in self.measurements
            if m.ok and m.kind == kind and (device is None or m.device == device)
        ]

    def best(self, kind: str, device: str = "cpu", **params: Any) -> Measurement | None:
        """The highest successful figure of `kind` on `device` whose params include `params`:
        `best("memory_read")` is the CPU's read bandwidth at its best thread count,
        `best("matmul", dtype="bf16", m=512)` the CPU's best bf16 GEMM."""
        matches = [
            m
            for m in self.measured(kind, device)
            if all(m.params.get(name) == value for name, value in params.items())
        ]
        return max(matches, key=lambda m: m.value, default=None)


def legacy_calibration_path(folder: Path) -> Path:
    """The old `calibration.json` in a data folder."""
    return folder / LEGACY_FILE_NAME


def export_calibration(report: CalibrationReport, path: Path) -> Path:
    """Write `report` to `path` as JSON (mode 0600, replaced atomically)."""
    partial = path.with_name(path.name + ".part")
    make_private_file(partial)
    with partial.open("w", encoding="utf-8") as stream:
        stream.write(report.to_json() + "\n")
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(partial, path)
    return path


def read_calibration_file(path: Path) -> CalibrationReport | None:
    """The report in a JSON file, or None when there is no such file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CalibrationError(
            f"The calibration in {path.name} cannot be read ({error.strerror}).",
            hint=_RECALIBRATE_HINT,
        ) from error
    try:
        return CalibrationReport.from_json(text)
    except (ValueError, KeyError, TypeError) as error:
        raise CalibrationError(
            f"The calibration in {path.name} is damaged.", hint=_RECALIBRATE_HINT
        ) from error
