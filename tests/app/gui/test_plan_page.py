"""The Plan page with the real planner, the real default model, this machine's real probe, a
real wisdom DB and (for "Load with this plan") the real engine, in offscreen Qt widgets."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QLabel
from pytestqt.qtbot import QtBot

from hearthside.app.gui.main_window import PLAN_PAGE, MainWindow
from hearthside.app.gui.memory_bar import FREE_KIND
from hearthside.app.gui.model_loader import LoadOptions
from hearthside.app.gui.plan_content import PlanView
from hearthside.app.gui.plan_page import PlanPage
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.memory import CPU
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, describe_slots, evaluate_config
from hearthside.autotune.speculative import SpeculationDecision, speculative_key
from hearthside.autotune.tuner import save_speculation_defaults
from hearthside.autotune.wisdom import QualityRecord, RunRecord, WisdomDB
from hearthside.core.engine.config import EngineConfig, SpeculativeConfig
from hearthside.core.engine.service import EngineService
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_in_subprocess

pytestmark = pytest.mark.gui

PLAN_TIMEOUT_MS = 30_000
LOAD_TIMEOUT_MS = 120_000
MODEL_NAME = "Gemma 3 270M (test)"
# Far bigger than any machine this runs on: a what-if that cannot fit in memory.
HUGE_WHAT_IF = "llama-3.1-405b"


@pytest.fixture(scope="module")
def module_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("plan-home")


@pytest.fixture(autouse=True)
def hearthside_home(module_home: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """One data dir for the module (the default model registered once), like the app's."""
    monkeypatch.setenv("HEARTHSIDE_HOME", str(module_home))
    return module_home


@pytest.fixture(scope="module")
def model_id(module_home: Path, default_model_file: Path) -> str:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEARTHSIDE_HOME", str(module_home))
        with ModelStore(data_dir()) as store:
            record = store.add(default_model_file, link=True, name=MODEL_NAME, check_native=False)
            store.set_default(record.id)
    return record.id


@pytest.fixture(scope="module")
def profile(module_home: Path) -> HardwareProfile:
    """This machine, probed once in a child process as the Hardware page does."""
    return probe_in_subprocess(models_dir(module_home))


@pytest.fixture
def page(qtbot: QtBot, model_id: str, profile: HardwareProfile) -> Iterator[PlanPage]:
    plan_page = PlanPage(probe=lambda: profile)
    qtbot.addWidget(plan_page)
    plan_page.resize(1200, 900)
    yield plan_page


def shown_plan(qtbot: QtBot, page: PlanPage) -> PlanView:
    """Show the page (which plans its current choice) and wait for the plan."""
    with qtbot.waitSignal(page.plan_ready, timeout=PLAN_TIMEOUT_MS) as ready:
        page.show()
    view = ready.args[0]
    assert isinstance(view, PlanView)
    return view


def replanned(qtbot: QtBot, page: PlanPage) -> PlanView:
    with qtbot.waitSignal(page.plan_ready, timeout=PLAN_TIMEOUT_MS) as ready:
        page.request_plan()
    return ready.args[0]  # type: ignore[no-any-return]


def test_the_default_model_gets_a_cpu_memory_bar_matching_the_plan(
    qtbot: QtBot, page: PlanPage, model_id: str
) -> None:
    view = shown_plan(qtbot, page)
    assert view.request.ref == model_id and page.current_ref() == model_id
    assert view.plan.fits and "Fits in memory" in page.verdict_label.text()
    cpu = next(device for device in view.plan.devices if device.device == CPU)
    bars = {device_view.budget.device: device_view.bar for device_view in page.memory_views}
    bar = bars[CPU]
    sizes = {segment.kind: segment.size_bytes for segment in bar.segments}
    assert sizes == {
        "weights": cpu.weights_bytes,
        "kv": cpu.kv_bytes,
        "compute": cpu.compute_bytes,
        "overhead": cpu.overhead_bytes,
        FREE_KIND: cpu.free_bytes,
    }
    assert cpu.weights_bytes > 200 * 1024**2 and cpu.kv_bytes > 0  # a 253 MB file, some context
    widths = {segment.kind: rect.width() for segment, rect in bar.segment_rects()}
    for kind, size in sizes.items():
        assert widths[kind] == pytest.approx(size / cpu.capacity_bytes * (bar.width() - 1), abs=0.5)
    assert not bar.over_capacity
    assert page.load_button.isEnabled()


