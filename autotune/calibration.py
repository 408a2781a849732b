"""Calibrations in the autotune DB: which report applies to this machine, and its figures.

`hearthside calibrate` stores its report in the autotune DB under the machine's fingerprint,
the one place calibrations are kept; the planner reads the latest one back as the few numbers
its speed model needs. A report measured on other hardware never applies. The
`calibration.json` an older Hearthside kept beside the DB is imported the first time this
machine has none in the DB (`latest_report`), and then left as it was. The figures themselves
are fitted from a report by `calibration_figures.py` (pure, part of the plan); this module is
the store's side: reading and keeping reports and the factors learned since.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

# The fit itself is pure (`calibration_figures.py`); these names are imported from here too.
from hearthside.autotune.calibration_figures import LEARNED as LEARNED
from hearthside.autotune.calibration_figures import describe_figures as describe_figures
from hearthside.autotune.calibration_figures import logits_seconds as logits_seconds
from hearthside.autotune.calibration_figures import planner_figures as fitted_figures
from hearthside.autotune.calibration_figures import thread_figures as thread_figures
from hearthside.autotune.fingerprint import (
    engine_fingerprint,
    machine_fingerprint,
    machine_identity,
)
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.errors import HearthsideError
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import GIB
from hearthside.kernels.engine_run import per_token_work
from hearthside.kernels.results import (
    CalibrationReport,
    legacy_calibration_path,
    read_calibration_file,
)

log = logging.getLogger(__name__)


def store_calibration(report: CalibrationReport, profile: HardwareProfile, db: WisdomDB) -> str:
    """Keep `report` under this machine's fingerprint; returns the fingerprint. The factors
    learned from measured runs go: they corrected the predictions of the calibration before."""
    fingerprint = machine_fingerprint(profile)
    db.note_machine(fingerprint, machine_identity(profile))
    db.save_calibration(fingerprint, report.to_dict())
    db.forget_efficiency(fingerprint)
    return fingerprint


def calibration_for(profile: HardwareProfile, db: WisdomDB) -> dict[str, float]:
    """The planner's figures for this machine: its latest calibration's, the weight types
    measured since against it (`autotune/type_costs.py`), and what the tuner's measured runs
    taught since (`learned_figures`); {} when it was neither calibrated nor measured."""
    return _figures(profile, db, latest_report(profile, db))


def read_machine_context(profile: HardwareProfile, db: WisdomDB) -> MachineContext:
    """This machine's `MachineContext`: its figures (`calibration_for`), the report they come
    from and its fingerprints, read from the DB once."""
    report = latest_report(profile, db)
    return MachineContext(
        profile,
        _figures(profile, db, report),
        report,
        machine_fingerprint(profile),
        engine_fingerprint(profile),
    )


def _figures(
    profile: HardwareProfile, db: WisdomDB, report: CalibrationReport | None
) -> dict[str, float]:
    figures = planner_figures(report) if report is not None else {}
    if report is not None:  # the types measured on demand against it (`type_costs.py`)
        figures = db.type_costs(machine_fingerprint(profile), report.created_at) | figures
    return figures | learned_figures(profile, db)


def latest_report(profile: HardwareProfile, db: WisdomDB) -> CalibrationReport | None:
    """This machine's latest calibration in the DB, or None when it was never calibrated.
    Until it has one there, an old `calibration.json` beside the DB measured on this machine
    is imported first, so upgrading loses nothing."""
    stored = db.latest_calibration(machine_fingerprint(profile))
    if stored is None:
        return import_legacy_calibration(profile, db)
    return CalibrationReport.from_dict(stored)


def import_legacy_calibration(profile: HardwareProfile, db: WisdomDB) -> CalibrationReport | None:
    """Store the data folder's old `calibration.json` when it was measured on this machine;
    the file itself is left as it was. Failing to import is not worth an error for a reader:
    a damaged file is skipped, and a DB busy or read-only now imports it on a later read."""
    path = legacy_calibration_path(db.path.parent)
    try:
        report = read_calibration_file(path)
        if report is None or not measured_on(report, profile):
            return None
        store_calibration(report, profile, db)
    except HearthsideError as error:
        log.warning("not importing %s: %s", path, error.user_text())
        return None
    log.info("imported the calibration of %s from %s", report.created_at, path)
    return report


def measured_on(report: CalibrationReport, profile: HardwareProfile) -> bool:
    """Whether the machine summary stored with `report` (`summarize_machine`) is `profile`'s:
    the same CPU, core counts, memory size and GPUs."""
    machine, cpu = report.machine, profile.cpu
    here = {
        "cpu_model": cpu.model,
        "cpu_arch": cpu.arch,
        "physical_cores": cpu.physical_cores,
        "logical_cores": cpu.logical_cores,
    }
    same_cpu = bool(machine.get("cpu_model")) and all(
        machine.get(name) == value for name, value in here.items()
    )
    memory = machine.get("memory_total_bytes")
    same_memory = memory is None or _gib(memory) == _gib(profile.memory.total_bytes)
    gpus = [gpu.get("name") for gpu in machine.get("gpus") or ()]
    return same_cpu and same_memory and gpus == [gpu.name for gpu in profile.gpus]


def _gib(value: int | None) -> int | None:
    return None if value is None else round(value / GIB)


def learned_figures(profile: HardwareProfile, db: WisdomDB) -> dict[str, float]:
    """`learned_<kind>:<tier>`: measured over predicted speed on this machine and engine, a
    running mean over the tuner's runs of the planner's own picks (`tuner._learn`)."""
    learned = db.efficiencies(machine_fingerprint(profile), engine_fingerprint(profile))
    return {f"{LEARNED}{e.kind}:{e.device}": e.factor for e in learned if e.samples}


def planner_figures(report: CalibrationReport) -> dict[str, float]:
    """The planner's figures from `report` (`calibration_figures.planner_figures`), an older
    report's engine runs costed from their model files where those are still there."""
    return fitted_figures(report, work_from_file)


def work_from_file(model_path: object) -> dict[str, Any]:
    """What a token of the model costs, read from its file if it is still there."""
    path = Path(str(model_path or ""))
    return dict(per_token_work(validate_gguf(path))) if path.is_file() else {}
