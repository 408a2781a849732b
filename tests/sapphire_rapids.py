"""Issue 20's 2-core Sapphire Rapids VM (AVX-512, AMX, 480 MiB L3): its full calibration,
recorded there, and the Gemma 3 270M Q4_0 spec measured there (53.9 tok/s decode, 900 tok/s
prefill by the issue's `hearthside bench`; see the file's "source")."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from hearthside.autotune.calibration import planner_figures
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.results import CalibrationReport

MIB = 1 << 20
RECORDING = Path(__file__).parent / "fixtures" / "calibration" / "sapphire-rapids-2core.json"
MEASURED_DECODE_TPS, MEASURED_PREFILL_TPS = 53.9, 900.0


def recorded() -> dict[str, Any]:
    return dict(json.loads(RECORDING.read_text()))


def sapphire_rapids(l3_bytes: int = 480 * MIB, memory_gb: int = 16) -> HardwareProfile:
    flags = recorded()["calibration"]["machine"]["cpu_flags"]
    profile = expand_spec(
        {
            "schema": 1,
            "cpu": {"cores": 2, "threads": 2, "flags": flags},
            "memory_gb": memory_gb,
            "disk": {"read_gb_s": 2.0},
        }
    )
    return replace(profile, cpu=replace(profile.cpu, l3_cache_bytes=l3_bytes))


def sapphire_rapids_report() -> CalibrationReport:
    return CalibrationReport.from_dict(recorded()["calibration"])


def sapphire_rapids_calibration() -> dict[str, float]:
    return planner_figures(sapphire_rapids_report())


def gemma_q4_0() -> ModelSpec:
    return ModelSpec.from_dict(recorded()["spec"])
