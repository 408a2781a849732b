"""The Optimize flow without Qt (`autotune/optimize.py`): a request, its events, a result, and
the words the result page says about it."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.app.gui.screenshot_recording import recorded_run
from hearthside.autotune import tuner
from hearthside.autotune.calibration import calibration_for, latest_report
from hearthside.autotune.goals import RunQuality
from hearthside.autotune.optimize import (
    CalibrationRequest,
    MeasureRequest,
    MeasureUpdate,
    calibrate,
    measure,
    measured_reasons,
    quality_text,
    settings_rows,
    verdict,
)
from hearthside.autotune.tune_quality import KvQuality
from hearthside.autotune.tuner import TuneResult
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.errors import ModelFileError
from hearthside.core.paths import data_dir
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.results import LEGACY_FILE_NAME
from tests.fixtures.synthetic_gguf import write_synthetic_gguf


def with_speeds(result: TuneResult, best_tps: float, baseline_tps: float) -> TuneResult:
    assert result.best is not None and result.baseline is not None
    return replace(
        result,
        best=replace(result.best, decode_tps=best_tps),
        baseline=replace(result.baseline, decode_tps=baseline_tps),
    )


@pytest.mark.parametrize(
    ("best_tps", "baseline_tps", "headline"),
    [
        (70.0, 35.0, "2.00× faster than llama.cpp's defaults"),
        (35.5, 35.0, "About as fast as llama.cpp's defaults"),
        (20.0, 35.0, "llama.cpp's defaults measured faster here"),
    ],
)
def test_the_verdict_says_what_was_measured(
    best_tps: float, baseline_tps: float, headline: str
) -> None:
    result = with_speeds(recorded_run().result, best_tps, baseline_tps)
    title, detail = verdict(result)
    assert title == headline
    assert f"{best_tps:.1f} tok/s vs {baseline_tps:.1f} tok/s" in detail
    nothing = verdict(replace(result, best=None))
    assert nothing[0] == "Nothing better was measured"


def test_the_verdict_says_when_the_quality_budget_cost_speed() -> None:
    result = with_speeds(recorded_run().result, 40.0, 35.0)
    assert result.best is not None
    q4_0 = {**result.best.config, "type_k": "q4_0", "type_v": "q4_0"}
    fastest = replace(result.best, config=q4_0, decode_tps=48.0, id=None)
    result = replace(result, runs=(*result.runs, fastest), fastest=fastest)
    title, detail = verdict(result)
    assert title == "1.14× faster than llama.cpp's defaults"
    assert "q4_0 KV, 1.20× the chosen speed) was not chosen" in detail
    assert f"mean KLD {result.quality_of(fastest).mean_kld:.3f}" in detail  # measured or prior


def test_a_faster_setting_within_the_quality_budget_is_passed_over_by_the_goal_not_the_budget() -> (
    None
):
    """The shortest-budget run said "its mean KLD 0.020 is over the quality budget of 0.05"
    of a q8_0 cache the balanced goal had passed over for the f16 reference."""
    result = with_speeds(recorded_run().result, 40.0, 35.0)
    assert result.best is not None
    q8_0 = {**result.best.config, "type_k": "q8_0", "type_v": "q8_0"}
    fastest = replace(result.best, config=q8_0, decode_tps=42.4, id=None)
    result = replace(
        result, runs=(*result.runs, fastest), fastest=fastest, goal="balanced", kld_budget=0.1
    )
    kld = result.quality_of(fastest).mean_kld
    assert kld <= result.kld_budget  # q8_0 KV is within it (0.057 in the recorded run)
    _title, detail = verdict(result)
    assert "q8_0 KV, 1.06× the chosen speed) was not chosen: your goal (balanced)" in detail
    assert f"vs {kld:.3f}, both within the quality budget" in detail
    assert "over the quality budget" not in detail


def test_the_reasons_follow_what_was_measured_not_only_the_estimate() -> None:
    result = recorded_run().result
    assert result.best is not None
    planned = result.plan.config
    flipped = {**result.best.config, "flash_attn": not planned.flash_attn, "n_ubatch": 128}
    reasons = measured_reasons(replace(result, best=replace(result.best, config=flipped)))
    flash = next(reason for reason in reasons if reason.setting == "flash_attn")
    assert flash.value == ("off" if planned.flash_attn else "on")
    assert "Measured faster here than the planner's" in flash.why
    assert any(r.setting == "n_ubatch" and r.value == "128" for r in reasons)
    rows = {row.name: row for row in settings_rows(planned.to_dict(), result.plan.config.to_dict())}
    assert not any(row.changed for row in rows.values())
    assert rows["Prompt threads"].chosen in ("auto (every core)", str(planned.n_threads_batch))


def test_a_request_reports_each_step_and_returns_the_tuned_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    model = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    request = MeasureRequest(model, probe_hardware(), "fastest", 20.0, calibrate=False)
    updates: list[MeasureUpdate] = []
    result = measure(request, threading.Event(), updates.append)
    assert result is not None and result.best is not None and result.baseline is not None
    assert updates[0].kind == "started"
    events = [update.event for update in updates if update.kind == "candidate"]
    measured = [e for e in events if e is not None and e.kind == "measured" and not e.workload]
    assert measured and all(event.memory_bytes for event in measured)  # carried, not looked up
    assert measured[0].baseline == "llama.cpp"  # the comparison comes first
    assert events[-1] is not None and events[-1].kind == "done"


def test_a_missing_model_file_fails_before_anything_runs(tmp_path: Path) -> None:
    request = MeasureRequest(tmp_path / "gone.gguf", probe_hardware(), "fastest", 20.0, False)
    updates: list[MeasureUpdate] = []
    with pytest.raises(ModelFileError, match="missing"):
        measure(request, threading.Event(), updates.append)
    assert [update.kind for update in updates] == ["started"]


def test_a_calibration_request_reports_each_kernel_and_keeps_the_report_in_the_db_only(
    default_model_file: Path,
) -> None:
    """What `hearthside calibrate` and the wizard's "Calibrate first" both run."""
    profile = probe_hardware()
    request = CalibrationRequest(profile, default_model_file, budget_s=4.0, quick=True)
    updates: list[MeasureUpdate] = []
    report = calibrate(request, updates.append)
    kinds = [update.kind for update in updates]
    assert kinds[-1] == "calibrated" and set(kinds[:-1]) == {"calibrating"}
    fractions = [update.fraction or 0.0 for update in updates[:-1]]
    assert fractions == sorted(fractions) and fractions[0] >= 0.0 and fractions[-1] <= 1.0
    assert any("memory" in update.text for update in updates)  # each kernel is named
    with WisdomDB() as db:
        assert latest_report(profile, db) == report
        assert calibration_for(profile, db)["cpu_read_bytes_per_s"] > 0  # the planner sees it
    assert not (data_dir() / LEGACY_FILE_NAME).exists()  # a JSON file only when exported


def test_a_family_figure_never_reads_as_measured_on_this_model() -> None:
    result = recorded_run().result
    assert result.best is not None
    q4_0 = replace(result.best, config={**result.best.config, "type_k": "q4_0"}, id=None)
    family = RunQuality(0.3, "family", 0.8, measured_on="gemma-3-270m", family="gemma3")
    result = replace(
        result, runs=(*result.runs, q4_0), quality=KvQuality("ref", {}, priors={"q4_0": family})
    )
    assert quality_text(result, q4_0) == "KLD ~0.300 (gemma3 family)"
    prior_only = replace(result, quality=KvQuality("ref", {}))
    assert quality_text(prior_only, q4_0).endswith("(not measured yet)")
