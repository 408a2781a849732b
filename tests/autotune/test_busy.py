"""A busy machine is noticed: when the tuner's repeats or a calibration's disagree beyond their
noise bound, the result says other programs were busy and nothing from the run is stored."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.app.tune_cli import describe_result, result_as_dict
from hearthside.autotune import optimize, tuner
from hearthside.autotune.busy import (
    OTHERS_BUSY_CORES,
    REPEAT_NOISE_BOUND,
    busy_from_others,
    busy_from_runs,
    busy_text,
    disturbed,
    disturbed_note,
    repeats_disagree,
    unsteady_calibration,
)
from hearthside.autotune.calibration import latest_report
from hearthside.autotune.fingerprint import TuningKey
from hearthside.autotune.optimize import MeasureRequest, apply_tuning
from hearthside.autotune.records import RunRecord, config_key
from hearthside.autotune.tuner import save_tuned_defaults, tune
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.worker_engine import WorkerEngine
from hearthside.core.errors import HearthsideError
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.measurement import spread_of
from hearthside.kernels.results import CalibrationReport
from tests.fixtures.other_programs import BUSY_LOOP, start_other_program, stop_other_programs
from tests.fixtures.synthetic_gguf import write_synthetic_gguf

KEY = TuningKey("machine", "engine", "model")
# tiny-dense Q8_0, 3 repetitions of pp128 and tg32 tok/s, recorded on the shared 2-core EPYC VM
# on 2026-12-04: one thread beside other people's work (repeats within 11%), and two threads
# with two busy loops started beside them (tg32 from 1.9 to 148 tok/s)
STEADY_1_THREAD = ((3027.7, 2944.6, 2997.6), (997.2, 1065.8, 1113.8))
STEADY_1_THREAD_AGAIN = ((4440.2, 2851.7, 2875.3), (1229.2, 1091.7, 1140.4))
DISTURBED_2_THREADS = ((275.7, 216.7, 247.5), (60.4, 1.9, 147.8))
CALIBRATIONS = Path(__file__).parents[1] / "fixtures" / "calibration"
COMPETITORS = 2  # one busy loop per core of the 2-core VM


def run_of(samples: tuple[tuple[float, ...], ...], threads: int, **config: object) -> RunRecord:
    prefill, decode = samples
    return RunRecord(
        KEY,
        {"n_threads": threads, **config},
        "quick",
        "ok",
        prefill_tps=sorted(prefill)[1],
        decode_tps=sorted(decode)[1],
        repeat_spread=max(spread_of(prefill), spread_of(decode)),
    )


def test_runs_whose_repeats_agree_are_not_busy() -> None:
    pick = run_of(STEADY_1_THREAD, 1)
    defaults = run_of(STEADY_1_THREAD, 1, flash_attn=True)
    assert not repeats_disagree(pick)
    assert busy_from_runs([defaults, pick], pick, defaults) is None
    # one disturbed run among several, neither the pick nor the defaults: not a verdict
    others = [run_of(STEADY_1_THREAD, 1, n_ubatch=size) for size in (128, 256)]
    noisy = run_of(DISTURBED_2_THREADS, 2)
    assert busy_from_runs([defaults, pick, *others, noisy], pick, defaults) is None


def test_the_defaults_repeats_disagreeing_mark_the_run_busy() -> None:
    pick = run_of(STEADY_1_THREAD, 1)
    defaults = run_of(DISTURBED_2_THREADS, 2)
    why = busy_from_runs([defaults, pick], pick, defaults)
    assert why is not None
    assert f"disagreed by more than {REPEAT_NOISE_BOUND:.0%}" in why
    assert "with 2 threads" in why and "1 of 2 settings" in why
    shown = busy_text(why)
    assert shown.startswith("Other programs were busy while measuring: these figures may be off")


def test_half_the_runs_disagreeing_mark_the_run_busy() -> None:
    pick = run_of(STEADY_1_THREAD, 1)
    defaults = run_of(STEADY_1_THREAD_AGAIN, 1, flash_attn=True)
    noisy = [run_of(DISTURBED_2_THREADS, 2, n_ubatch=size) for size in (128, 256)]
    assert busy_from_runs([defaults, pick, *noisy], pick, defaults) is not None


def test_a_calibration_with_many_varying_measurements_is_called_unsteady() -> None:
    quiet = json.loads((CALIBRATIONS / "sapphire-rapids-2core.json").read_text())["calibration"]
    busy = json.loads((CALIBRATIONS / "epyc-2core-speed-model.json").read_text())["calibration"]
    assert unsteady_calibration(CalibrationReport.from_dict(quiet)) is None  # 1 of 51
    why = unsteady_calibration(CalibrationReport.from_dict(busy))
    assert why == "27 of 45 calibration measurements varied by more than 15% between repetitions"


def test_other_programs_are_busy_beyond_half_a_core_on_average() -> None:
    assert busy_from_others(0.007, 2) is None  # the idle Zen 4 VM
    assert busy_from_others(OTHERS_BUSY_CORES, 2) is None
    assert busy_from_others(1.009, 2) == (
        "other programs kept 1.0 of 2 cores busy on average while measuring"
    )
    assert busy_text(busy_from_others(2.3, 2) or "").endswith(
        "(Other programs kept 2.0 of 2 cores busy on average while measuring.)"
    )


def test_a_burst_beside_the_defaults_run_alone_marks_the_tuning_busy() -> None:
    """Steady repeats, but other programs took 1.2 cores while llama.cpp's defaults were
    measured: the whole tuning's average may hide it, that run's own count does not."""
    pick = run_of(STEADY_1_THREAD, 1)
    defaults = replace(run_of(STEADY_1_THREAD, 1, flash_attn=True), others_cores=1.2)
    assert not repeats_disagree(defaults) and disturbed(defaults)
    assert not disturbed(replace(pick, others_cores=OTHERS_BUSY_CORES))
    why = busy_from_runs([defaults, pick], pick, defaults)
    assert why == "other programs kept up to 1.2 cores busy while 1 of 2 settings were measured"
    # a burst beside one setting that decides nothing is not a verdict either
    others = [
        replace(run_of(STEADY_1_THREAD, 1, n_ubatch=size), others_cores=busy)
        for size, busy in ((128, 0.9), (256, 0.0))
    ]
    assert busy_from_runs([replace(defaults, others_cores=0.0), pick, *others], pick, None) is None
    assert disturbed_note(defaults) == (
        "other programs kept 1.2 cores busy meanwhile: this speed may read low, and the next "
        "tuning measures it again"
    )
    assert disturbed_note(run_of(DISTURBED_2_THREADS, 2)).startswith(
        "its repetitions disagreed by "
    )
    assert disturbed_note(pick) == ""


def test_a_disturbed_run_is_kept_with_its_spread_and_never_applied(tmp_path: Path) -> None:
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        stored = wisdom.record_run(run_of(DISTURBED_2_THREADS, 2))
        found = wisdom.lookup(KEY, stored.config, "quick")
        burst = wisdom.record_run(replace(run_of(STEADY_1_THREAD, 1), others_cores=1.4))
        found_burst = wisdom.lookup(KEY, burst.config, "quick")
    assert found is not None and repeats_disagree(found)  # the tuner measures it again
    assert found_burst is not None and found_burst.others_cores == 1.4
    assert disturbed(found_burst)  # and this one too


@pytest.fixture
def competing_programs() -> Iterator[list[int]]:
    """Busy loops in other programs, one per core, for as long as the test runs: started
    through a shell that exits, so that they are not this process's descendants (whose CPU
    time counts as Hearthside's own), and ending by themselves should the test be killed."""
    loops = [start_other_program(BUSY_LOOP) for _ in range(COMPETITORS)]
    try:
        time.sleep(0.5)  # running before the first measurement
        yield loops
    finally:
        stop_other_programs(loops)


