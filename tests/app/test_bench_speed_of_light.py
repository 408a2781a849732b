"""`hearthside bench` measures the real engine and reports its decode speed's share of this
machine's limit, from the calibration stored for this machine (the 2-core EPYC VM's recording:
the machine these tests run on)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.autotune.calibration import planner_figures, store_calibration
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.results import CalibrationReport
from tests.app.test_cli import run_cli

EPYC = Path(__file__).parents[1] / "fixtures" / "calibration" / "epyc-2core-speed-model.json"
BENCH = ("-p", "32", "-n", "16", "-r", "2", "--warmup-s", "0.2", "--ctx", "256", "--threads", "2")


@pytest.fixture
def calibrated(hearthside_home: Path) -> float:
    """This machine's profile, calibrated with the recording; its RAM read bytes/s on 2 threads."""
    recorded = CalibrationReport.from_dict(json.loads(EPYC.read_text())["calibration"])
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    with WisdomDB() as wisdom:
        store_calibration(recorded, profile, wisdom)
    return planner_figures(recorded)["cpu_read_bytes_per_s:2"]


def test_bench_json_has_the_decode_share_of_the_calibrated_limit(
    calibrated: float, default_model_file: Path
) -> None:
    result = run_cli("bench", "--model", str(default_model_file), "--json", *BENCH)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    decode = next(entry for entry in report["results"] if entry["test"] == "tg16")
    light = report["speed_of_light"]
    assert light["test"] == "tg16" and light["measured_tps"] == decode["median_tok_s"]
    limit = light["limit"]
    # Gemma 3 270M's ~170 MB a token is far more than the 32 MiB L3: RAM bounds it
    assert limit["bound"] == "memory bandwidth" and limit["source"] == "calibrated"
    assert limit["bandwidth_bytes_per_s"] == pytest.approx(calibrated)
    assert limit["limit_tps"] == pytest.approx(calibrated / limit["read_bytes_per_token"])
    assert light["limit_tps"] < limit["limit_tps"]  # tg16's tokens read their KV cache too
    assert light["share"] == pytest.approx(light["measured_tps"] / light["limit_tps"])
    assert 0 < light["share"] < 1.5
    assert light["summary"] == f"{light['share']:.0%} of this machine's limit"
    assert (light["cause"] != "") == (light["share"] < 0.5)


def test_bench_table_says_the_share_in_words(calibrated: float, default_model_file: Path) -> None:
    result = run_cli("bench", "--model", str(default_model_file), *BENCH)
    assert result.returncode == 0, result.stderr
    assert "speed of light: tg16 reached" in result.stdout
    assert "of this machine's limit" in result.stdout
    assert "each token reads" in result.stdout and "from RAM" in result.stdout


def test_bench_without_a_calibration_says_how_to_get_the_limit(default_model_file: Path) -> None:
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    result = run_cli("bench", "--model", str(default_model_file), "-p", "0", *BENCH[2:])
    assert result.returncode == 0, result.stderr
    if profile.memory.bandwidth_bytes_per_s is None:  # nothing to go by: no guess
        assert "speed of light: unknown" in result.stdout
        assert "hearthside calibrate" in result.stdout
    else:
        assert "of the spec-sheet limit" in result.stdout
