"""`hearthside bench` measures the real engine and reports its decode speed's share of this
machine's limit, from the calibration stored for this machine (the 2-core EPYC VM's recording:
the machine these tests run on)."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Calibrated:
    read_bytes_per_s: float  # the recording's RAM read bandwidth on 2 threads
    l3_bytes: int  # this machine's last-level cache, as probed


@pytest.fixture
def calibrated(hearthside_home: Path) -> Calibrated:
    """This machine's profile, calibrated with the recording."""
    recorded = CalibrationReport.from_dict(json.loads(EPYC.read_text())["calibration"])
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    with WisdomDB() as wisdom:
        store_calibration(recorded, profile, wisdom)
    figures = planner_figures(recorded)
    return Calibrated(figures["cpu_read_bytes_per_s:2"], profile.cpu.l3_cache_bytes or 0)


def test_bench_json_has_the_decode_share_of_the_calibrated_limit(
    calibrated: Calibrated, default_model_file: Path
) -> None:
    result = run_cli("bench", "--model", str(default_model_file), "--json", *BENCH)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    decode = next(entry for entry in report["results"] if entry["test"] == "tg16")
    light = report["speed_of_light"]
    assert light["test"] == "tg16" and light["measured_tps"] == decode["median_tok_s"]
    limit = light["limit"]
    assert limit["source"] == "calibrated"
    if limit["read_bytes_per_token"] > calibrated.l3_bytes:
        # Gemma 3 270M's ~170 MB a token is far more than a 32 MiB L3 (the EPYC): RAM bounds it
        assert limit["bound"] == "memory bandwidth"
        bandwidth = calibrated.read_bytes_per_s
        assert limit["bandwidth_bytes_per_s"] == pytest.approx(bandwidth)
        assert limit["limit_tps"] == pytest.approx(bandwidth / limit["read_bytes_per_token"])
        assert light["limit_tps"] < limit["limit_tps"]  # tg16's tokens read their KV cache too
    else:  # a 480 MiB L3 (a Xeon 6) holds it: the calibrated kernels' costs bound it
        assert limit["bound"] == "cache" and limit["limit_tps"] > 0
    assert light["share"] == pytest.approx(light["measured_tps"] / light["limit_tps"])
    assert 0 < light["share"] < 1.5
    assert light["summary"] == f"{light['share']:.0%} of this machine's limit"
    assert (light["cause"] != "") == (light["share"] < 0.5)


def test_bench_table_says_the_share_in_words(
    calibrated: Calibrated, default_model_file: Path
) -> None:
    result = run_cli("bench", "--model", str(default_model_file), *BENCH)
    assert result.returncode == 0, result.stderr
    assert "speed of light: tg16 reached" in result.stdout
    assert "of this machine's limit" in result.stdout
    # the whole file (253 MB) is more than a 32 MiB L3 and far less than a 480 MiB one
    fits_in_cache = default_model_file.stat().st_size <= calibrated.l3_bytes
    where = "from the CPU's cache" if fits_in_cache else "from RAM"
    assert "each token reads" in result.stdout and where in result.stdout


def test_bench_without_a_calibration_says_how_to_get_the_limit(default_model_file: Path) -> None:
    profile = probe_hardware(ProbeContext(models_dir=models_dir(data_dir())))
    result = run_cli("bench", "--model", str(default_model_file), "-p", "0", *BENCH[2:])
    assert result.returncode == 0, result.stderr
    if profile.memory.bandwidth_bytes_per_s is None:  # nothing to go by: no guess
        assert "speed of light: unknown" in result.stdout
        assert "hearthside calibrate" in result.stdout
    else:
        assert "of the spec-sheet limit" in result.stdout