def test_every_setting_shows_its_reason(qtbot: QtBot, page: PlanPage) -> None:
    view = shown_plan(qtbot, page)
    shown = {name: (value.text(), why.text()) for name, (value, why) in page.setting_labels.items()}
    for name in ("GPU layers", "KV cache type", "Flash attention", "Context", "Threads", "Batch"):
        assert name in shown and shown[name][1], name
    assert shown["Context"][0] == f"{view.plan.config.n_ctx:,} tokens"
    assert shown["KV cache type"][0] == view.plan.config.type_k
    # what bounds generation is said under the predicted speeds
    all_reasons = " ".join([*(why for _value, why in shown.values()), page.speed_note.text()])
    for reason in view.plan.reasons:
        assert reason.why in all_reasons, reason.setting
    _value, why_label = page.setting_labels["GPU layers"]
    qtbot.waitUntil(why_label.isVisible)  # new rows show on the next pass of the event loop
    assert page.alternatives_layout.count() == max(1, len(view.plan.alternatives))


def test_the_controls_are_reachable_with_the_keyboard(qtbot: QtBot, page: PlanPage) -> None:
    shown_plan(qtbot, page)
    page.set_overrides_open(True)
    chain, widget = [], page.model_box.nextInFocusChain()
    while widget is not page.model_box and len(chain) < 500:
        if widget.focusPolicy() & Qt.FocusPolicy.TabFocus and widget.isEnabled():
            chain.append(widget)
        widget = widget.nextInFocusChain()
    wanted = [
        page.goal_box,
        page.context_box,
        page.keep_free_box,
        page.load_button,
        page.overrides_toggle,
        page.ctx_box,
        page.kv_box,
        page.reset_button,
    ]
    assert all(control in chain for control in wanted)
    positions = [chain.index(control) for control in wanted]
    assert positions == sorted(positions)  # top to bottom, as they appear
    for control, label in ((page.model_box, "&Model"), (page.ctx_box, "Conte&xt")):
        buddies = [w for w in page.findChildren(QLabel) if w.text() == label]
        assert buddies and buddies[0].buddy() is control  # Alt+letter mnemonics


def test_a_huge_what_if_model_gets_advice_and_cannot_be_loaded(
    qtbot: QtBot, page: PlanPage
) -> None:
    shown_plan(qtbot, page)
    assert page.select_model(HUGE_WHAT_IF)
    view = replanned(qtbot, page)
    assert view.what_if and not view.plan.fits
    assert page.verdict_label.property("kind") in ("streams", "no")
    assert not page.load_button.isEnabled()
    assert "no file to load" in page.load_note.text()
    qtbot.waitUntil(page.advice_card.isVisible)
    advice = " ".join(view.plan.advice)
    assert "smaller quant" in advice or "Nothing fits" in advice


def test_keeping_all_memory_free_means_nothing_fits(qtbot: QtBot, page: PlanPage) -> None:
    shown_plan(qtbot, page)
    page.keep_free_box.setValue(page.keep_free_box.maximum())
    view = replanned(qtbot, page)
    assert view.request.free_margin_bytes == int(page.keep_free_box.maximum() * 1024**3)
    assert not view.plan.fits and not view.plan.streams_from_disk
    assert page.verdict_label.text() == "Won't fit on this computer"
    assert any(view.bar.over_capacity for view in page.memory_views)
    assert not page.load_button.isEnabled()
    assert "Nothing fits" in " ".join(view.plan.advice)


