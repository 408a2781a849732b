"""Calibration micro-benchmarks that measure what this machine really delivers.

The contract other layers use (imported lazily: `run_calibration` pulls in the engine, and
torch only loads when a kernel needs it):

    from hearthside.kernels import CalibrationReport, Measurement, run_calibration
    report = run_calibration(quick=True)
    export_calibration(report, path); read_calibration_file(path)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Measurement": "hearthside.kernels.measurement",
    "CalibrationReport": "hearthside.kernels.results",
    "CalibrationError": "hearthside.kernels.results",
    "export_calibration": "hearthside.kernels.results",
    "read_calibration_file": "hearthside.kernels.results",
    "run_calibration": "hearthside.kernels.calibrate",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
