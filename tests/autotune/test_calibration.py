"""Calibration reaches the planner: stored per machine, turned into bandwidth, compute and the
share of them llama.cpp reaches."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from hearthside.autotune.calibration import (
    calibration_for,
    latest_report,
    logits_seconds,
    planner_figures,
    store_calibration,
)
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.planner import PROMPT_TOKENS_FOR_TTFT, Plan, evaluate_config, plan
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.paths import data_dir
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.runner import probe_hardware
from hearthside.kernels.calibrate import summarize_machine
from hearthside.kernels.engine_run import CACHE_PROBE, WORK_KEYS, per_token_work
from hearthside.kernels.measurement import Measurement
from hearthside.kernels.results import CalibrationReport, export_calibration

GB = 1e9


def measurement(kind: str, value: float, unit: str, **params: object) -> Measurement:
    return Measurement(
        kind=kind,
        device="cpu",
        value=value,
        unit=unit,
        median=value,
        spread=0.02,
        repetitions=5,
        method="recorded",
        params=dict(params),
    )


def report(model: Path | None = None, decode: float = 40.0, prefill: float = 300.0):  # noqa: ANN201
    items = [
        measurement("memory_read", 11.0, "GB/s", threads=1),
        measurement("memory_read", 20.0, "GB/s", threads=2),
        measurement("matmul", 130.0, "GFLOP/s", dtype="fp32", m=512, n=1024, k=1024),
        measurement("matmul", 12.0, "GFLOP/s", dtype="fp32", m=1, n=4096, k=4096),
        Measurement("disk_read", "disk:/dev/vda", 2.5, "GB/s", 2.5, 0.05, 5, "recorded"),
    ]
    if model is not None:
        items += [
            measurement("engine_decode", decode, "tok/s", model_path=str(model), n_gen=32),
            measurement("engine_prefill", prefill, "tok/s", model_path=str(model), n_prompt=128),
        ]
    return CalibrationReport(1, "2026-11-29T00:00:00+00:00", "0.1.0", {}, tuple(items), (), 20.0)


def test_the_best_figures_become_the_planners_inputs() -> None:
    figures = planner_figures(report())
    assert figures["cpu_read_bytes_per_s"] == 20 * GB  # all threads, not one
    assert figures["cpu_flops"] == 130 * GB  # the GEMM, not the GEMV
    assert figures["disk_read_bytes_per_s"] == 2.5 * GB
    assert "decode_efficiency" not in figures  # no engine run, no efficiency


def test_ram_reads_at_its_fastest_repetition_when_other_programs_slowed_some() -> None:
    """Recorded on the 2-core Zen 4 VM: a calibration run while other work started had its
    2-thread read's median at 24.7 GB/s (repetitions 20% apart); quiet ones read 29.5-34.5."""
    disturbed = [
        measurement("memory_read", 19.8, "GB/s", threads=1, fastest_gb_s=22.9),
        measurement("memory_read", 24.7, "GB/s", threads=2, fastest_gb_s=29.6),
    ]
    base = report()
    figures = planner_figures(replace(base, measurements=tuple(disturbed) + base.measurements[2:]))
    assert figures["cpu_read_bytes_per_s"] == 29.6 * GB
    assert figures["cpu_read_bytes_per_s:1"] == 22.9 * GB
    assert planner_figures(base)["cpu_read_bytes_per_s:2"] == 20 * GB  # before: the median


def test_the_engine_run_gives_the_share_llama_cpp_reaches(default_model_file: Path) -> None:
    figures = planner_figures(report(default_model_file, decode=40.0, prefill=300.0))
    assert 0.2 < figures["decode_efficiency"] < 1.0
    assert 0.2 < figures["prefill_efficiency"] < 3.0


def test_a_calibration_on_one_model_carries_to_another_in_proportion(
    default_model_file: Path, chat_model_file: Path
) -> None:
    """What a user sees: the shipped model (Gemma 3 270M) measured twice as fast on this
    machine makes the plan for a model never measured here (SmolLM2 135M) predict it twice
    as fast too, and faster than the measured model, since it reads fewer bytes per token."""
    profile = probe_hardware()
    unmeasured = spec_from_gguf(chat_model_file)

    def planned(decode: float, prefill: float) -> Plan:
        figures = planner_figures(report(default_model_file, decode=decode, prefill=prefill))
        return plan(unmeasured, profile, n_ctx=512, calibration=figures)

    slow, fast = planned(decode=20.0, prefill=150.0), planned(decode=40.0, prefill=300.0)
    assert slow.confidence == fast.confidence == "calibrated"
    assert fast.speed.decode_tps == pytest.approx(2 * slow.speed.decode_tps, rel=0.1)
    assert fast.speed.prefill_tps == pytest.approx(2 * slow.speed.prefill_tps, rel=0.1)
    assert fast.speed.decode_tps > 1.5 * 40.0  # not the measured model's figure copied over


