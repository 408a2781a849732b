"""The Hardware page on recorded machines: the probe child prints a profile assembled from the
probe fixtures (tests/fixtures/probe/{cpu,memory,gpu,engine}), the page shows it, and each
advice with a runnable fix gets its button. Fix commands really run, as `--dry-run`."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QLabel, QMessageBox
from pytestqt.qtbot import QtBot

from hearthside.app.gui import hardware_page
from hearthside.app.gui.hardware_page import FixAction, HardwarePage
from hearthside.autotune.calibration import store_calibration
from hearthside.autotune.optimize import machine_context
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.paths import data_dir
from hearthside.core.probe.engine import engine_info_from
from hearthside.core.probe.profile import EngineDevice, EngineInfo, HardwareProfile
from hearthside.core.probe.runner import with_advice
from hearthside.kernels.calibrate import summarize_machine
from hearthside.kernels.measurement import Measurement, Samples
from hearthside.kernels.results import CalibrationError, CalibrationReport, export_calibration

pytestmark = pytest.mark.gui

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"
PROBE_TIMEOUT_MS = 20_000
FIX_TIMEOUT_MS = 60_000
GIB = 1024**3


def golden(kind: str, name: str) -> HardwareProfile:
    return HardwareProfile.from_json((FIXTURES / kind / name / "golden.json").read_text())


def cpu_only_engine(cpu_model: str) -> EngineInfo:
    """What bootstrap installs where it found no GPU toolkit: llama.cpp for the CPU."""
    device = EngineDevice("CPU", cpu_model, "cpu", 64 * GIB, 60 * GIB)
    return EngineInfo(package_version="0.3.36", backends=("CPU",), devices=(device,))


def recorded_engine(name: str) -> EngineInfo:
    data: dict[str, Any] = json.loads((FIXTURES / "engine" / name).read_text())
    return engine_info_from(
        data["devices"],
        data["backends"],
        data["system_info"],
        data["version"],
        gpu_offload=data["gpu_offload"],
    )


def machine(cpu: str, gpu: str, engine: EngineInfo | None, memory: str = "plain-host") -> Any:
    """One recorded machine: each source's golden profile, merged, with the probe's advice."""
    cpu_part, gpu_part = golden("cpu", cpu), golden("gpu", gpu)
    merged = replace(
        cpu_part,
        memory=golden("memory", memory).memory,
        gpus=gpu_part.gpus,
        engine=engine,
        os=gpu_part.os,
    )
    return with_advice(merged)


def rtx_3090_desktop() -> HardwareProfile:
    return machine("desktop-avx2-6core", "rtx-3090", cpu_only_engine("AMD Ryzen 5 3600"))


def mi50_server() -> HardwareProfile:
    return machine("server-avx512", "mi50", cpu_only_engine("Intel Xeon Platinum 8380"))


def mac_studio() -> HardwareProfile:
    return machine("apple-m3-ultra", "apple-m3-ultra", recorded_engine("metal-m3-ultra.json"))


def printing(profile: HardwareProfile, tmp_path: Path) -> list[str]:
    """A probe command whose child prints `profile`, as `python -m hearthside.core.probe` does."""
    recorded = tmp_path / "profile.json"
    recorded.write_text(profile.to_json())
    return [sys.executable, "-c", "import sys; print(open(sys.argv[1]).read())", str(recorded)]


def texts(page: HardwarePage) -> str:
    return "\n".join(label.text() for label in page.findChildren(QLabel))


def probed_page(qtbot: QtBot, command: list[str] | None) -> tuple[HardwarePage, HardwareProfile]:
    page = HardwarePage(probe_command=command)
    qtbot.addWidget(page)
    page.show()
    with qtbot.wait_signal(page.profile_ready, timeout=PROBE_TIMEOUT_MS) as ready:
        page.refresh()
        assert page.busy.isVisible() and not page.refresh_button.isEnabled()  # did not block
    assert not page.busy.isVisible()
    card = page.calibration_card  # read from the autotune DB on a worker thread
    assert card is not None
    qtbot.waitUntil(lambda: card.loaded, timeout=PROBE_TIMEOUT_MS)
    return page, ready.args[0]


def answer_confirmations(
    monkeypatch: pytest.MonkeyPatch, answer: QMessageBox.StandardButton
) -> list[str]:
    asked: list[str] = []

    def question(_parent: object, _title: str, text: str, *_args: object) -> Any:
        asked.append(text)
        return answer

    monkeypatch.setattr(hardware_page.QMessageBox, "question", question)
    return asked


def test_an_rtx_3090_desktop_shows_its_gpu_and_offers_the_cuda_rebuild(
    qtbot: QtBot, tmp_path: Path
) -> None:
    recorded = rtx_3090_desktop()
    page, shown = probed_page(qtbot, printing(recorded, tmp_path))
    assert shown == recorded
    text = texts(page)
    for expected in (
        "GPU 0: NVIDIA GeForce RTX 3090",
        "sm_86",
        "24.0 GiB (23.4 GiB free)",
        "936 GB/s",
        "560.35.03 (CUDA 12.6)",
        "Gen 4 ×16",
        "AMD Ryzen 5 3600 6-Core Processor",
        "AVX · AVX2 · F16C · FMA · SSE4_2",
        "62.7 GiB total, 55.1 GiB free",
        "no: the CPU does all the work",
        "RTX 3090 is present, but the installed engine was built for the CPU only",
        "Not calibrated yet",
    ):
        assert expected in text, expected
    assert [button.text() for button in page.fix_buttons] == ["Rebuild the engine for CUDA"]
    assert page.fix_buttons[0].toolTip() == "hearthside engine rebuild --backend cuda"


def test_an_mi50_server_gets_the_hip_rebuild_button_and_the_rocm_advice_as_text(
    qtbot: QtBot, tmp_path: Path
) -> None:
    page, _profile = probed_page(qtbot, printing(mi50_server(), tmp_path))
    text = texts(page)
    assert "AMD Instinct MI50" in text and "gfx906" in text and "1,024 GB/s" in text
    assert "ROCm 6.4 dropped gfx906" in text
    assert "What to do: Install ROCm 6.3" in text  # a manual step: no button for it
    assert [button.text() for button in page.fix_buttons] == ["Rebuild the engine for ROCm/HIP"]


def test_a_mac_whose_metal_engine_drives_its_gpu_needs_no_fix(qtbot: QtBot, tmp_path: Path) -> None:
    page, _profile = probed_page(qtbot, printing(mac_studio(), tmp_path))
    text = texts(page)
    assert "Apple M3 Ultra" in text and "shared with the CPU" in text
    assert "MTL, BLAS, CPU" in text and "MTL0" in text
    assert "Nothing to fix" in text
    assert page.fix_buttons == []


def test_probing_this_machine_for_real(qtbot: QtBot) -> None:
    page, profile = probed_page(qtbot, None)
    assert profile.errors == () and profile.engine is not None and "CPU" in profile.engine.backends
    text = texts(page)
    assert (profile.cpu.model or profile.cpu.arch) in text
    assert "What the engine can use" in text and "Models folder" in text


def test_a_crashing_probe_is_reported_in_plain_words(qtbot: QtBot) -> None:
    crash = [sys.executable, "-c", "import os; os.abort()"]
    page, profile = probed_page(qtbot, crash)
    assert profile.errors and "crashed" in profile.errors[0].message
    text = texts(page)
    assert "Problems while probing" in text
    assert "probe: the hardware probe crashed (signal 6)" in text
    assert "Traceback" not in text


def test_a_probe_that_raises_shows_its_last_words_not_its_traceback(qtbot: QtBot) -> None:
    failing = [sys.executable, "-c", "raise RuntimeError('the driver went away')"]
    page, _profile = probed_page(qtbot, failing)
    text = texts(page)
    assert "the hardware probe failed (exit 1): RuntimeError: the driver went away" in text
    assert "Traceback" not in text


def test_the_rebuild_asks_first_then_runs_with_its_output_in_the_log(
    qtbot: QtBot, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page, _profile = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    declined = answer_confirmations(monkeypatch, QMessageBox.StandardButton.No)
    page.fix_buttons[0].click()
    assert "hearthside engine rebuild --backend cuda" in declined[0]
    assert page.process is None and not page.log_panel.isVisible()

    answer_confirmations(monkeypatch, QMessageBox.StandardButton.Yes)
    # The real command, but as a dry run: it plans the build and prints pip's command line.
    real_command = hardware_page.fix_command
    monkeypatch.setattr(
        hardware_page, "fix_command", lambda action: [*real_command(action), "--dry-run"]
    )
    page.fix_buttons[0].click()
    assert page.process is not None and page.log_panel.isVisible()
    assert not page.fix_buttons[0].isEnabled()  # one fix at a time
    qtbot.waitUntil(lambda: page.process is None, timeout=FIX_TIMEOUT_MS)
    log = page.log.toPlainText()
    assert log.startswith("$ hearthside engine rebuild --backend cuda")
    assert "Engine build: cuda" in log and "-DGGML_CUDA=on" in log
    assert page.log_title.text().startswith("Finished.")
    assert page.fix_buttons[0].isEnabled()


def recorded_report(**changes: Any) -> CalibrationReport:
    samples = Samples(values=(38.0, 38.2, 38.9), runs=5)
    report = CalibrationReport(
        schema=1,
        created_at="2026-05-04T10:20:30+00:00",
        hearthside_version="0.1.0",
        machine={"cpu": "AMD Ryzen 5 3600"},
        measurements=(
            Measurement.from_samples(
                "memory_read", "cpu", "GB/s", samples, method="numpy sum", params={"threads": 6}
            ),
            Measurement.from_samples(
                "engine_decode", "cpu", "tok/s", Samples((71.5,), 1), method="tg32"
            ),
            Measurement.failed("matmul", "gpu", "GFLOP/s", "no GPU"),
        ),
        anomalies=("Memory bandwidth is below what this CPU usually reaches.",),
        duration_s=42.0,
    )
    return replace(report, **changes)


def test_calibration_figures_are_shown_from_the_autotune_db(qtbot: QtBot, tmp_path: Path) -> None:
    with WisdomDB() as wisdom:  # what `hearthside calibrate` stored for this machine
        store_calibration(recorded_report(), rtx_3090_desktop(), wisdom)
    page, _profile = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    text = texts(page)
    assert "Memory read (cpu)" in text and "38.2 GB/s ±2%   threads=6" in text
    assert "Generation speed (cpu)" in text and "71.5 tok/s" in text
    assert "Measured 2026-05-04 10:20 UTC." in text
    assert "Memory bandwidth is below what this CPU usually reaches." in text
    assert "Matrix multiply: no GPU" in text
    assert "Not calibrated yet" not in text and hardware_page.READING_CALIBRATION not in text


def test_an_upgrade_shows_the_old_calibration_json_of_this_machine(
    qtbot: QtBot, tmp_path: Path
) -> None:
    machine = summarize_machine(rtx_3090_desktop(), torch_version=None)
    export_calibration(recorded_report(machine=machine), data_dir() / "calibration.json")
    page, _profile = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    assert "Measured 2026-05-04 10:20 UTC." in texts(page)
    other, _ = probed_page(qtbot, printing(mi50_server(), tmp_path))  # measured elsewhere
    assert "Not calibrated yet" in texts(other)


def test_a_calibration_from_a_newer_version_says_so_and_how_to_fix_it() -> None:
    with WisdomDB() as wisdom:
        store_calibration(recorded_report(schema=99), rtx_3090_desktop(), wisdom)
    with pytest.raises(CalibrationError) as unreadable:
        machine_context(rtx_3090_desktop())  # what the window's MachineState reads
    view = hardware_page.unreadable_view(unreadable.value)
    assert view is not None
    assert view.status.startswith("This calibration comes from a newer Hearthside.")
    assert "Press “Measure this machine”" in view.status  # a button, not a command
    assert not view.calibrated and view.notes == ()


def test_only_hearthside_commands_become_buttons() -> None:
    profile = rtx_3090_desktop()
    manual = replace(
        profile.advice[0], fix="Install CUDA 12.x, then run `hearthside engine rebuild`."
    )
    other = replace(profile.advice[0], fix="hearthside models remove everything")
    assert hardware_page.fix_action(manual, profile) is None
    assert hardware_page.fix_action(other, profile) is None
    assert hardware_page.fix_action(profile.advice[0], profile) == FixAction(
        "Rebuild the engine for CUDA", ("engine", "rebuild", "--backend", "cuda")
    )


def test_the_engine_card_says_which_build_passed_its_self_test_and_what_crashed_before(
    qtbot: QtBot, tmp_path: Path, hearthside_home: Path
) -> None:
    from hearthside.core.probe.engine_build import cpu_build_ladder, read_cpu_flags
    from hearthside.core.probe.engine_ladder import Attempt, EngineRecord, write_record
    from tests.core.probe.test_engine_ladder import AMX_CRASH, PASSED

    spr = read_cpu_flags(FIXTURES / "cpu" / "sapphire-rapids-amx")
    first, avx2, _ = cpu_build_ladder(spr, "x86_64")
    attempts = (Attempt(first, AMX_CRASH), Attempt(avx2, PASSED))
    write_record(hearthside_home, EngineRecord(avx2, PASSED, "kept", attempts))

    page, _ = probed_page(qtbot, printing(rtx_3090_desktop(), tmp_path))
    shown = texts(page)
    assert "an AVX2 baseline (avx2)" in shown
    assert "crashed in its self-test (SIGSEGV, a segmentation fault)" in shown
    assert "passed its self-test" in shown
    assert "-DGGML_AMX_INT8=OFF" in shown
    assert "the engine changed since" in shown  # recorded elsewhere: not these libraries