def test_an_override_beyond_the_models_context_is_refused(qtbot: QtBot, page: PlanPage) -> None:
    view = shown_plan(qtbot, page)
    trained = view.spec.context_length
    assert trained
    page.set_overrides_open(True)
    assert page.overrides_body.isVisible()
    page.ctx_box.setValue(trained * 64)
    result = page.override
    assert result is not None and not result.ok
    assert "beyond what this model was trained for" in page.override_status.text()
    assert result.candidate is not None
    if not result.candidate.fits:  # 64× the context of KV does not fit in most machines' RAM
        assert "Doesn't fit" in page.override_status.text()
    assert page.load_button.text() == "Load with these settings"
    assert not page.load_button.isEnabled()
    page.ctx_box.setValue(trained)
    page.kv_box.setCurrentText("f16")
    assert page.override is not None and page.override.ok, page.override_status.text()
    assert page.override_status.text().startswith("Fits")
    assert page.load_button.isEnabled()
    page.reset_overrides()
    assert page.ctx_box.value() == view.plan.config.n_ctx
    assert page.load_button.text() == "Load with this plan"


def test_a_quantized_v_cache_without_flash_attention_is_explained(
    qtbot: QtBot, page: PlanPage
) -> None:
    shown_plan(qtbot, page)
    page.set_overrides_open(True)
    page.kv_box.setCurrentText("q8_0")
    page.flash_box.setChecked(False)
    assert page.override is not None and not page.override.ok
    assert "needs flash attention" in page.override_status.text()


def test_measured_speed_appears_beside_the_prediction(
    qtbot: QtBot, page: PlanPage, profile: HardwareProfile, default_model_file: Path
) -> None:
    view = shown_plan(qtbot, page)
    assert page.speed_labels["Generation (decode)"][1].text() == "—"
    with WisdomDB() as wisdom:
        wisdom.record_run(
            RunRecord(
                key=tuning_key(profile, default_model_file),
                # as the tuner records it: one slot, whatever slots the plan adds
                config=view.plan.config.with_changes(n_parallel=1).to_dict(),
                rigor="quick",
                outcome="ok",
                prefill_tps=712.0,
                decode_tps=68.4,
                ttft_s=0.18,
            )
        )
    measured_view = replanned(qtbot, page)
    assert measured_view.measured is not None and measured_view.measured.same_settings
    predicted, measured = page.speed_labels["Generation (decode)"]
    assert measured.text() == "68.4 tok/s"
    assert predicted.text().endswith("tok/s") and predicted.text() != "—"
    assert page.speed_labels["Prompt (prefill)"][1].text() == "712 tok/s"
    assert page.speed_labels["First token"][1].text() == "0.18 s"
    assert "Confidence: measured" in page.confidence_label.text()
    assert "Measured with these settings" in page.speed_note.text()