@pytest.mark.slow  # a real calibration and tune (~30 s)
def test_a_calibration_and_tune_beside_busy_programs_say_so_and_store_no_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, competing_programs: list[int]
) -> None:
    """What the wizard runs with "Calibrate first" ticked, asked to store the winner at once
    as `hearthside tune` does: the CPU time the other programs used says they were busy, and
    nothing is stored. They stop when the calibration is done: the tune beside them took 10 s
    of this test's 40 (40-80 beside the other test lane), and they ran through most of the
    whole run. (Stopped when the calibration reached the engine instead, they averaged under
    half a core in a fresh clone: the calibration's own kernels share the cores with them.)"""
    monkeypatch.setattr(optimize, "CALIBRATION_BUDGET_S", 10.0)
    # llama.cpp's defaults (every core), the planner's pick and llama-cpp-python's defaults
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    model = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    request = MeasureRequest(
        model, probe_hardware(), "fastest", 10.0, calibrate=True, save_default=True
    )

    def stop_when_calibrated(update: optimize.MeasureUpdate) -> None:
        if update.kind == "calibrated":
            stop_other_programs(competing_programs)

    result = optimize.measure(request, threading.Event(), stop_when_calibrated)
    assert result is not None and result.best is not None
    assert result.busy is not None
    # the loops' CPU time, counted directly; the repeats may or may not disagree beside
    # loops that take the cores steadily
    assert "cores busy on average while measuring" in result.busy, result.busy
    with WisdomDB() as wisdom:
        calibration = latest_report(request.profile, wisdom)
        assert calibration is not None  # and the Hardware page says so, counted alike
        assert any(flag.startswith("Other programs kept") for flag in calibration.anomalies)
        assert wisdom.default_for(result.key) is None  # not stored at once
        assert not save_tuned_defaults(wisdom, result)  # nor the wizard's Apply
        assert wisdom.default_for(result.key) is None
    with pytest.raises(HearthsideError) as refused:
        apply_tuning(result)
    assert "Other programs were busy" in (refused.value.hint or "")
    text = describe_result(result)
    assert "Nothing was stored as a default. Other programs were busy" in text
    assert "now this model's default" not in text
    assert result_as_dict(result)["busy"] == result.busy


