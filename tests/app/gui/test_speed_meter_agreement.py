"""One measurement, one number (issue 34): the speed-of-light figure `/metrics` gives for a
reply is the share the chat footer shows for that reply, and `hearthside bench`'s share for a
tgN run is the footer's for the same tokens and speed. A real server on loopback serving the
real default chat model (SmolLM2 135M) with the app's own meters, the real `openai` client
(30 s timeout), the real window's chat view, this machine calibrated with the 2-core EPYC VM's
recording (the machine these tests run on)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytestqt.qtbot import QtBot

from hearthside.app.api_models import speed_meters
from hearthside.app.chat_cli import bench_speed_of_light, speed_of_light_text
from hearthside.app.gui.chat_view import ChatView
from hearthside.app.gui.screenshot_recording import recorded_run, wizard_for_screenshots
from hearthside.app.gui.wizard import PAGE_RESULT
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.speed_limit import MachineLoad
from hearthside.autotune.speed_meter import limit_for_config
from hearthside.autotune.tuner import QUICK
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.bench import BenchReport, BenchStat, run_bench
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.engine.service import EngineService
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.core.server.app import ServerSettings
from hearthside.core.server.controller import ServerController
from hearthside.kernels.results import CalibrationReport
from tests.core.server.test_api import KEY, free_port

pytestmark = pytest.mark.gui

EPYC = Path(__file__).parents[2] / "fixtures" / "calibration" / "epyc-2core-speed-model.json"
CLIENT_TIMEOUT_S = 30.0
LIMIT_FOUND_WITHIN_S = 60.0
MODEL_ID = "smollm2"
N_GEN = 16


@pytest.fixture
def calibrated(hearthside_home: Path) -> HardwareProfile:
    """This machine's profile, its calibration the EPYC recording."""
    recorded = CalibrationReport.from_dict(json.loads(EPYC.read_text())["calibration"])
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    with WisdomDB() as wisdom:
        store_calibration(recorded, profile, wisdom)
    return profile


@pytest.fixture
def metered(calibrated: HardwareProfile, chat_model_file: Path) -> Iterator[ServerController]:
    service = EngineService().start()
    config = EngineConfig(model_path=str(chat_model_file), n_ctx=1024, n_threads=2)
    service.load(config).result()
    settings = ServerSettings(port=free_port(), api_key=KEY, model_id=MODEL_ID)
    controller = ServerController(settings, service, meters=speed_meters(lambda: calibrated))
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()
        service.stop()


def scrape(controller: ServerController) -> dict[str, float]:
    """The speed-of-light gauges for MODEL_ID, by metric name."""
    reply = httpx.get(
        f"http://127.0.0.1:{controller.settings.port}/metrics",
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=CLIENT_TIMEOUT_S,
    )
    assert reply.status_code == 200
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(reply.text)
        for sample in family.samples
        if sample.labels.get("model") == MODEL_ID
    }


def footer_note(view: ChatView, metrics: GenerationMetrics) -> str:
    note = view.metered_note(metrics)
    assert note is not None
    return note


