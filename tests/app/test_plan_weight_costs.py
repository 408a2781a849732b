"""The plan page and `hearthside plan` say which weight types' costs were measured and which
were estimated from another type."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.app.gui.plan_content import setting_rows
from hearthside.app.plan_cli import describe_plan
from hearthside.autotune.calibration import planner_figures
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.planner import plan
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.runner import probe_hardware
from tests.autotune.test_calibration import recorded_report
from tests.fixtures.synthetic_gguf import SyntheticShape, write_uniform_gguf

pytestmark = pytest.mark.beside


def test_the_plan_page_and_the_cli_name_the_type_an_estimate_came_from(tmp_path: Path) -> None:
    shape = SyntheticShape("llama", 2, 256, 4, 1, 1024, n_vocab=512)
    path = write_uniform_gguf(tmp_path / "q5_1.gguf", shape, "Q5_1")
    result = plan(
        spec_from_gguf(path),
        probe_hardware(),
        n_ctx=512,
        calibration=planner_figures(recorded_report()),
        pieces=pieces_from_gguf(validate_gguf(path)),
    )
    row = next(row for row in setting_rows(result) if row.name == "Weight type costs")
    assert row.value == "estimated"
    assert row.why.startswith("Q5_1 estimated from Q5_0 (not measured on this machine;")
    assert "weight costs = estimated: Q5_1 estimated from Q5_0" in describe_plan(result)
