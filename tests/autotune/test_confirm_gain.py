"""A gain over llama.cpp's defaults that may be noise is measured again, back to back, before
it is claimed: on Llama 3.1 8B `tune` showed 1.06x for settings that decode alike natively
(0.99x); and one that cannot be real (a batch size, which does not change decode) is never
claimed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.app.gui.screenshot_recording import recorded_run
from hearthside.app.tune_cli import _comparison_lines
from hearthside.autotune import tuner
from hearthside.autotune.goals import Choice
from hearthside.autotune.optimize import verdict
from hearthside.autotune.records import RunRecord, TuningKey
from hearthside.autotune.tune_budget import TuneClock
from hearthside.autotune.tuner import (
    TuneEvent,
    _defaults_over_batch_only,
    confirmation_reason,
    decode_alike,
    needs_confirmation,
    tune,
)
from hearthside.autotune.wisdom import WisdomDB, config_key
from hearthside.core.engine.config import physical_core_count
from hearthside.core.probe.runner import probe_hardware
from tests.autotune.test_optimize import with_speeds
from tests.fixtures.synthetic_gguf import write_synthetic_gguf


def _pair(changed: dict[str, object]) -> tuple[RunRecord, RunRecord, TuningKey]:
    """The recorded run's defaults at 100 tok/s, and a pick that differs in `changed`."""
    result = recorded_run().result
    baseline = result.baseline
    assert baseline is not None
    baseline = replace(baseline, decode_tps=100.0, repeat_spread=0.02)
    pick = replace(baseline, config={**baseline.config, **changed})
    return pick, baseline, result.key


def test_a_gain_small_enough_to_be_noise_is_confirmed_and_a_large_one_is_not() -> None:
    pick, baseline, key = _pair({"n_threads": 1})
    for best_tps, why in (
        (100.0, ""),
        (104.0, ""),
        (106.0, "the gain is small"),
        (114.0, "the gain is small"),
        (130.0, ""),
    ):
        assert confirmation_reason(replace(pick, decode_tps=best_tps), baseline, key) == why
        assert needs_confirmation(replace(pick, decode_tps=best_tps), baseline, key) is bool(why)
    # the defaults themselves, or another file's run (a quant variant), are not compared again
    same = replace(baseline, decode_tps=110.0)
    assert not needs_confirmation(same, baseline, key)
    variant = replace(pick, key=replace(pick.key, model="another-file"), decode_tps=110.0)
    assert not needs_confirmation(variant, baseline, key)


def test_a_large_gain_is_confirmed_when_the_repeats_varied_as_much() -> None:
    pick, baseline, key = _pair({"n_threads": 1})
    fast = replace(pick, decode_tps=130.0)
    assert confirmation_reason(fast, replace(baseline, repeat_spread=0.18), key) == ""
    assert confirmation_reason(fast, replace(baseline, repeat_spread=0.35), key) == (
        "their repetitions varied by up to 35%, as much as the gain"
    )
    assert "35%" in confirmation_reason(replace(fast, repeat_spread=0.35), baseline, key)


def test_a_gain_between_settings_that_cannot_change_decode_is_never_claimed() -> None:
    """On the 8B `tune` showed 1.16x for batch 512 over the defaults' 2048 (one slow
    measurement of the defaults), and on the MoE 1.13x, measured again back to back, where
    in-engine ABBA rounds read 0.95x: settings that decode alike are shown as alike, without
    spending two runs to confirm what cannot be."""
    for changed in ({"n_batch": 512}, {"n_ubatch": 256, "n_threads_batch": 1}):
        pick, baseline, key = _pair(changed)
        for best_tps in (106.0, 116.0, 200.0):
            assert confirmation_reason(replace(pick, decode_tps=best_tps), baseline, key) == ""
            assert decode_alike(replace(pick, decode_tps=best_tps), baseline, uses_swa=True)
    pick, baseline, key = _pair({"n_batch": 512, "type_k": "q8_0"})
    assert not decode_alike(pick, baseline, uses_swa=True)
    assert not needs_confirmation(replace(pick, decode_tps=130.0), baseline, key)
    assert not decode_alike(baseline, baseline, uses_swa=True)  # the defaults themselves


def test_the_goals_that_rank_by_decode_keep_the_defaults_over_a_batch_size_pick() -> None:
    """On a Zen 4 EPYC the Llama-3.1-8B-shaped model's tune picked batch 512 over the
    defaults' 2048 (a decode lead that can only be noise) and showed 1.0x: it now keeps
    llama.cpp's defaults. A goal that counts prompt speed keeps such a pick, and a pick that
    changes decode keeps its lead."""
    pick, baseline, _key = _pair({"n_batch": 512})
    lead = replace(pick, decode_tps=116.0)
    choice = Choice(lead, lead, ())
    for goal in ("fastest", "quality"):
        kept = _defaults_over_batch_only(choice, baseline, goal, uses_swa=True)
        assert kept.best is baseline and kept.fastest is lead
    assert _defaults_over_batch_only(choice, baseline, "balanced", uses_swa=True).best is lead
    assert _defaults_over_batch_only(choice, None, "fastest", uses_swa=True).best is lead
    q8, _, _ = _pair({"n_batch": 512, "type_k": "q8_0", "type_v": "q8_0"})
    other = Choice(replace(q8, decode_tps=116.0), None, ())
    assert _defaults_over_batch_only(other, baseline, "fastest", uses_swa=True) == other