def test_a_calibration_applies_only_to_the_machine_it_measured(tmp_path: Path) -> None:
    profile = probe_hardware()
    other = replace(profile, memory=replace(profile.memory, total_bytes=(1 << 40)))
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:
        assert calibration_for(profile, wisdom) == {}
        store_calibration(report(), profile, wisdom)
        assert calibration_for(profile, wisdom)["cpu_read_bytes_per_s"] == 20 * GB
        assert calibration_for(other, wisdom) == {}


def test_what_measured_runs_taught_corrects_the_next_plan_until_the_next_calibration(
    default_model_file: Path, tmp_path: Path
) -> None:
    profile = probe_hardware()
    spec = spec_from_gguf(default_model_file)
    key = tuning_key(profile, default_model_file)
    with WisdomDB(tmp_path / "wisdom.db") as wisdom:

        def planned() -> Plan:
            return plan(spec, profile, n_ctx=512, calibration=calibration_for(profile, wisdom))

        store_calibration(report(default_model_file), profile, wisdom)
        before = planned()
        tier = before.speed.decode_bound_by
        for ratio in (1.2, 1.3):  # two tuner runs, 20% and 30% faster than predicted
            wisdom.learn_efficiency(key.machine, key.engine, tier, "decode", ratio)
        after = planned()
        assert after.speed.decode_tps_empty_context == pytest.approx(
            before.speed.decode_tps_empty_context * 1.25
        )
        assert after.speed.learned_decode == pytest.approx(1.25)
        assert after.speed.prefill_tps == pytest.approx(before.speed.prefill_tps)  # not learned
        assert (before.confidence, after.confidence) == ("calibrated", "measured")
        store_calibration(report(default_model_file), profile, wisdom)  # new figures: start over
        assert planned().speed == before.speed


# Recorded on the 2-core AMD EPYC development VM by `benchmarks/speed_model.py --save`: a whole
# calibration (the shipped Gemma 3 270M Q4_K_M and the speed probes, timed in interleaved
# rounds), then the shipped model's variants measured in interleaved rounds right after it.
RECORDED_RUN = (
    Path(__file__).parents[1] / "fixtures" / "calibration" / "epyc-2core-speed-model.json"
)


def recorded_report(*, without: tuple[str, ...] = ()) -> CalibrationReport:
    """The recorded calibration, less the probes named in `without` ("*": all of them)."""
    recorded = CalibrationReport.from_dict(json.loads(RECORDED_RUN.read_text())["calibration"])
    kept = tuple(
        m
        for m in recorded.measurements
        if "probe" not in m.params or ("*" not in without and m.params["probe"] not in without)
    )
    return replace(recorded, measurements=kept)


def recorded_speed(model: str) -> tuple[float, float]:
    """Median tg64 and pp128 tok/s of `model` measured right after the recorded calibration."""
    rows = json.loads(RECORDED_RUN.read_text())["rows"]
    row = next(row for row in rows if row["model"] == model)
    return row["decode_measured"], row["prefill_measured"]


def test_the_probes_separate_fixed_row_and_per_type_costs() -> None:
    figures = planner_figures(recorded_report())
    # the tiny probes: the graph and thread barriers, some tens of microseconds per layer,
    # and one llama_decode call per token
    assert 1e-6 < figures["decode_overhead_s_per_layer"] < 100e-6
    assert 0.0 <= figures["decode_overhead_s_per_token"] < 1e-3
    assert "prefill_overhead_s_per_token" not in figures  # one call per batch: nothing per token
    for type_name in ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K", "Q3_K"):
        for kind in ("decode", "prefill"):
            assert figures[f"{kind}_efficiency:{type_name}"] > 0.2, (kind, type_name)
            assert figures[f"{kind}_row_s:{type_name}"] >= 0.0
    # narrow rows cost on top of their bytes (measured ~8-25 ns each at decode)
    assert 1e-9 < figures["decode_row_s:Q8_0"] < 100e-9
    # Q5_0 has no repacked kernels on AVX2; Q4_0 does
    assert figures["prefill_efficiency:Q5_0"] < figures["prefill_efficiency:Q4_0"]
    assert figures["decode_efficiency:Q5_0"] < figures["decode_efficiency:Q4_0"]
    # the shipped model's architecture gets its own fixed cost from what its run leaves
    assert figures["decode_overhead_s_per_layer:gemma3"] >= 0.0
    assert figures["prefill_overhead_s_per_layer:gemma3"] >= 0.0