@pytest.mark.slow  # a real tune (~5 s)
@pytest.mark.usefixtures("repeat_noise_ignored")  # other programs' count alone, not the repeats
def test_other_programs_busy_while_one_setting_is_measured_mark_that_run_and_the_tuning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Busy loops run only while the first setting (llama.cpp's defaults) is measured: that
    run counts the cores they took, the others do not, the tuning says so and stores no
    default, and the next tuning measures that setting again instead of reusing it."""
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    monkeypatch.setattr(tuner, "_audit", lambda *_args: (None, None))  # the tuner tests'
    model = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    loaded: list[dict[str, object]] = []
    loops: list[int] = []

    def load(config: EngineConfig) -> WorkerEngine:
        stop_other_programs(loops)  # the burst ends when the next setting loads
        if not loaded:
            loops.extend(start_other_program(BUSY_LOOP) for _ in range(COMPETITORS))
        loaded.append(config.to_dict())
        return WorkerEngine(config)

    profile = probe_hardware()
    try:
        with WisdomDB(tmp_path / "wisdom.db") as wisdom:
            first: list[tuner.TuneEvent] = []
            result = tune(
                model,
                profile,
                budget_s=120,
                wisdom=wisdom,
                speculation=False,
                load=load,
                listener=first.append,
            )
            assert result.baseline is not None and result.best is not None
            assert config_key(loaded[0]) == result.baseline.config_key
            measured = [run for run in result.runs if run.outcome == "ok"]
            beside = [run for run in measured if disturbed(run)]
            assert [run.config_key for run in beside] == [result.baseline.config_key]
            assert (result.baseline.others_cores or 0.0) > OTHERS_BUSY_CORES, (
                result.baseline.others_cores
            )
            rest = [run for run in measured if run.config_key != result.baseline.config_key]
            assert rest and all((run.others_cores or 0.0) < OTHERS_BUSY_CORES for run in rest)
            assert result.busy is not None and "while 1 of" in result.busy, result.busy
            notes = {
                config_key(e.config): e.message for e in first if e.kind == "measured"
            }  # said beside that setting as it was measured, and beside no other
            assert notes.pop(result.baseline.config_key).startswith("other programs kept")
            assert notes and not any(notes.values()), notes
            assert wisdom.default_for(result.key) is None
            events: list[tuner.TuneEvent] = []
            tune(
                model,
                profile,
                budget_s=120,
                wisdom=wisdom,
                speculation=False,
                listener=events.append,
            )
        again = [e.kind for e in events if config_key(e.config) == result.baseline.config_key]
        assert "reused" not in again and "measured" in again, again
    finally:
        stop_other_programs(loops)
