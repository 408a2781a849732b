"""A verdict only from what was measured: a candidate the time budget cut off is "not
measured", never failed, and "llama.cpp's defaults are already the best here" only when every
candidate predicted to beat them was measured (issue 32)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hearthside.app.gui.screenshot_recording import recorded_run
from hearthside.app.tune_cli import describe_result, result_as_dict
from hearthside.autotune.optimize import NotMeasured, TuneResult, verdict
from hearthside.autotune.records import RunRecord

pytestmark = pytest.mark.beside

BEST_HERE = "llama.cpp's defaults are already the best here"
DEFAULTS_PREDICTED = 45.0


def defaults_won(*cut: NotMeasured, timed_out: bool = False) -> TuneResult:
    """The shortest budget's run from the issue: llama.cpp's defaults measured (and fastest),
    the second candidate stopped at its deadline when `timed_out`, the rest of ten never
    started; a measured candidate took 20 s."""
    result = recorded_run().result
    assert result.baseline is not None
    baseline = replace(
        result.baseline, predicted={"decode_tps": DEFAULTS_PREDICTED, "prefill_tps": 300.0}
    )
    runs: tuple[RunRecord, ...] = (baseline,)
    if timed_out:
        why = "not finished within the 3.1 s the tuning budget left it"
        settings = cut[0].config
        runs += (RunRecord(baseline.key, settings, "quick", "timeout", error=why),)
    return replace(
        result,
        best=baseline,
        baseline=baseline,
        runs=runs,
        fastest=baseline,
        python_defaults=None,
        variants=(),
        not_measured=cut,
        candidates=10,
        candidate_s=20.0,
    )


def candidate(decode_tps: float | None, threads: int, started: bool = False) -> NotMeasured:
    config = {"n_threads": threads, "flash_attn": True, "n_ubatch": 512, "type_k": "q8_0"}
    return NotMeasured(config, decode_tps, "", started)


def slower(count: int) -> tuple[NotMeasured, ...]:
    return tuple(candidate(DEFAULTS_PREDICTED * 0.5, threads) for threads in range(1, count + 1))


def test_defaults_are_not_the_best_while_a_predicted_faster_candidate_was_not_measured() -> None:
    faster = candidate(DEFAULTS_PREDICTED * 1.2, 3, started=True)
    result = defaults_won(faster, *slower(8), timed_out=True)
    headline, detail = verdict(result)
    assert headline == "Measured 1 of 10 — about 3 more minutes would test the rest"
    assert BEST_HERE not in headline + detail
    assert "1 setting predicted to be about as fast or faster" in detail
    printed = describe_result(result)
    assert BEST_HERE not in printed
    assert "Measured 1 of 10 — about 3 more minutes would test the rest." in printed
    assert result_as_dict(result)["verdict"] == headline


def test_a_candidate_predicted_as_fast_or_not_predicted_still_needs_measuring() -> None:
    for rival in (candidate(DEFAULTS_PREDICTED, 3), candidate(None, 3)):
        headline, _ = verdict(defaults_won(rival, *slower(2)))
        assert headline == "Measured 1 of 10 — about 1 more minute would test the rest"


def test_defaults_are_the_best_when_only_predicted_slower_ones_were_not_measured() -> None:
    headline, detail = verdict(defaults_won(*slower(3)))
    assert headline == BEST_HERE
    assert "Measured 1 of 10 — about 1 more minute would test the rest." in detail
    # the comparison with llama-cpp-python's defaults never holds the verdict back
    python = NotMeasured({"n_ctx": 512}, DEFAULTS_PREDICTED * 2, "llama-cpp-python")
    assert verdict(defaults_won(python))[0] == BEST_HERE
    assert verdict(defaults_won())[0] == BEST_HERE  # everything measured


def test_a_budget_cut_off_is_said_as_not_measured_never_failed() -> None:
    result = defaults_won(candidate(DEFAULTS_PREDICTED * 1.2, 3, started=True), timed_out=True)
    printed = describe_result(result)
    assert "Measured 1 setting (goal" in printed  # the timed-out run is not counted as measured
    assert "not measured: not finished within the 3.1 s" in printed
    assert "timeout" not in printed and "failed" not in printed
    assert "Not measured (cut off by the time budget, or a stop): 1 candidate, 1 of them" in (
        printed
    )
