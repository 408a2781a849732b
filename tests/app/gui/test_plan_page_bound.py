"""The Plan page on issue 20's Sapphire Rapids VM (its recorded calibration in a real wisdom DB,
its profile as the page's probe): the sentence under the speeds names what really bounds
generation there, for a model its 480 MiB L3 holds and for one it does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from hearthside.app.gui.plan_content import PlanView
from hearthside.app.gui.plan_page import PlanPage
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.sapphire_rapids import sapphire_rapids, sapphire_rapids_report

pytestmark = [pytest.mark.gui, pytest.mark.beside]

PLAN_TIMEOUT_MS = 30_000


@pytest.fixture
def page(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, default_model_file: Path
) -> Iterator[PlanPage]:
    monkeypatch.setenv("HEARTHSIDE_HOME", str(tmp_path))
    with ModelStore(data_dir()) as store:
        record = store.add(default_model_file, link=True, name="Gemma 3 270M", check_native=False)
        store.set_default(record.id)
    profile = sapphire_rapids()
    with WisdomDB() as wisdom:
        store_calibration(sapphire_rapids_report(), profile, wisdom)
    plan_page = PlanPage(probe=lambda: profile)
    qtbot.addWidget(plan_page)
    plan_page.resize(1200, 900)
    yield plan_page


def planned(qtbot: QtBot, page: PlanPage, model: str | None = None) -> PlanView:
    with qtbot.waitSignal(page.plan_ready, timeout=PLAN_TIMEOUT_MS) as ready:
        if model is None:
            page.show()
        else:
            assert page.select_model(model)
            page.request_plan()
    view = ready.args[0]
    assert isinstance(view, PlanView)
    return view


def test_a_model_the_l3_holds_is_shown_compute_bound_and_a_large_one_bandwidth_bound(
    qtbot: QtBot, page: PlanPage
) -> None:
    view = planned(qtbot, page)
    assert view.calibration, "the recorded calibration is the page's"
    assert view.plan.speed.decode_limit == "cache"
    note = page.speed_note.text()
    assert "compute" in note and "L3 cache" in note and "480 MiB" in note
    assert "limited by memory bandwidth" not in note

    view = planned(qtbot, page, "llama-3.1-8b")  # ~4.6 GiB a token: far more than the L3
    assert view.what_if and view.plan.speed.decode_limit == "memory bandwidth"
    note = page.speed_note.text()
    assert "limited by memory bandwidth" in note and "from RAM" in note
    assert "L3 cache" not in note
