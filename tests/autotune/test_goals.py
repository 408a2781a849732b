"""Goals choose by speed and by measured quality: the fastest run within the KLD budget, or the
closest to the reference that is fast enough."""

from __future__ import annotations

from hearthside.autotune.fingerprint import TuningKey
from hearthside.autotune.goals import (
    KLD_BUDGET,
    RunQuality,
    choose,
    measured_quality,
    prior_quality,
    reference_quality,
)
from hearthside.autotune.planner import Goal
from hearthside.autotune.wisdom import QualityRecord, RunRecord

KEY = TuningKey("machine", "engine", "model")


def run(kv_type: str, decode: float, prefill: float = 500.0, threads: int = 2) -> RunRecord:
    config = {"type_k": kv_type, "type_v": kv_type, "n_threads": threads}
    return RunRecord(KEY, config, "quick", "ok", prefill_tps=prefill, decode_tps=decode)


def by_kv(**klds: float):  # noqa: ANN201
    """A quality lookup from measured KLDs per KV type (the rest: priors)."""

    def quality(record: RunRecord) -> RunQuality:
        kv_type = record.config["type_k"]
        if kv_type == "f16":
            return reference_quality()
        if kv_type in klds:
            return RunQuality(klds[kv_type], "measured", 0.9, 10.0)
        return prior_quality(kv_type)

    return quality


def test_fastest_takes_the_fastest_run_within_the_budget_and_says_what_it_cost() -> None:
    f16, q8, q4 = run("f16", 40.0), run("q8_0", 44.0), run("q4_0", 50.0)
    choice = choose([f16, q8, q4], by_kv(q8_0=0.01, q4_0=0.3), "fastest")
    assert choice.best is q8
    assert choice.fastest is q4 and choice.over_budget == (q4,)
    assert choice.budget_cost == 50.0 / 44.0


def test_every_goal_keeps_llama_cpps_defaults_when_the_picks_gain_is_noise() -> None:
    # the Qwen3-30B-A3B-shaped MoE on the Zen 4 EPYC: batch 512 measured a little faster than
    # the defaults' 2048 in the tune, and natively decoded 0.94x them
    defaults = run("f16", 15.0)
    small_batch = RunRecord(
        KEY,
        {**defaults.config, "n_batch": 512},
        "quick",
        "ok",
        prefill_tps=500.0,
        decode_tps=15.0 * 1.04,
    )
    for goal in ("fastest", "balanced", "quality"):
        assert choose([defaults, small_batch], by_kv(), goal).best is small_batch
        assert choose([defaults, small_batch], by_kv(), goal, defaults=defaults).best is defaults
    # a gain beyond the noise still wins
    faster = RunRecord(KEY, small_batch.config, "quick", "ok", prefill_tps=500.0, decode_tps=16.0)
    assert choose([defaults, faster], by_kv(), "fastest", defaults=defaults).best is faster
    # and the defaults are never kept over a pick closer to the reference
    q8_defaults = run("q8_0", 15.0)
    assert choose(
        [q8_defaults, small_batch], by_kv(q8_0=0.01), "fastest", defaults=q8_defaults
    ).best is (small_batch)


def test_fastest_keeps_the_full_precision_cache_when_the_quantized_one_is_within_the_noise() -> (
    None
):
    # the Llama 3.1 8B shape on the EPYC: q8_0 KV measured 1.02x, natively the same speed
    f16, q8 = run("f16", 6.90), run("q8_0", 6.90 * 1.02)
    choice = choose([f16, q8], by_kv(), "fastest")
    assert choice.best is f16 and choice.fastest is q8
    assert choose([f16, run("q8_0", 6.90 * 1.06)], by_kv(), "fastest").best is not f16
    # among the full-precision runs the fastest still wins, however small its lead
    two_threads = run("f16", 6.95, threads=2)
    assert choose([run("f16", 6.90, threads=1), two_threads], by_kv(), "fastest").best is (
        two_threads
    )


def test_a_measured_kld_within_the_budget_outranks_a_pessimistic_prior() -> None:
    f16, q4 = run("f16", 40.0), run("q4_0", 50.0)
    assert choose([f16, q4], by_kv(), "fastest").best is f16  # the q4_0 prior is over budget
    measured = choose([f16, q4], by_kv(q4_0=KLD_BUDGET / 2), "fastest")
    assert measured.best is q4 and measured.budget_cost == 1.0 and not measured.over_budget


def test_quality_takes_the_closest_run_that_is_fast_enough() -> None:
    f16, q8 = run("f16", 36.0), run("q8_0", 44.0)
    slow_f16 = run("f16", 30.0, threads=1)  # below 80% of 44 tok/s
    quality = by_kv(q8_0=0.01)
    assert choose([f16, q8], quality, "quality").best is f16
    assert choose([slow_f16, q8], quality, "quality").best is q8
    assert choose([f16, q8], quality, "fastest").best is q8


def test_balanced_trades_a_little_speed_for_quality_and_counts_the_first_token() -> None:
    f16, q8 = run("f16", 42.5), run("q8_0", 44.0)
    assert choose([f16, q8], by_kv(q8_0=0.01), "balanced").best is f16  # within 5%
    slow_prompt = run("q8_0", 44.0, prefill=50.0)
    fast_prompt = run("q8_0", 43.0, prefill=2000.0)
    goal: Goal = "balanced"
    assert choose([slow_prompt, fast_prompt], by_kv(q8_0=0.01), goal).best is fast_prompt


def test_failed_runs_never_win_and_an_all_over_budget_field_keeps_the_closest() -> None:
    q8, q4 = run("q8_0", 40.0), run("q4_0", 50.0)
    failed = RunRecord(KEY, {"type_k": "f16"}, "quick", "oom", error="out of memory")
    choice = choose([failed, q8, q4], by_kv(q8_0=0.08, q4_0=0.3), "fastest")
    assert choice.best is q8 and choice.fastest is q4


def test_a_stored_quality_record_reads_as_measured() -> None:
    record = QualityRecord(
        "ref", "cand", "q8_0", "hash", 512, "Q4_K_M", "m.gguf", 510, 0.02, 0.3, 0.93, 9.6, 9.5
    )
    quality = measured_quality(record)
    assert quality.measured and quality.mean_kld == 0.02 and quality.top1_agreement == 0.93
    assert not prior_quality("q4_0").measured and prior_quality("q4_0").mean_kld > KLD_BUDGET