def test_the_speculation_tuning_chose_shows_per_kind_of_prompt(
    qtbot: QtBot, page: PlanPage, profile: HardwareProfile, default_model_file: Path
) -> None:
    """Figures as `hearthside tune` recorded them on this machine (code edit: prompt lookup
    k=16 decoded 1.87x plain decode with 97% of drafts accepted; chat: no gain)."""
    view = shown_plan(qtbot, page)
    assert not [name for name in page.setting_labels if name.startswith("Speculation")]
    key = tuning_key(profile, default_model_file)
    config = view.plan.config.to_dict()
    lookup = SpeculativeConfig(mode="prompt_lookup", draft_tokens=16, ngram_size=2)
    stats = {"mode": "prompt_lookup", "draft_tokens": 16, "drafted": 480, "accepted": 466,
             "steps": 40, "draft_steps": 33, "rejections": 3, "acceptance_rate": 0.97,
             "mean_accepted_length": 14.1}  # fmt: skip
    with WisdomDB() as wisdom:
        for speculative, decode, extra in (
            (SpeculativeConfig(), 41.0, None),
            (lookup, 76.7, {"speculation": stats, "paired_gain": 1.87}),
        ):
            wisdom.record_run(
                RunRecord(
                    speculative_key(key, "code_edit"),
                    {**config, "speculative": asdict(speculative)},
                    "quick",
                    "ok",
                    decode_tps=decode,
                    predicted=extra,
                )
            )
        decisions = [
            SpeculationDecision("code_edit", lookup, 1.87, 41.0, 0.97, 14.1, "pays"),
            SpeculationDecision("chat", SpeculativeConfig(), None, 40.0, None, None, "no gain"),
        ]
        save_speculation_defaults(wisdom, key, config, "fastest", decisions)
    replanned(qtbot, page)
    value, why = page.setting_labels["Speculation (Code edit)"]
    assert value.text() == "prompt lookup, k=16, n-gram 2"
    assert why.text() == "Measured 1.87× faster than plain decoding, 97% of drafts accepted."
    value, why = page.setting_labels["Speculation (Chat)"]
    assert value.text() == "off" and "stays off" in why.text()


def test_a_missing_model_file_is_explained(
    qtbot: QtBot,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    default_model_file: Path,
    profile: HardwareProfile,
) -> None:
    monkeypatch.setenv("HEARTHSIDE_HOME", str(tmp_path / "home"))
    linked = tmp_path / "soon-gone.gguf"
    os.link(default_model_file, linked)
    with ModelStore(data_dir()) as store:
        record = store.add(linked, link=True, name="Soon gone", check_native=False)
    linked.unlink()
    page = PlanPage(probe=lambda: profile)
    qtbot.addWidget(page)
    assert page.select_model(record.id)
    with qtbot.waitSignal(page.plan_failed, timeout=PLAN_TIMEOUT_MS):
        page.show()
    assert page.error_box.isVisible()
    assert f"The file for model '{record.id}' is missing" in page.error_text
    assert "remove the entry" in page.error_text  # what to do about it
    assert not page.load_button.isEnabled()


def test_load_with_this_plan_loads_the_plans_config_in_the_engine(
    qtbot: QtBot,
    qapp: QApplication,
    model_id: str,
    profile: HardwareProfile,
    default_model_file: Path,
) -> None:
    service = EngineService().start()
    window = MainWindow(service, load_options=LoadOptions(n_ctx=2048))
    try:
        window.show()
        window.hardware_page.show_profile(profile)
        # the Hardware page's, with its context read once for both pages: not a second probe
        qtbot.waitUntil(lambda: window.plan_page.profile is profile, timeout=PLAN_TIMEOUT_MS)
        assert not window.plan_page.busy  # no probe of its own
        with qtbot.waitSignal(window.plan_page.plan_ready, timeout=PLAN_TIMEOUT_MS) as ready:
            window.page_actions[PLAN_PAGE].trigger()
        plan_config = ready.args[0].plan.config
        assert plan_config.model_path == model_id
        with qtbot.waitSignal(window.bridge.load_finished, timeout=LOAD_TIMEOUT_MS) as loaded:
            window.plan_page.load_button.click()
        model = loaded.args[0]
        assert model.config == plan_config.with_changes(model_path=str(default_model_file))
        assert model.model_id == model_id and model.name == MODEL_NAME
        assert model.n_ctx >= plan_config.n_ctx
        assert window.pages.currentIndex() == 0
        assert window.plan_page.current_ref() == model_id
    finally:
        window.close()
        service.stop()