def test_settings_that_load_the_same_engine_decode_alike() -> None:
    """The Qwen3-30B-A3B-shaped MoE's pick (batch 512, the planner's full sliding-window
    cache on a model without a window, threads left to the default) against the defaults
    (2048/512, a window-sized cache, threads named): only the batch differs. Where the model
    has a window, that cache is a real difference, and so are other thread counts."""
    cores = physical_core_count()
    changed = {"n_batch": 512, "swa_full": True, "n_threads": None}
    pick, baseline, key = _pair(changed)
    baseline = replace(baseline, config={**baseline.config, "swa_full": False, "n_threads": cores})
    gain = replace(pick, decode_tps=109.0)
    assert decode_alike(gain, baseline, uses_swa=False)
    assert confirmation_reason(gain, baseline, key, uses_swa=False) == ""
    assert not decode_alike(gain, baseline, uses_swa=True)
    assert confirmation_reason(gain, baseline, key, uses_swa=True) == "the gain is small"
    other_threads = replace(gain, config={**gain.config, "n_threads": cores + 1})
    assert not decode_alike(other_threads, baseline, uses_swa=False)
    assert confirmation_reason(other_threads, baseline, key, uses_swa=False) == "the gain is small"


def test_a_pick_that_decodes_like_the_defaults_is_shown_as_about_as_fast() -> None:
    result = with_speeds(recorded_run().result, 113.0, 100.0)
    alike = replace(result, decode_alike=True)
    assert alike.speedup == 1.0
    title, detail = verdict(alike)
    assert title == "About as fast as llama.cpp's defaults"
    assert "113.0 tok/s vs 100.0 tok/s" in detail
    assert "differ from llama.cpp's defaults only in batch sizes" in detail
    assert "so no gain is claimed" in detail
    assert verdict(result)[0] == "1.13× faster than llama.cpp's defaults"
    printed = "\n".join(_comparison_lines(alike))  # `hearthside tune`
    assert "Chosen settings decode 1.00x llama.cpp's defaults." in printed
    assert "differ only in batch sizes" in printed and "no gain is claimed" in printed


def test_the_speed_up_shown_is_the_smaller_of_both_measurements_and_says_so() -> None:
    result = with_speeds(recorded_run().result, 106.0, 100.0)
    assert result.best is not None and result.baseline is not None
    again = (replace(result.baseline, decode_tps=101.0), replace(result.best, decode_tps=99.0))
    confirmed = replace(result, confirmation=again)
    assert confirmed.speedup == pytest.approx(99.0 / 101.0)
    title, detail = verdict(confirmed)
    assert title == "About as fast as llama.cpp's defaults"  # 1.06x once, 0.98x back to back
    assert "again back to back 99.0 vs 101.0 tok/s, so 0.98×, the smaller gain of the two" in detail

    # a slow measurement of the defaults (1.16x) is not averaged into the claim
    slow_defaults = with_speeds(recorded_run().result, 116.0, 100.0)
    again = (replace(result.baseline, decode_tps=112.0), replace(result.best, decode_tps=115.0))
    title, _ = verdict(replace(slow_defaults, confirmation=again))
    assert title == "About as fast as llama.cpp's defaults"  # 115 / 112 = 1.03x
    again = (replace(result.baseline, decode_tps=100.0), replace(result.best, decode_tps=125.0))
    title, _ = verdict(replace(slow_defaults, confirmation=again))
    assert title == "1.16× faster than llama.cpp's defaults"  # the smaller of 1.16x and 1.25x


def test_an_unconfirmed_gain_says_why_it_may_be_noise() -> None:
    result = with_speeds(recorded_run().result, 112.0, 100.0)
    why = "the gain is small"
    title, detail = verdict(replace(result, unconfirmed=why))
    assert title == "1.12× faster than llama.cpp's defaults"
    assert f"Measured once each, minutes apart: {why}, so it may be noise" in detail
    assert "may be noise" not in verdict(result)[1]


@pytest.mark.usefixtures("repeat_noise_ignored")
def test_the_defaults_and_the_pick_are_measured_again_one_after_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = write_synthetic_gguf(tmp_path / "tiny-dense.gguf", "tiny-dense", "Q8_0")
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        result = tune(model, probe_hardware(), budget_s=20, wisdom=wisdom, speculation=False)
        baseline, pick = result.baseline, result.runs[1]
        assert baseline is not None and pick.outcome == "ok"
        stored = len(wisdom.runs(result.key))
        events: list[TuneEvent] = []
        again = tuner._confirm(
            result.key, model, (baseline, pick), "quick", TuneClock(60), 5.0, events.append
        )
        assert again is not None
        assert [config_key(run.config) for run in again] == [
            config_key(baseline.config),
            config_key(pick.config),
        ]
        assert all(run.outcome == "ok" and (run.decode_tps or 0) > 0 for run in again)
        assert [event.kind for event in events] == ["confirm", "confirm"]
        assert len(wisdom.runs(result.key)) == stored  # the first runs stay the record
        # no time for both: nothing is measured, and the gain stays unconfirmed
        events.clear()
        short = tuner._confirm(
            result.key, model, (baseline, pick), "quick", TuneClock(3), 5.0, events.append
        )
        assert short is None and events == []