def test_metrics_footer_and_bench_show_the_same_share(
    metered: ServerController, calibrated: HardwareProfile, qtbot: QtBot
) -> None:
    service = metered.pool.served
    config = service.loaded_config
    assert isinstance(config, EngineConfig)
    replies: list[GenerationResult] = []
    service.add_result_listener(
        lambda result: replies.append(result) if isinstance(result, GenerationResult) else None
    )
    deadline = time.monotonic() + LIMIT_FOUND_WITHIN_S
    while math.isnan(scrape(metered).get("hearthside_speed_limit_tokens_per_second", math.nan)):
        assert time.monotonic() < deadline, "the served model's limit was not worked out"
        time.sleep(0.2)
    assert math.isnan(scrape(metered)["hearthside_speed_of_light_ratio"])  # no reply yet

    client = openai.OpenAI(
        base_url=metered.url, api_key=KEY, max_retries=0, timeout=CLIENT_TIMEOUT_S
    )
    client.chat.completions.create(
        model=MODEL_ID,
        messages=[{"role": "user", "content": "Count from one to ten."}],
        max_tokens=N_GEN,
        temperature=0,
    )
    gauges = scrape(metered)
    (reply,) = replies
    with WisdomDB() as wisdom:
        limit = limit_for_config(config, calibrated, wisdom)  # as the window finds it
    assert limit is not None
    view = ChatView()
    qtbot.addWidget(view)
    view.set_speed_limit(limit)

    ratio = gauges["hearthside_speed_of_light_ratio"]
    assert gauges["hearthside_speed_limit_tokens_per_second"] == limit.limit_tps
    assert gauges["hearthside_speed_of_light_decode_tokens_per_second"] == (
        reply.metrics.decode_tok_s
    )
    assert f"· {ratio:.0%} of this machine's limit" in footer_note(view, reply.metrics)
    assert ratio == pytest.approx(
        reply.metrics.decode_tok_s / gauges["hearthside_speed_of_light_limit_tokens_per_second"],
        rel=1e-12,
    )

    report = service.call(
        lambda engine: run_bench(engine, n_prompt=0, n_gen=N_GEN, repetitions=2, warmup_s=0.2)
    ).result()
    figures = bench_speed_of_light(report, config, calibrated, MachineLoad(usable_cores=2))
    assert figures is not None
    decode = report.decode
    assert decode is not None
    same_tokens = GenerationMetrics(
        prompt_tokens=0,
        prompt_tokens_evaluated=0,
        completion_tokens=decode.n_tokens,
        ttft_s=None,
        prompt_tok_s=None,
        decode_tok_s=decode.median_tok_s,
        total_s=decode.n_tokens / decode.median_tok_s,
        stop_reason="length",
    )
    shown = f"{figures['share']:.0%} of this machine's limit"
    assert shown in speed_of_light_text(figures)
    assert f"· {shown}" in footer_note(view, same_tokens)


def test_the_wizards_result_shows_benchs_share_for_the_pick(
    qtbot: QtBot, default_model_file: Path
) -> None:
    """The recorded real tune of Gemma 3 270M (its file assembled here) on the recorded
    machine, calibrated with the EPYC recording: the result page's line gives the pick's tgN
    speed the share `hearthside bench` prints for that same measurement."""
    recording = recorded_run()
    result = replace(recording.result, model_path=str(default_model_file))
    best = result.best
    assert best is not None and best.decode_tps is not None and best.rigor == "quick"
    recorded = CalibrationReport.from_dict(json.loads(EPYC.read_text())["calibration"])
    with WisdomDB() as wisdom:
        store_calibration(recorded, recording.profile, wisdom)
    wizard = wizard_for_screenshots(PAGE_RESULT, replace(recording, result=result))
    qtbot.addWidget(wizard)
    wizard.show()
    speed = wizard.result_page.speed
    qtbot.waitUntil(speed.isVisible, timeout=30_000)

    as_bench_reports_it = BenchReport(
        model=default_model_file.name,
        engine_version="",
        repetitions=3,
        warmup_s=0.3,
        config=best.config,
        results=(BenchStat(f"tg{QUICK.n_gen}", QUICK.n_gen, best.decode_tps, 0.0, ()),),
    )
    config = EngineConfig.from_dict({**best.config, "model_path": str(default_model_file)})
    figures = bench_speed_of_light(
        as_bench_reports_it, config, recording.profile, MachineLoad(usable_cores=2)
    )
    assert figures is not None
    shown = f"{figures['share']:.0%} of this machine's limit"
    assert shown in speed_of_light_text(figures)
    assert speed.text().startswith(f"With these settings it wrote {best.decode_tps:.0f} tok/s")
    assert shown in speed.text()
    assert "tok/s of a possible" in speed.toolTip()
