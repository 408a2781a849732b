"""The Plan page's what-if hardware and recipe view: the real serving planner on the shipped
hardware examples, the real local planner and this machine's real probe, in offscreen Qt."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from PySide6.QtGui import QFontInfo
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from hearthside.app.gui.memory_bar import FREE_KIND, ServingGpuView
from hearthside.app.gui.plan_content import (
    THIS_MACHINE,
    PlanView,
    RecipeOutcome,
    example_choice,
    load_hardware,
)
from hearthside.app.gui.plan_page import WHAT_IF_HARDWARE_NOTE, PlanPage
from hearthside.autotune.serving import plan_vllm
from hearthside.core.models.catalog import resolve_spec
from hearthside.core.paths import models_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_in_subprocess

pytestmark = [pytest.mark.gui, pytest.mark.beside]

TIMEOUT_MS = 30_000
H100 = example_choice("hardware-example-8x-h100.json")
SPARKS = example_choice("hardware-example-2x-dgx-spark.json")
RTX_3090S = example_choice("hardware-example-2x-rtx-3090.json")
SMALL_MODEL = "llama-3.2-1b"  # a catalog what-if that fits any machine's local plan


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> HardwareProfile:
    """This machine, probed once in a child process as the Hardware page does."""
    return probe_in_subprocess(models_dir(tmp_path_factory.mktemp("recipes-home")))


@pytest.fixture
def page(qtbot: QtBot, profile: HardwareProfile) -> Iterator[PlanPage]:
    plan_page = PlanPage(probe=lambda: profile)
    qtbot.addWidget(plan_page)
    plan_page.resize(1280, 1000)
    plan_page.show()
    yield plan_page


def recipe_after(qtbot: QtBot, page: PlanPage, action: Callable[[], object]) -> RecipeOutcome:
    """Do `action` and wait for the recipe of the page's choice as it is then."""
    with qtbot.waitSignal(
        page.recipe_ready,
        timeout=TIMEOUT_MS,
        check_params_cb=lambda outcome: outcome.request == page.current_key(),
    ) as ready:
        action()
    outcome = ready.args[0]
    assert isinstance(outcome, RecipeOutcome) and page.recipe is outcome
    return outcome


def plan_after(qtbot: QtBot, page: PlanPage, action: Callable[[], object]) -> PlanView:
    with qtbot.waitSignal(
        page.plan_ready,
        timeout=TIMEOUT_MS,
        check_params_cb=lambda view: view.request == page.current_key(),
    ) as ready:
        action()
    return ready.args[0]  # type: ignore[no-any-return]


def choose(page: PlanPage, hardware: str, model: str) -> Callable[[], None]:
    def act() -> None:
        page.select_model(model, quiet=True)
        assert page.set_hardware(hardware)

    return act


def test_8x_h100_and_405b_show_a_tensor_parallel_vllm_command_to_copy(
    qtbot: QtBot, page: PlanPage
) -> None:
    outcome = recipe_after(qtbot, page, choose(page, H100, "llama-3.1-405b"))
    assert page.content_stack.currentWidget() is page.recipe_scroll
    (box,) = page.recipe_view.command_boxes
    text = box.text_box.toPlainText()
    assert text.startswith("vllm serve meta-llama/Llama-3.1-405B-Instruct")
    assert "--tensor-parallel-size 8" in text and "--pipeline-parallel-size 1" in text
    assert box.text_box.isReadOnly() and QFontInfo(box.text_box.font()).fixedPitch()
    QApplication.clipboard().clear()
    box.copy_button.click()
    assert QApplication.clipboard().text() == text
    assert box.copy_button.text() == "Copied"
    assert "tensor parallel 8" in page.recipe_view.verdict_label.text()
    assert not page.load_button.isEnabled()
    assert not page.recipe_view.checkpoint_row.isVisible()  # a known checkpoint
    assert page.recipe_view.reason_labels["tensor_parallel_size"][0].text() == "8"
    assert outcome.serving is not None and outcome.serving.tensor_parallel_size == 8


def test_the_bars_are_the_serving_plans_numbers(qtbot: QtBot, page: PlanPage) -> None:
    recipe_after(qtbot, page, choose(page, H100, "llama-3.1-405b"))
    cluster = load_hardware(H100)
    assert cluster is not None
    expected = plan_vllm(resolve_spec("llama-3.1-405b"), cluster)  # planned here, independently
    views = page.recipe_view.memory_views
    assert len(views) == len(expected.gpus) == 8
    for view, gpu in zip(views, expected.gpus, strict=True):
        assert isinstance(view, ServingGpuView)
        sizes = {segment.kind: segment.size_bytes for segment in view.bar.segments}
        assert sizes == {
            "weights": gpu.weights_bytes,
            "kv": gpu.kv_bytes,
            "compute": 0,
            "overhead": gpu.overhead_bytes,
            FREE_KIND: gpu.free_bytes,
        }
        assert gpu.weights_bytes > 40 * 1024**3 and gpu.kv_bytes > 0  # FP8 405B over 8 GPUs
        assert f"{gpu.kv_tokens:,} tokens" in view.legend_labels["kv"].text()
        widths = {segment.kind: rect.width() for segment, rect in view.bar.segment_rects()}
        per_pixel = gpu.total_bytes / (view.bar.width() - 1)
        assert widths["weights"] == pytest.approx(gpu.weights_bytes / per_pixel, abs=0.5)
        assert widths[FREE_KIND] == pytest.approx(gpu.free_bytes / per_pixel, abs=0.5)


