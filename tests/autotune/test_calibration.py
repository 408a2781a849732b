"""Calibration reaches the planner: stored per machine, turned into bandwidth, compute and the
share of them llama.cpp reaches."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.calibration import calibration_for, planner_figures, store_calibration
from hearthside.autotune.planner import plan
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.measurement import Measurement
from hearthside.kernels.results import CalibrationReport

GB = 1e9


def measurement(kind: str, value: float, unit: str, **params: object) -> Measurement:
    return Measurement(
        kind=kind,
        device="cpu",
        value=value,
        unit=unit,
        median=value,
        spread=0.02,
        repetitions=5,
        method="recorded",
        params=dict(params),
    )


def report(model: Path | None = None, decode: float = 40.0, prefill: float = 300.0):  # noqa: ANN201
    items = [
        measurement("memory_read", 11.0, "GB/s", threads=1),
        measurement("memory_read", 20.0, "GB/s", threads=2),
        measurement("matmul", 130.0, "GFLOP/s", dtype="fp32", m=512, n=1024, k=1024),
        measurement("matmul", 12.0, "GFLOP/s", dtype="fp32", m=1, n=4096, k=4096),
        Measurement("disk_read", "disk:/dev/vda", 2.5, "GB/s", 2.5, 0.05, 5, "recorded"),
    ]
    if model is not None:
        items += [
            measurement("engine_decode", decode, "tok/s", model_path=str(model), n_gen=32),
            measurement("engine_prefill", prefill, "tok/s", model_path=str(model), n_prompt=128),
        ]
    return CalibrationReport(1, "2026-11-29T00:00:00+00:00", "0.1.0", {}, tuple(items), (), 20.0)


def test_the_best_figures_become_the_planners_inputs() -> None:
    figures = planner_figures(report())
    assert figures["cpu_read_bytes_per_s"] == 20 * GB  # all threads, not one
    assert figures["cpu_flops"] == 130 * GB  # the GEMM, not the GEMV
    assert figures["disk_read_bytes_per_s"] == 2.5 * GB
    assert "decode_efficiency" not in figures  # no engine run, no efficiency


def test_the_engine_run_gives_the_share_llama_cpp_reaches(default_model_file: Path) -> None:
    figures = planner_figures(report(default_model_file, decode=40.0, prefill=300.0))
    assert 0.2 < figures["decode_efficiency"] < 1.0
    assert 0.2 < figures["prefill_efficiency"] < 3.0


def test_a_calibrated_plan_predicts_the_calibrated_model_closely(
    default_model_file: Path,
) -> None:
    profile = probe_hardware()
    figures = planner_figures(report(default_model_file, decode=40.0, prefill=300.0))
    spec = spec_from_gguf(default_model_file)
    result = plan(spec, profile, n_ctx=512, calibration=figures)
    assert result.confidence == "calibrated"
    assert result.speed.decode_tps == pytest.approx(40.0, rel=0.1)
    assert result.speed.prefill_tps == pytest.approx(300.0, rel=0.1)


def test_a_calibration_applies_only_to_the_machine_it_measured(tmp_path: Path) -> None:
    profile = probe_hardware()
    other = replace(profile, memory=replace(profile.memory, total_bytes=(1 << 40)))
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        assert calibration_for(profile, wisdom) == {}
        store_calibration(report(), profile, wisdom)
        assert calibration_for(profile, wisdom)["cpu_read_bytes_per_s"] == 20 * GB
        assert calibration_for(other, wisdom) == {}
