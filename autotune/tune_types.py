"""The tuner's first phase: measure the model's weight types the calibration did not.

What `hearthside plan MODEL --measure-types` runs (`autotune/type_costs.py`), within the
tuner's share of its budget (`tune_budget.TYPES_SHARE`): with smaller probes when the share is
short, and not at all, with a note saying so, when it is too short for even those. The costs
go into the autotune DB, so the plan the tuner then makes (and every later one) says
"measured" for them instead of "estimated from <type>".
"""

from __future__ import annotations

from pathlib import Path

from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.fingerprint import machine_fingerprint
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.tune_budget import PhaseNote, TuneClock
from hearthside.autotune.type_costs import (
    describe_type_cost,
    measure_type_costs,
    model_weight_types,
    unmeasured_types,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.probe.profile import HardwareProfile

# Measured on the 2-core EPYC VM, one type beside its reference: 8 MiB probes 512 wide take
# ~5 s with a 2 s budget, and the probes' rounds run ~2.5-4x the budget they are given (at
# least three rounds, after writing and loading the probes).
MIN_TYPE_S = 5.0
MEASURE_OVERRUN = 3.0
SMALL_PROBE_BYTES = 8 << 20
SMALL_PROBE_WIDTH = 512
FULL_PROBES_S = 30.0  # with at least this much per type, the calibration's own probe sizes
HINT = "`hearthside plan MODEL --measure-types` measures them"


def measure_missing_types(
    model_path: Path, profile: HardwareProfile, db: WisdomDB, clock: TuneClock
) -> list[PhaseNote]:
    """Measure the weight types of `model_path` this machine's calibration lacks, by
    `clock.types_end`; a note for each thing that kept a type estimated."""
    fingerprint = machine_fingerprint(profile)
    types = model_weight_types(pieces_from_gguf(validate_gguf(model_path)))
    wanted = unmeasured_types(types, calibration_for(profile, db))
    if not wanted:
        return []
    names = ", ".join(wanted)
    if db.latest_calibration(fingerprint) is None:
        why = "not measured: this machine is not calibrated yet"
        return [PhaseNote("types", f"{names} {why}, so their costs are estimated")]
    allotted_s = clock.types_end - clock.now()
    needed_s = MIN_TYPE_S * len(wanted)
    if allotted_s < needed_s:
        why = (
            f"{names} not measured: the budget gives weight types {max(allotted_s, 0):.0f} s, "
            f"measuring them needs about {needed_s:.0f} s; they stay estimated ({HINT})"
        )
        return [PhaseNote("types", why)]
    full = allotted_s >= FULL_PROBES_S * len(wanted)
    costs = measure_type_costs(
        wanted,
        profile,
        db,
        budget_s=allotted_s / MEASURE_OVERRUN,
        max_probe_bytes=None if full else SMALL_PROBE_BYTES,
        widths=None if full else [SMALL_PROBE_WIDTH],
    )
    return [PhaseNote("types", describe_type_cost(c)) for c in costs if not c.measured]
