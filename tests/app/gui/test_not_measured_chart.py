"""The wizard's chart and measuring summary: a candidate the time budget cut off (never
started, or stopped at its deadline) is "not measured" in a neutral colour, never a red
failure (issue 32)."""

from __future__ import annotations

from pytestqt.qtbot import QtBot

from hearthside.app.gui.tune_chart import FAILURE_COLOURS, TOP, TuneChart
from hearthside.app.gui.wizard import measured_summary
from hearthside.autotune.tuner import TuneEvent
from tests.autotune.test_not_measured import DEFAULTS_PREDICTED, candidate, defaults_won


def event(kind: str, index: int, **values: object) -> TuneEvent:
    config = {"n_threads": index, "flash_attn": True, "n_ubatch": 512, "type_k": "f16"}
    return TuneEvent(kind, index, 4, config, predicted_decode_tps=48.0, **values)  # type: ignore[arg-type]


def red_pixels(chart: TuneChart, position: int) -> int:
    """Pixels in the failure colour inside the `position`th candidate's column (the legend,
    above the plot, left out)."""
    chart.resize(900, 360)
    image = chart.grab().toImage()
    plot = chart._plot_rect()
    group = chart._group_width(plot)
    reds = {FAILURE_COLOURS[False].lower(), FAILURE_COLOURS[True].lower()}
    left = int(plot.left() + position * group)
    return sum(
        image.pixelColor(x, y).name() in reds
        for x in range(left, int(left + group))
        for y in range(int(TOP) + 2, image.height(), 2)
    )


def test_a_budget_cut_off_is_drawn_as_not_measured_not_as_a_failure(qtbot: QtBot) -> None:
    chart = TuneChart()
    qtbot.addWidget(chart)
    chart.add_event(event("measured", 1, decode_tps=31.5, memory_bytes=811_000_000))
    why = "not measured: not finished within the 3.1 s the tuning budget left it"
    chart.add_event(event("unmeasured", 2, message=why))  # stopped at its deadline
    chart.add_event(event("unmeasured", 3, message="not measured: the time budget ran out"))
    chart.add_event(event("failed", 4, message="Failed to create llama_context", outcome="oom"))
    assert [e.state for e in chart.entries] == ["measured", "unmeasured", "unmeasured", "oom"]
    parts = chart.accessibleDescription().split(". ")
    assert "not measured (cut off by the time budget; not a failure)" in parts[1]
    assert "failed" not in parts[1] and "out of memory" not in parts[2]
    assert "predicted 48.0 tok/s" in parts[2]  # its prediction is all that is known
    assert red_pixels(chart, 1) == red_pixels(chart, 2) == 0
    assert red_pixels(chart, 3) > 0  # a real failure stays red


def test_a_timeout_read_back_from_the_database_is_not_measured_either(qtbot: QtBot) -> None:
    chart = TuneChart()
    qtbot.addWidget(chart)
    chart.add_event(event("failed", 1, message="not finished", outcome="timeout"))
    assert chart.entries[0].state == "unmeasured"


def test_the_measuring_summary_counts_a_cut_off_as_not_measured() -> None:
    faster = candidate(DEFAULTS_PREDICTED * 1.2, 3, started=True)
    summary = measured_summary(defaults_won(faster, timed_out=True))
    assert "failed" not in summary
    assert "Measured 1 of 10 — about 1 more minute would test the rest." in summary