def test_without_probes_the_shipped_model_alone_sets_every_factor() -> None:
    figures = planner_figures(recorded_report(without=("*",)))
    assert "decode_overhead_s_per_layer" not in figures
    for type_name in ("Q8_0", "Q5_0", "Q4_K", "Q6_K"):
        assert figures[f"decode_efficiency:{type_name}"] == pytest.approx(
            figures["decode_efficiency"]
        )


def test_a_probe_starved_by_other_programs_is_left_out() -> None:
    # seen on a busy machine: one probe at a tenth of its speed while the rest ran normally
    starved = replace_value(recorded_report(), "engine_decode", "Q4_0@512", 12.0)
    without = planner_figures(recorded_report(without=("Q4_0@512",)))
    assert decode_figures(planner_figures(starved)) == decode_figures(without)


def decode_figures(figures: dict[str, float]) -> dict[str, float]:
    return {key: value for key, value in figures.items() if key.startswith("decode")}


def test_a_shipped_model_faster_than_the_probes_explain_costs_no_negative_time() -> None:
    recorded = next(
        m
        for m in recorded_report().measurements
        if m.kind == "engine_decode" and "probe" not in m.params
    )
    fast_gemma = replace_value(recorded_report(), "engine_decode", None, recorded.value * 1.5)
    assert planner_figures(fast_gemma)["decode_overhead_s_per_layer:gemma3"] == 0.0


def replace_value(
    report: CalibrationReport, kind: str, probe: str | None, value: float
) -> CalibrationReport:
    measurements = tuple(
        replace(m, value=value, median=value)
        if m.kind == kind and m.params.get("probe") == probe
        else m
        for m in report.measurements
    )
    return replace(report, measurements=measurements)


def test_recorded_figures_predict_the_quant_variants_within_20_percent(
    default_model_file: Path, tmp_path: Path
) -> None:
    """The prediction for the shipped model's other quants, made from the recorded
    calibration, against their speeds measured right after it on the same VM (recorded
    before the batch's last-token matrices were: the shipped model's are read from its file)."""
    shipped_work = per_token_work(validate_gguf(default_model_file))
    figures = planner_figures(with_shipped_work(recorded_report(), shipped_work))
    profile = recorded_profile()
    for quant in ("Q8_0", "Q4_0"):
        decode, prefill = recorded_speed(f"gemma-270m {quant}")
        path = quantized(default_model_file, tmp_path, quant)
        pieces = pieces_from_gguf(validate_gguf(path))
        result = plan(spec_from_gguf(path), profile, n_ctx=2048, calibration=figures, pieces=pieces)
        assert result.speed.decode_tps_empty_context == pytest.approx(decode, rel=0.2), quant
        assert result.speed.prefill_tps_at(128) == pytest.approx(prefill, rel=0.2), quant
        assert result.speed.decode_tps < result.speed.decode_tps_empty_context


def quantized(source: Path, folder: Path, quant: str) -> Path:
    import ctypes

    import llama_cpp

    target = folder / f"{quant}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = {"Q8_0": 7, "Q4_0": 2}[quant]
    params.allow_requantize = True
    assert (
        llama_cpp.llama_model_quantize(
            str(source).encode(), str(target).encode(), ctypes.byref(params)
        )
        == 0
    )
    return target


def with_thread_variants(
    report: CalibrationReport, threads: int, decode_share: float, prefill_share: float
) -> CalibrationReport:
    """`report` plus its shipped model's runs at `threads`, at these shares of its speed."""
    share = {"engine_decode": decode_share, "engine_prefill": prefill_share}
    variants = tuple(
        replace(
            m,
            value=m.value * share[m.kind],
            median=m.value * share[m.kind],
            params={**m.params, "threads": threads, "thread_variant": True},
        )
        for m in report.measurements
        if m.kind in share and "probe" not in m.params
    )
    return replace(report, measurements=report.measurements + variants)