def test_the_plan_shows_its_parallel_requests_and_asks_for_more(
    qtbot: QtBot, page: PlanPage
) -> None:
    view = shown_plan(qtbot, page)
    value, why = page.setting_labels["Parallel requests"]
    assert value.text() == describe_slots(view.plan)  # the line `hearthside plan` prints
    assert f"KV cache for {view.plan.config.total_context} tokens" in value.text()
    assert why.text() == next(r.why for r in view.plan.reasons if r.setting == "n_parallel")
    assert page.parallel_box.value() == 0 and page.parallel_box.text() == "Automatic"
    page.parallel_box.setValue(2)
    asked = replanned(qtbot, page)
    assert asked.request.n_parallel == 2 and asked.plan.config.n_parallel == 2
    value, why = page.setting_labels["Parallel requests"]
    assert value.text().startswith("2 parallel requests × ") and why.text().startswith("As asked")
    assert page.slots_box.value() == 2  # the overrides start from the plan
    page.set_overrides_open(True)
    page.slots_box.setValue(64)
    assert page.override is not None and page.override.config is not None
    assert page.override.config.n_parallel == 64


def family_row(kv_type: str, mean_kld: float) -> QualityRecord:
    """A KV type measured on another Gemma 3 model on this machine (not the page's model)."""
    return QualityRecord(
        reference_model="gemma3-1b-fprint",
        candidate_model="gemma3-1b-fprint",
        kv_type=kv_type,
        text_hash="f" * 64,
        n_ctx=1024,
        candidate="Q8_0",
        reference="gemma-3-1b-it-Q8_0.gguf",
        n_tokens=4000,
        mean_kld=mean_kld,
        kld_p99=0.1,
        top1_agreement=0.97,
        perplexity=12.0,
        reference_perplexity=11.9,
        architecture="gemma3",
    )


LONG_CONTEXT = 131072


def only_a_q4_0_cache_fits(profile: HardwareProfile, model: Path) -> HardwareProfile:
    """This machine with just enough memory for a LONG_CONTEXT q4_0 KV cache, not a q8_0 one:
    a quantized cache is chosen only where memory asks for it."""
    spec = spec_from_gguf(model)

    def used(kv: str) -> int:
        config = EngineConfig(str(model), n_ctx=LONG_CONTEXT, type_k=kv, type_v=kv, flash_attn=True)
        candidate = evaluate_config(spec, profile, config, free_margin_bytes=0)
        return next(d.used_bytes for d in candidate.devices if d.device == CPU)

    ram = DEFAULT_FREE_MARGIN_BYTES + (used("q4_0") + used("q8_0")) // 2
    memory = replace(profile.memory, total_bytes=ram, available_bytes=ram, cgroup_limit_bytes=None)
    return replace(profile, memory=memory)


def test_the_quality_line_names_a_family_measurement_apart_from_a_prior(
    qtbot: QtBot, model_id: str, profile: HardwareProfile, default_model_file: Path
) -> None:
    page = PlanPage(probe=lambda: only_a_q4_0_cache_fits(profile, default_model_file))
    qtbot.addWidget(page)
    page.resize(1200, 900)
    page.context_box.setValue(LONG_CONTEXT)
    shown_plan(qtbot, page)
    with qtbot.waitSignal(page.plan_ready, timeout=PLAN_TIMEOUT_MS) as ready:
        page.set_goal("fastest")
    by_priors = ready.args[0]
    assert by_priors.plan.config.type_k == "q4_0"  # beyond the budget, but nothing else fits
    assert "(a prior, not measured yet)" in page.speed_note.text()

    with WisdomDB() as wisdom:  # the family measured both quantized caches as harmless
        wisdom.save_quality(family_row("q8_0", 0.004))
        wisdom.save_quality(family_row("q4_0", 0.012))
    by_family = replanned(qtbot, page)

    kv_type = by_family.plan.config.type_k
    assert kv_type == "q4_0"  # now known to stay within the budget
    expected = f"{kv_type} KV: KLD 0.012 measured on gemma-3-1b-it (same family, gemma3)"
    assert expected in page.speed_note.text()
    assert "a prior" not in page.speed_note.text()
    _value, why = page.setting_labels["KV cache type"]
    assert expected in why.text()
