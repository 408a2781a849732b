"""`hearthside doctor` as a user runs it: real processes, a real crash, the real self-test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.app.test_crash_reports import run_child, run_cli

pytestmark = pytest.mark.beside


@pytest.mark.slow  # a real self-test and a real install of the shipped models
def test_doctor_shows_the_logs_the_crash_the_engine_and_the_models(
    hearthside_home: Path, chat_model_file: Path
) -> None:
    crashed = run_child(hearthside_home, "faulthandler._sigsegv()")
    assert crashed.returncode != 0
    assert run_cli(hearthside_home, "engine", "selftest").returncode == 0
    assert run_cli(hearthside_home, "models", "install-default").returncode == 0

    result = run_cli(hearthside_home, "doctor", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["log_file"] == str(hearthside_home / "logs" / "hearthside.log")
    assert len(report["crash_reports"]) == 1
    assert Path(report["crash_reports"][0]).read_text().count("Segmentation fault") >= 1
    assert report["engine"]["self_test"]["status"] == "passed"
    assert report["self_test_current"] is True
    assert {model["id"] for model in report["models"]} == {
        "smollm2-135m-instruct-q4_1",
        "gemma-3-270m-q4_k_m",
    }

    text = run_cli(hearthside_home, "doctor").stdout
    assert f"log file:      {hearthside_home / 'logs' / 'hearthside.log'}" in text
    assert "crash reports: 1" in text
    assert "self-test: passed its self-test" in text
    assert "smollm2-135m-instruct-q4_1 (default)" in text


def test_doctor_on_a_fresh_data_folder_creates_no_registry(hearthside_home: Path) -> None:
    result = run_cli(hearthside_home, "doctor")
    assert result.returncode == 0, result.stderr
    assert "models: none installed yet" in result.stdout
    assert "build: not recorded yet" in result.stdout
    assert not (hearthside_home / "models.db").exists()
