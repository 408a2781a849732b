"""The speed-of-light meter on recorded calibrations: the 2-core EPYC VM (32 MiB L3, RAM read
18.2 GB/s on 2 threads, 10.4 on 1) and issue 20's Sapphire Rapids VM (480 MiB L3)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.calibration import planner_figures
from hearthside.autotune.memory import CPU, pieces_from_spec
from hearthside.autotune.planner import evaluate_config, plan, token_work
from hearthside.autotune.speed_limit import (
    LOW_SHARE,
    MachineLoad,
    SpeedLimit,
    decode_speed_limit,
    speed_of_light,
)
from hearthside.autotune.speed_meter import SpeedMeter
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import GenerationResult
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import expand_spec
from hearthside.kernels.results import CalibrationReport
from tests.sapphire_rapids import (
    MEASURED_DECODE_TPS,
    gemma_q4_0,
    sapphire_rapids,
    sapphire_rapids_calibration,
)

EPYC = Path(__file__).parents[1] / "fixtures" / "calibration" / "epyc-2core-speed-model.json"
MIB = 1 << 20


def epyc_calibration() -> dict[str, float]:
    recorded = json.loads(EPYC.read_text())["calibration"]
    return planner_figures(CalibrationReport.from_dict(recorded))


def epyc(memory_bandwidth: int | None = None) -> HardwareProfile:
    flags = json.loads(EPYC.read_text())["calibration"]["machine"]["cpu_flags"]
    spec = {"schema": 1, "cpu": {"cores": 2, "threads": 2, "flags": flags}, "memory_gb": 24}
    profile = expand_spec(spec)
    memory = replace(profile.memory, bandwidth_bytes_per_s=memory_bandwidth)
    return replace(profile, cpu=replace(profile.cpu, l3_cache_bytes=32 * MIB), memory=memory)


def config(**changes: object) -> EngineConfig:
    return EngineConfig(model_path="llama-3.1-8b.gguf").with_changes(**changes)


def an_8b_limit(**changes: object) -> SpeedLimit:
    limit = decode_speed_limit(
        catalog_spec("llama-3.1-8b"), epyc(), config(**changes), epyc_calibration()
    )
    assert limit is not None
    return limit


def test_a_bandwidth_bound_8b_on_two_cores_is_the_ram_bandwidth_over_its_bytes() -> None:
    spec = catalog_spec("llama-3.1-8b")
    weights = token_work(spec, config(), (), pieces_from_spec(spec)).read_bytes[CPU]
    limit = an_8b_limit()
    assert limit.bound == "memory bandwidth" and limit.tier == CPU
    assert limit.source == "calibrated" and limit.threads == 2
    assert limit.read_bytes_per_token == pytest.approx(sum(weights.values()), rel=1e-6)
    ram = epyc_calibration()["cpu_read_bytes_per_s:2"]  # 18.2 GB/s
    assert limit.bandwidth_bytes_per_s == ram
    assert limit.limit_tps == pytest.approx(ram / sum(weights.values()), rel=1e-6)
    # the roofline, not a prediction: no engine efficiency in it
    predicted = plan(spec, epyc(), calibration=epyc_calibration()).speed
    assert limit.limit_tps > predicted.decode_tps_empty_context
    assert "4.2 GiB" in limit.explanation() and "18.2 GB/s" in limit.explanation()


def test_one_thread_is_limited_by_what_one_thread_reads() -> None:
    one = an_8b_limit(n_threads=1)
    assert one.bandwidth_bytes_per_s == epyc_calibration()["cpu_read_bytes_per_s:1"]
    assert one.limit_tps == pytest.approx(an_8b_limit().limit_tps * 10.42 / 18.21, rel=0.01)


def test_the_context_so_far_lowers_the_limit_by_its_kv_reads() -> None:
    limit = an_8b_limit()
    assert limit.tps_at(0) == pytest.approx(limit.limit_tps)
    # llama 3.1 8B: 128 KiB of f16 KV a token, read at 18.2 GB/s
    assert limit.kv_seconds_per_context_token == pytest.approx(128 * 1024 / 18.21e9, rel=0.01)
    assert limit.tps_at(4000) < 0.9 * limit.limit_tps


def test_a_model_in_the_cache_is_bound_by_the_calibrated_kernels() -> None:
    spec, profile, figures = gemma_q4_0(), sapphire_rapids(), sapphire_rapids_calibration()
    limit = decode_speed_limit(spec, profile, config(n_ctx=4096), figures)
    assert limit is not None and limit.bound == "cache"
    bandwidth_bound = figures["cpu_read_bytes_per_s"] / limit.read_bytes_per_token
    assert limit.limit_tps < 0.5 * bandwidth_bound  # the cache is faster than the RAM
    assert limit.bandwidth_bytes_per_s == 0.0
    # the kernels' time without llama.cpp's fixed costs: at least what the planner predicts
    predicted = evaluate_config(spec, profile, config(n_ctx=4096), figures).speed
    assert limit.limit_tps >= predicted.decode_tps_empty_context
    assert limit.limit_tps == pytest.approx(MEASURED_DECODE_TPS, rel=0.15)
    assert "cache" in limit.explanation() and "compute" in limit.explanation()


def test_no_calibration_and_no_spec_sheet_means_no_limit_not_a_guess() -> None:
    spec = catalog_spec("llama-3.1-8b")
    assert decode_speed_limit(spec, epyc(), config(), {}) is None
    sheet = decode_speed_limit(spec, epyc(memory_bandwidth=40_000_000_000), config(), {})
    assert sheet is not None and sheet.source == "spec sheet"
    assert sheet.bandwidth_bytes_per_s == 40e9
    assert "spec sheet" in sheet.explanation()
    assert speed_of_light(5.0, sheet).summary.endswith("of the spec-sheet limit")


def test_a_reply_near_the_limit_shows_its_share_and_no_cause() -> None:
    limit = an_8b_limit()
    speed = speed_of_light(0.81 * limit.limit_tps, limit, load=MachineLoad(2, 9.0, 0.7))
    assert speed.summary == "81% of this machine's limit"
    assert not speed.low and speed.cause == "" and "Why" not in speed.tooltip()


def test_a_slow_reply_on_a_busy_machine_blames_the_other_programs() -> None:
    limit = an_8b_limit()
    busy = MachineLoad(usable_cores=2, load_average=6.0, others_cpu_share=0.62)
    speed = speed_of_light(0.3 * limit.limit_tps, limit, load=busy)
    assert speed.low and speed.share < LOW_SHARE
    assert "other programs were using about 62% of the CPU" in speed.cause
    assert "Close or pause" in speed.fix
    assert speed.cause in speed.tooltip() and speed.fix in speed.tooltip()
    # where other programs' CPU use is unknown, the load average says it
    averaged = speed_of_light(
        0.3 * limit.limit_tps, limit, load=replace(busy, others_cpu_share=None)
    )
    assert "about 6 programs' worth of work" in averaged.cause and "2 cores" in averaged.cause


def test_a_slow_reply_with_more_threads_than_cores_says_to_use_fewer() -> None:
    limit = an_8b_limit(n_threads=4)
    idle = MachineLoad(usable_cores=2, load_average=0.5, others_cpu_share=0.02)
    speed = speed_of_light(0.2 * limit.limit_tps, limit, load=idle)
    assert "ran 4 threads on 2 cores" in speed.cause
    assert "Set Threads to 2" in speed.fix and "--threads 2" in speed.fix


def test_a_slow_reply_on_a_numa_machine_names_the_split() -> None:
    limit = an_8b_limit()
    split = MachineLoad(usable_cores=2, load_average=0.1, others_cpu_share=0.0, numa_nodes=2)
    speed = speed_of_light(0.2 * limit.limit_tps, limit, load=split)
    assert "2 NUMA nodes" in speed.cause and "distribute" in speed.fix


def test_a_slow_reply_with_nothing_to_blame_says_so_and_what_to_try() -> None:
    limit = an_8b_limit()
    idle = MachineLoad(usable_cores=2, load_average=0.1, others_cpu_share=0.0, numa_nodes=1)
    speed = speed_of_light(0.2 * limit.limit_tps, limit, load=idle)
    assert "nothing else looked busy" in speed.cause and "measure this machine again" in speed.fix


def test_the_meter_keeps_the_last_generations_share_for_metrics() -> None:
    limit = an_8b_limit()
    found: list[EngineConfig] = []

    def find(loaded: EngineConfig) -> SpeedLimit:
        found.append(loaded)
        return limit

    meter = SpeedMeter(find)
    meter.observe(config())  # a load: the limit is worked out off the engine thread
    assert meter.wait_for_limit(10) == limit and found == [config()]
    assert meter.last_share() is None
    metrics = GenerationMetrics(
        prompt_tokens=20,
        prompt_tokens_evaluated=20,
        completion_tokens=40,
        ttft_s=1.0,
        prompt_tok_s=20.0,
        decode_tok_s=2.0,
        total_s=21.0,
        stop_reason="eos",
    )
    meter.observe(GenerationResult("text", metrics))
    share = meter.last_share()
    assert share == pytest.approx(2.0 / limit.tps_at(40), rel=1e-6)
    assert meter.last is not None and meter.last.measured_tps == 2.0
