"""This machine as the planner and the tuner see it: `MachineContext`.

The hardware profile, the planner's figures from this machine's calibration (and what the
tuner's runs taught since), the calibration report they come from, and the fingerprints that
key this machine's measurements in the autotune DB. It is read once (`optimize.machine_context`,
`calibration.read_machine_context`) and passed down, so the window's pages, the wizard and
the CLI all plan with the same figures; after a calibration or a tuning it is read again and
handed on (the window's `MachineState`).

Plain data, part of the plan (`autotune/parts.py`): nothing here reads a file or the DB.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.results import CalibrationReport


@dataclass(frozen=True)
class MachineContext:
    profile: HardwareProfile
    # the planner's figures (`calibration_for`); {} when never calibrated nor measured
    calibration: dict[str, float] = field(default_factory=dict)
    report: CalibrationReport | None = None  # this machine's latest calibration
    machine: str = ""  # `fingerprint.machine_fingerprint(profile)`
    engine: str = ""  # `fingerprint.engine_fingerprint(profile)`

    @property
    def calibrated(self) -> bool:
        return self.report is not None
