"""benchmarks/speed_of_light.py's verdicts on recorded-shape numbers: the meter's share and
llama-bench's over the same limit agree within 15%, and the limit must be the bandwidth one.
Nothing here runs llama-bench or the engine."""

from __future__ import annotations

import json
from pathlib import Path

from tests.benchmarks.test_targets import benchmark, status

FIXTURES = Path(__file__).parents[1] / "fixtures" / "calibration"

LIMIT_TPS = 20.0  # a 0.9 GB model at 18.2 GB/s


def rounds(ours: float, native: float) -> list[object]:
    make = benchmark("speed_of_light").Round
    return [make(ours / LIMIT_TPS, ours, native, LIMIT_TPS) for _ in range(3)]


def test_shares_within_15_percent_on_a_bandwidth_bound_model_pass() -> None:
    light = benchmark("speed_of_light")
    assert status(light.targets(rounds(15.0, 16.0), "memory bandwidth")) == 0


def test_shares_more_than_15_percent_apart_fail_either_way() -> None:
    light = benchmark("speed_of_light")
    assert status(light.targets(rounds(12.0, 15.0), "memory bandwidth")) == 1
    assert status(light.targets(rounds(18.0, 15.0), "memory bandwidth")) == 1


def test_llama_bench_far_from_the_planners_bandwidth_limit_fails() -> None:
    # the meter and llama-bench agree, but both are far from the limit the planner computes:
    # the limit itself is wrong (too high, then too low)
    light = benchmark("speed_of_light")
    assert status(light.targets(rounds(12.0, 13.0), "memory bandwidth")) == 1
    assert status(light.targets(rounds(23.0, 23.0), "memory bandwidth")) == 1


def test_a_model_that_is_not_bandwidth_bound_fails() -> None:
    light = benchmark("speed_of_light")
    assert status(light.targets(rounds(12.0, 12.0), "cache")) == 1


def test_no_rounds_is_a_miss_not_a_pass() -> None:
    assert status(benchmark("speed_of_light").targets([], "memory bandwidth")) == 1


def test_the_calibration_line_says_when_its_repeats_varied() -> None:
    """Every prediction in the realistic-model and speed benchmarks stands on one calibration;
    one that read the machine slow (the EPYC's 0.64x decode prediction) must say so."""
    from dataclasses import replace

    from hearthside.kernels.results import CalibrationReport

    light = benchmark("speed_of_light")
    recorded = json.loads((FIXTURES / "sapphire-rapids-2core.json").read_text())
    quiet = CalibrationReport.from_dict(recorded["calibration"])
    assert light.calibration_summary(quiet) == (
        "calibration: RAM read 30.9 GB/s (fastest repetition; median 30.9); its repeats agreed"
    )
    noisy = [replace(m, spread=0.4) for m in quiet.measurements]
    unsteady = light.calibration_summary(replace(quiet, measurements=noisy))
    assert unsteady.startswith("calibration: RAM read 30.9 GB/s (fastest repetition; median 30.9)")
    assert "calibration measurements varied by more than" in unsteady
    assert unsteady.endswith("every prediction below may read low")
