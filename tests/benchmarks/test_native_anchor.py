"""benchmarks/native_anchor.py's verdicts on recorded numbers, and how it speaks to llama-bench.
Nothing here runs llama-bench or the engine (minutes each)."""

from __future__ import annotations

import pytest

from tests.benchmarks.test_targets import benchmark, status

pytestmark = pytest.mark.beside


def medians(native: float, imitation: float, pick_native: float) -> list[dict[str, object]]:
    """Three rounds with these decode speeds, as the benchmark records them side by side."""
    speeds = benchmark("native_anchor").Speeds
    one_round = {
        "native defaults": speeds(300.0, native),
        "in-engine defaults": speeds(300.0, imitation),
        "pick in-engine": speeds(300.0, pick_native),
        "pick native": speeds(300.0, pick_native),
    }
    return [one_round] * 3


def test_an_imitation_within_3_percent_and_an_honest_headline_pass() -> None:
    anchor = benchmark("native_anchor")
    assert status(anchor.targets(medians(20.0, 19.8, 24.0), shown_speedup=1.2)) == 0


def test_an_imitation_off_by_more_than_3_percent_fails_either_way() -> None:
    anchor = benchmark("native_anchor")
    assert status(anchor.targets(medians(20.0, 19.0, 24.0), shown_speedup=1.2)) == 1
    assert status(anchor.targets(medians(20.0, 21.0, 24.0), shown_speedup=1.2)) == 1


def test_a_headline_the_native_tools_do_not_confirm_fails() -> None:
    anchor = benchmark("native_anchor")
    # the user was shown 1.5x; natively the pick is 1.2x the defaults
    assert status(anchor.targets(medians(20.0, 20.0, 24.0), shown_speedup=1.5)) == 1
    # a pick slower than llama.cpp's own defaults
    assert status(anchor.targets(medians(20.0, 20.0, 19.0), shown_speedup=0.95)) == 1
    assert status(anchor.targets(medians(20.0, 20.0, 24.0), shown_speedup=None)) == 1


def test_the_pick_is_said_to_llama_bench_in_its_own_flags() -> None:
    flags = benchmark("native_anchor").native_flags(
        {
            "n_threads": 1,
            "flash_attn": False,
            "n_batch": 512,
            "n_ubatch": 256,
            "type_k": "q8_0",
            "type_v": "q8_0",
            "n_gpu_layers": 0,
        }  # fmt: skip
    )
    assert " ".join(flags) == "-t 1 -fa 0 -b 512 -ub 256 -ctk q8_0 -ctv q8_0 -ngl 0"


def test_llama_bench_json_gives_the_median_of_its_samples() -> None:
    rows = [
        {"n_prompt": 512, "n_gen": 0, "avg_ts": 310.0, "samples_ts": [300.0, 305.0, 330.0]},
        {"n_prompt": 0, "n_gen": 128, "avg_ts": 21.0, "samples_ts": [20.0, 20.5, 22.5]},
    ]
    speeds = benchmark("native_anchor").speeds_from_llama_bench(rows)
    assert (speeds.prompt_tps, speeds.decode_tps) == (305.0, 20.5)