def test_the_shipped_model_at_other_thread_counts_gives_a_speedup_per_count() -> None:
    plain = planner_figures(recorded_report())
    figures = planner_figures(with_thread_variants(recorded_report(), 1, 0.55, 0.5))
    assert figures["decode_threads"] == figures["prefill_threads"] == 2  # the probes' threads
    assert figures["decode_thread_scale:1"] == pytest.approx(0.55)
    assert figures["prefill_thread_scale:1"] == pytest.approx(0.5)
    assert "decode_thread_scale:2" not in figures  # the count the probes ran at is the unit
    assert figures["cpu_read_bytes_per_s:1"] < figures["cpu_read_bytes_per_s:2"]
    # the variants are no extra probes: every fitted cost is the same without them
    assert {k: v for k, v in figures.items() if "_thread_scale:" not in k} == plain


def test_a_plan_at_one_thread_follows_the_calibrations_one_thread_run(
    default_model_file: Path,
) -> None:
    figures = planner_figures(with_thread_variants(recorded_report(), 1, 0.55, 0.5))
    spec = spec_from_gguf(default_model_file)
    profile = recorded_profile()
    two = plan(spec, profile, n_ctx=2048, calibration=figures)
    one = evaluate_config(
        spec, profile, two.config.with_changes(n_threads=1, n_threads_batch=1), figures
    )
    assert two.config.n_threads == 2
    assert one.speed.decode_tps_empty_context / two.speed.decode_tps_empty_context == (
        pytest.approx(0.55, rel=0.05)
    )
    assert one.speed.prefill_tps / two.speed.prefill_tps == pytest.approx(0.5, rel=0.01)


def recorded_profile() -> HardwareProfile:
    """This machine's profile with the cores of the machine the recorded run measured: the
    calibration's figures are for the threads it ran at."""
    machine = json.loads(RECORDED_RUN.read_text())["calibration"]["machine"]
    profile = probe_hardware()
    cores = {"physical_cores": machine["physical_cores"], "logical_cores": machine["logical_cores"]}
    return replace(profile, cpu=replace(profile.cpu, performance_cores=None, **cores))


# ---- the old calibration.json: imported once into the DB, the one place it is kept now -------


def this_machines_report(created_at: str = "2026-05-04T10:20:30+00:00") -> CalibrationReport:
    """A report as an older Hearthside left it in the data folder, measured here."""
    machine = summarize_machine(probe_hardware(), torch_version=None)
    return replace(report(), machine=machine, created_at=created_at)


def test_an_old_calibration_json_is_imported_once_and_left_as_it_was() -> None:
    profile = probe_hardware()
    legacy = export_calibration(this_machines_report(), data_dir() / "calibration.json")
    before = legacy.read_bytes()
    with WisdomDB() as wisdom:
        assert calibration_for(profile, wisdom)["cpu_read_bytes_per_s"] == 20 * GB
        key = tuning_key(profile, legacy)  # the machine and engine parts are what count
        wisdom.learn_efficiency(key.machine, key.engine, "cpu", "decode", 1.2)
        again = calibration_for(profile, wisdom)  # imported once: storing again would forget
        assert again["cpu_read_bytes_per_s"] == 20 * GB and again["learned_decode:cpu"] == 1.2
        assert len(wisdom.export()["calibrations"]) == 1
        assert latest_report(profile, wisdom) == this_machines_report()
        newer = replace(report(), created_at="2026-12-01T00:00:00+00:00")
        store_calibration(newer, profile, wisdom)  # `hearthside calibrate` later on
        assert latest_report(profile, wisdom) == newer
    assert legacy.read_bytes() == before


def test_an_old_calibration_json_of_other_hardware_or_damaged_is_not_imported() -> None:
    profile = probe_hardware()
    other = this_machines_report()
    other = replace(other, machine={**other.machine, "logical_cores": 256})
    legacy = export_calibration(other, data_dir() / "calibration.json")
    with WisdomDB() as wisdom:
        assert calibration_for(profile, wisdom) == {}
        legacy.write_text('{"schema": 1, "measurements": [')
        assert latest_report(profile, wisdom) is None  # logged, not raised: the DB decides
        assert wisdom.export()["calibrations"] == []


