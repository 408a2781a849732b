"""The screenshot script end to end (offscreen): every page renders to a PNG."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtGui import QImage

from hearthside.app.gui.screenshots import GAVE_UP

pytestmark = [pytest.mark.gui, pytest.mark.slow]

RUN_TIMEOUT_S = 240
EXPECTED = {
    "hardware_page.png": (1280, 800),
    "models_page.png": (1280, 800),
    "main_window.png": (1400, 900),
    "main_window_hardware.png": (1400, 900),
    "main_window_plan.png": (1400, 900),
    "plan_page.png": (1280, 1200),
    "plan_page_what_if.png": (1280, 1200),
    "plan_page_recipe_8x_h100.png": (1280, 1200),
    "plan_page_recipe_2x_gb10.png": (1280, 1200),
    "hub_dialog.png": (1100, 700),
    "wizard_1_found.png": (1000, 700),
    "wizard_2_goal.png": (1000, 700),
    "wizard_3_measuring.png": (1000, 700),
    "wizard_3_measuring_live.png": (1000, 700),
    "wizard_4_result.png": (1000, 700),
}


def test_the_script_renders_every_page(tmp_path: Path, default_model_file: Path) -> None:
    outdir = tmp_path / "shots"
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    command = [sys.executable, "-m", "hearthside.app.gui.screenshots", str(outdir)]
    completed = subprocess.run(
        [*command, "--model", str(default_model_file), "--home", str(tmp_path / "home")],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert GAVE_UP not in completed.stderr, completed.stderr[-3000:]
    for name, (width, height) in EXPECTED.items():
        image = QImage(str(outdir / name))
        assert (image.width(), image.height()) == (width, height), name
    switch = QImage(str(outdir / "api_switch_on.png"))
    assert switch.width() == 1100 and 20 < switch.height() < 80
    listed = completed.stdout.split()
    assert sorted(Path(p).name for p in listed) == sorted([*EXPECTED, "api_switch_on.png"])
