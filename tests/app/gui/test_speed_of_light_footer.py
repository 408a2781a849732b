"""The real window (offscreen) on the default chat model, with this machine's calibration
stored (the 2-core EPYC VM's recording): the line under a
reply says its speed's share of this machine's limit, and its tooltip explains the limit."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QTextCursor
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.chat_view import ChatView
from hearthside.app.gui.main_window import MainWindow
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.speed_limit import SpeedLimit
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.results import CalibrationReport
from tests.app.gui.window_helpers import open_window, use_settings

pytestmark = pytest.mark.gui

EPYC = Path(__file__).parents[2] / "fixtures" / "calibration" / "epyc-2core-speed-model.json"
REPLY_TIMEOUT_MS = 90_000
SHARE = re.compile(r"(\d+) tok/s · (\d+)% of this machine's limit")


@pytest.fixture
def window(
    qapp: QApplication, chat_model_file: Path, hearthside_home: Path
) -> Iterator[MainWindow]:
    with ModelStore(data_dir()) as store:
        store.set_default(store.add(chat_model_file, link=True).id)
    recorded = CalibrationReport.from_dict(json.loads(EPYC.read_text())["calibration"])
    with WisdomDB() as wisdom:
        store_calibration(
            recorded, probe_hardware(ProbeContext(models_dir=models_dir(data_dir()))), wisdom
        )
    with open_window(hearthside_home, "default", threads=2) as opened:
        yield opened


def note_tooltip(view: ChatView, text: str) -> str:
    found = view.document().find(text)
    assert not found.isNull(), f"{text!r} is not in the conversation"
    cursor = QTextCursor(found)
    cursor.setPosition(found.selectionStart() + 1)
    return cursor.charFormat().toolTip()


@pytest.mark.slow
def test_a_reply_on_the_default_model_shows_its_share_of_the_limit(
    window: MainWindow, qtbot: QtBot, chat_model_file: Path
) -> None:
    view = window.chat_pane.view
    qtbot.waitUntil(lambda: view.speed_limit is not None, timeout=60_000)
    limit = view.speed_limit
    assert limit is not None and limit.source == "calibrated" and limit.threads == 2
    l3_bytes = probe_hardware(ProbeContext()).cpu.l3_cache_bytes or 0
    if chat_model_file.stat().st_size <= l3_bytes:  # a 480 MiB L3 (a Xeon 6) holds it all
        assert limit.bound == "cache"
        where = "from the CPU's cache"
    else:  # ~100 MB a token, more than a 32 MiB L3: read from RAM, by kernels slower than RAM
        assert limit.bound in ("memory bandwidth", "compute")
        where = "from RAM"
    use_settings(window, max_tokens=24)
    with qtbot.waitSignal(window.session.reply_metrics, timeout=REPLY_TIMEOUT_MS) as done:
        window.session.send("Name three colours of the rainbow.")
    metrics = done.args[0]
    footer = SHARE.search(view.toPlainText())
    assert footer is not None, view.toPlainText()
    assert footer.group(1) == f"{metrics.decode_tok_s:.0f}"
    expected = metrics.decode_tok_s / limit.tps_at(
        metrics.prompt_tokens + metrics.completion_tokens // 2
    )
    assert f"{footer.group(2)}%" == f"{expected:.0%}"
    tooltip = note_tooltip(view, footer.group(0))
    assert "This machine's limit is about" in tooltip and where in tooltip
    assert ("Why it is slower" in tooltip) == (expected < 0.5)


def metrics_of(decode_tok_s: float) -> GenerationMetrics:
    return GenerationMetrics(
        prompt_tokens=30,
        prompt_tokens_evaluated=30,
        completion_tokens=20,
        ttft_s=0.5,
        prompt_tok_s=60.0,
        decode_tok_s=decode_tok_s,
        total_s=2.0,
        stop_reason="eos",
    )


def test_the_note_has_the_share_only_once_a_limit_is_known(qtbot: QtBot) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    view.begin_reply("SmolLM2")
    view.finish_reply("Hello.", view.metered_note(metrics_of(9.0)))
    assert "9 tok/s · first token" in view.toPlainText()  # no limit: no share, no guess
    assert "limit" not in view.toPlainText()

    limit = SpeedLimit(
        limit_tps=20.0,
        bound="memory bandwidth",
        tier="CPU",
        read_bytes_per_token=910_000_000,
        bandwidth_bytes_per_s=18.2e9,
        threads=2,
        source="calibrated",
    )
    view.set_speed_limit(limit)
    view.begin_reply("SmolLM2")
    view.finish_reply("Hello again.", view.metered_note(metrics_of(16.2)))
    assert "16 tok/s · 81% of this machine's limit · first token" in view.toPlainText()
    tooltip = note_tooltip(view, "81% of this machine's limit")
    assert "16.2 tok/s of a possible 20.0" in tooltip and "18.2 GB/s with 2 threads" in tooltip
    assert "868 MiB of weights from RAM" in tooltip and "Why it is slower" not in tooltip

    view.begin_reply("SmolLM2")
    view.finish_reply("Slowly.", view.metered_note(metrics_of(4.0)))
    tooltip = note_tooltip(view, "20% of this machine's limit")
    assert "Why it is slower:" in tooltip and "What to do:" in tooltip