def test_two_gb10_nodes_get_the_ray_blocks(qtbot: QtBot, page: PlanPage) -> None:
    outcome = recipe_after(qtbot, page, choose(page, SPARKS, "qwen3-235b-a22b"))
    assert outcome.serving is not None and outcome.serving.nodes == 2
    boxes = page.recipe_view.command_boxes
    titles = [box.block.title for box in boxes]
    assert [title.split(" (")[0] for title in titles] == [
        "On every node",
        "On the head node",
        "On each worker node",
    ]
    every, head, workers = (box.text_box.toPlainText() for box in boxes)
    assert "export NCCL_SOCKET_IFNAME=" in every and "export VLLM_HOST_IP=" in every
    assert all(len(line) <= 90 for line in every.splitlines())  # readable without scrolling
    assert head.startswith("ray start --head")
    assert "vllm serve" in head and "--distributed-executor-backend ray" in head
    assert "--pipeline-parallel-size 2" in head
    assert workers.startswith("ray start --address=HEAD_IP:")
    assert len(page.recipe_view.memory_views) == 2


def test_a_model_that_cannot_fit_shows_the_advice_and_no_command(
    qtbot: QtBot, page: PlanPage
) -> None:
    outcome = recipe_after(qtbot, page, choose(page, RTX_3090S, "llama-3.1-405b"))
    assert not outcome.fits and outcome.command is None
    view = page.recipe_view
    assert view.command_boxes == [] and not view.commands_card.isVisible()
    assert view.advice_card.isVisible() and view.advice_labels
    assert "does not fit" in view.advice_labels[0].text()
    assert view.verdict_label.property("kind") == "no"


def test_llama_server_shows_its_command_and_the_local_plans_devices(
    qtbot: QtBot, page: PlanPage
) -> None:
    recipe_after(qtbot, page, choose(page, RTX_3090S, "llama-3.1-8b"))
    outcome = recipe_after(qtbot, page, lambda: page.set_engine("llama-server"))
    assert outcome.llama is not None and outcome.request.engine == "llama-server"
    (box,) = page.recipe_view.command_boxes
    text = box.text_box.toPlainText()
    assert text.startswith("llama-server")
    assert "-ts " in text and "-ngl " in text
    devices = [view.budget.device for view in page.recipe_view.memory_views]
    assert devices == [device.device for device in outcome.llama.plan.devices]
    assert not page.recipe_view.checkpoint_row.isVisible()
    back = recipe_after(qtbot, page, lambda: page.set_engine("vllm"))
    assert back.serving is not None


def test_a_placeholder_checkpoint_can_be_filled_in(qtbot: QtBot, page: PlanPage) -> None:
    outcome = recipe_after(qtbot, page, choose(page, RTX_3090S, "gemma-3-27b"))
    assert outcome.checkpoint_is_placeholder
    assert page.recipe_view.checkpoint_row.isVisible()
    repo = "my-org/gemma-3-27b-it-AWQ"
    filled = recipe_after(qtbot, page, lambda: page.recipe_view.choose_checkpoint(repo))
    assert filled.request.checkpoint == repo
    text = page.recipe_view.command_boxes[0].text_box.toPlainText()
    assert text.startswith(f"vllm serve {repo}")


def test_back_to_this_machine_restores_the_local_plan(
    qtbot: QtBot, page: PlanPage, profile: HardwareProfile
) -> None:
    page.select_model(SMALL_MODEL, quiet=True)
    local = plan_after(qtbot, page, page.request_plan)
    recipe_after(qtbot, page, lambda: page.set_hardware(H100))
    assert not page.goal_box.isEnabled()
    again = plan_after(qtbot, page, lambda: page.set_hardware(THIS_MACHINE))
    assert again.request == local.request and again.request.hardware == THIS_MACHINE
    assert again.plan.devices == local.plan.devices
    assert page.content_stack.currentWidget() is page.scroll_area
    assert page.goal_box.isEnabled()
    shown = [view.budget for view in page.memory_views]
    assert shown == list(local.plan.devices)


def test_a_one_gpu_spec_gets_the_normal_plan_for_it_and_no_load(
    qtbot: QtBot, page: PlanPage, tmp_path: Path
) -> None:
    spec = {
        "schema": 1,
        "name": "One RTX 4090 box",
        "gpus": [{"model": "rtx-4090"}],
        "memory_gb": 64,
        "cpu": {"cores": 16, "threads": 32, "flags": ["avx2", "fma", "f16c"]},
        "os": "linux",
    }
    path = tmp_path / "one-gpu.json"
    path.write_text(json.dumps(spec), encoding="utf-8")
    page.select_model(SMALL_MODEL, quiet=True)
    view = plan_after(qtbot, page, lambda: page.open_hardware_spec(path))
    assert view.request.hardware == str(path)
    assert page.hardware_box.currentText() == "What if: One RTX 4090 box"
    assert page.content_stack.currentWidget() is page.scroll_area
    # The what-if GPU holds the whole model.
    assert [device.device for device in view.plan.devices] == ["CPU", "CUDA0"]
    assert view.plan.config.n_gpu_layers == -1
    assert not page.load_button.isEnabled()
    assert page.load_note.text() == WHAT_IF_HARDWARE_NOTE


def test_an_invalid_spec_is_refused_and_the_choice_stays(
    qtbot: QtBot, page: PlanPage, tmp_path: Path
) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema": 1, "gpus": [{"model": "rtx-9999"}]}', encoding="utf-8")
    assert not page.open_hardware_spec(path)
    assert "cannot be used" in page.error_text and "not valid" in page.error_text
    assert page.current_hardware() == THIS_MACHINE
    assert page.hardware_box.findData(str(path)) < 0