def test_a_prompt_batch_of_any_length_gives_the_same_plan(default_model_file: Path) -> None:
    """A batch runs its last token's matrices once (Gemma's 262k-row output layer most of
    all), so a short prompt's tok/s is lower: the fit takes that off the batch the
    calibration happened to time, and the plan gives it back for the prompt asked about."""
    info = validate_gguf(default_model_file)
    spec = spec_from_gguf(default_model_file)
    recorded = with_shipped_work(recorded_report(), per_token_work(info))
    profile = recorded_profile()
    pieces = pieces_from_gguf(info)
    figures = planner_figures(recorded)
    speed = plan(spec, profile, n_ctx=2048, calibration=figures, pieces=pieces).speed
    assert speed.prefill_batch_s > 0
    assert speed.prefill_tps_at(32) < speed.prefill_tps_at(128) < speed.prefill_tps
    assert speed.prefill_tps_at(32) < 0.9 * speed.prefill_tps
    assert speed.prefill_tps_at(PROMPT_TOKENS_FOR_TTFT) == pytest.approx(speed.prefill_tps)
    for n_prompt in (42, 256):
        timed = shipped_prefill_at(recorded, speed.prefill_tps_at(n_prompt), n_prompt)
        figures = planner_figures(timed)
        again = plan(spec, profile, n_ctx=2048, calibration=figures, pieces=pieces).speed
        assert again.prefill_tps == pytest.approx(speed.prefill_tps, rel=0.02), n_prompt


def with_shipped_work(report: CalibrationReport, work: dict[str, object]) -> CalibrationReport:
    """The report with the shipped model's runs carrying `work` (a recording from before
    the batch's last-token matrices were recorded lacks them)."""
    measurements = tuple(
        replace(m, params={**m.params, **work}) if "probe" not in m.params else m
        for m in report.measurements
    )
    return replace(report, measurements=measurements)


def shipped_prefill_at(report: CalibrationReport, tps: float, n_prompt: int) -> CalibrationReport:
    measurements = tuple(
        replace(m, value=tps, median=tps, params={**m.params, "n_prompt": n_prompt})
        if m.kind == "engine_prefill"
        and "probe" not in m.params
        and "thread_variant" not in m.params
        else m
        for m in report.measurements
    )
    return replace(report, measurements=measurements)


# --- the cache probe --------------------------------------------------------------------------


def with_cache_probe(report: CalibrationReport, speedup: float) -> CalibrationReport:
    """The report with a half-size Q4_0@512 probe whose weights ran `speedup` times faster
    per byte than the full-size one's (its layers' and call's fixed costs as fitted)."""
    figures = planner_figures(report)
    full = next(
        m
        for m in report.measurements
        if m.kind == "engine_decode" and m.params.get("probe") == "Q4_0@512"
    )
    layers = int(full.params["n_layers"])

    def fixed(n_layers: int) -> float:
        per_layer = figures["decode_overhead_s_per_layer"] * n_layers
        logits = logits_seconds(int(full.params["n_vocab"]), figures["cpu_read_bytes_per_s"])
        return per_layer + figures["decode_overhead_s_per_token"] + logits

    weights_s = 1 / full.value - fixed(layers)
    half = layers // 2
    work = {
        key: value * half / layers if key.split(":")[0] in WORK_KEYS else value
        for key, value in full.params.items()
    }
    tps = 1 / (fixed(half) + weights_s * half / layers / speedup)
    cache = replace(
        full,
        value=tps,
        median=tps,
        params={**work, "n_layers": half, "probe": CACHE_PROBE},
    )
    return replace(report, measurements=(*report.measurements, cache))


@pytest.mark.parametrize("speedup", [1.0, 2.0])
def test_the_cache_probe_measures_how_much_faster_a_smaller_model_reads(speedup: float) -> None:
    report = with_cache_probe(recorded_report(), speedup)
    figures = planner_figures(report)
    assert figures["decode_cache_speedup"] == pytest.approx(speedup, rel=0.1)
    assert figures["decode_cache_bytes"] == pytest.approx(
        figures["decode_probe_bytes"] / 2, rel=0.05
    )
    # it is no Q4_0 probe of the fit: the types' costs are those fitted without it
    without = planner_figures(recorded_report())
    assert {k: v for k, v in figures.items() if "cache" not in k and "probe" not in k} == without
