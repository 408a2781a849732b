"""Golden plans: the planner's choices on recorded and what-if machines, before any load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hearthside.autotune.memory import CPU, pieces_from_spec
from hearthside.autotune.planner import (
    DEFAULT_PARALLEL,
    PREFILL_EFFICIENCY,
    Plan,
    SpeedEstimate,
    cpu_expert_layers,
    describe_machine,
    describe_slots,
    evaluate_config,
    plan,
    token_work,
)
from hearthside.core.engine.config import CHAT_CONTEXT, EngineConfig
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.descriptor import spec_from_descriptor
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import expand_spec, load_spec

pytestmark = pytest.mark.beside

SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"
GIB = 1 << 30
AVX2 = ["avx", "avx2", "fma", "f16c", "sse4_2"]


def machine(**spec: Any) -> HardwareProfile:
    spec.setdefault("cpu", {"cores": 8, "threads": 16, "flags": AVX2})
    spec.setdefault("disk", {"read_gb_s": 3.5})
    return expand_spec({"schema": 1, **spec})


def device(result: Plan, name: str):  # noqa: ANN201 - a DeviceBudget
    return next(budget for budget in result.devices if budget.device == name)


def assert_within_capacity(result: Plan) -> None:
    for budget in result.devices:
        assert budget.used_bytes <= budget.capacity_bytes, budget


def test_an_8b_model_goes_whole_onto_one_24gb_gpu() -> None:
    result = plan(catalog_spec("llama-3.1-8b"), machine(gpus=[{"model": "rtx-3090"}], memory_gb=32))
    assert result.fits and result.config.n_gpu_layers == -1
    assert result.config.n_ctx == CHAT_CONTEXT  # what the chat runs
    assert_within_capacity(result)
    assert device(result, "CUDA0").kv_bytes > 0 and device(result, CPU).kv_bytes == 0
    assert 60 < result.speed.decode_tps < 200  # 936 GB/s over ~5 GB of weights
    assert result.speed.decode_bound_by == "CUDA0"
    assert {reason.setting for reason in result.reasons} >= {"n_gpu_layers", "n_ctx"}


def test_an_8b_model_asked_for_its_longest_context_quantizes_the_kv_cache() -> None:
    result = plan(
        catalog_spec("llama-3.1-8b"),
        machine(gpus=[{"model": "rtx-3090"}], memory_gb=32),
        goal="longest-context",
    )
    assert result.fits and result.config.n_ctx >= 65536
    assert result.config.n_gpu_layers == -1
    assert_within_capacity(result)


def test_a_70b_model_on_one_24gb_gpu_and_64gb_ram_is_split() -> None:
    result = plan(
        catalog_spec("llama-3.1-70b"), machine(gpus=[{"model": "rtx-3090"}], memory_gb=64)
    )
    assert result.fits
    assert 0 < result.config.n_gpu_layers < 80
    assert device(result, "CUDA0").weights_bytes > 15 * GIB
    assert device(result, CPU).weights_bytes > 15 * GIB
    assert result.speed.decode_bound_by == CPU  # the RAM half is the slow half
    assert 0.5 < result.speed.decode_tps < 6
    assert_within_capacity(result)


def test_a_30b_a3b_moe_on_a_16gb_gpu_keeps_its_experts_in_ram() -> None:
    spec = catalog_spec("qwen3-30b-a3b")
    result = plan(spec, machine(gpus=[{"model": "t4"}], memory_gb=64))
    assert result.fits
    assert result.config.tensor_overrides, "experts should stay on the CPU"
    assert result.config.n_gpu_layers == -1  # attention and shared weights all on the GPU
    kept_in_ram = cpu_expert_layers(result.config)
    assert 0 < kept_in_ram < 48  # as many layers' experts on the GPU as fit
    share_in_ram = kept_in_ram / 48
    expected = spec.routed_expert_bytes * share_in_ram + spec.embeddings.bytes
    assert device(result, CPU).weights_bytes == pytest.approx(expected, rel=0.01)
    assert any(reason.setting == "experts" for reason in result.reasons)
    assert result.speed.decode_tps > plan_without_expert_placement(spec).speed.decode_tps
    assert_within_capacity(result)


def plan_without_expert_placement(spec: Any) -> Plan:
    """The best a layer-only split (`-ngl`, as Ollama does) gets on the same machine."""
    return plan(spec, machine(gpus=[{"model": "t4"}], memory_gb=64), expert_placement=False)


def test_a_120b_moe_fits_the_unified_memory_of_a_gb10() -> None:
    result = plan(catalog_spec("gpt-oss-120b"), load_spec(SPECS / "dgx-spark-gb10.json"))
    assert result.fits and result.config.n_gpu_layers == -1
    assert not result.config.tensor_overrides
    gpu = next(budget for budget in result.devices if budget.device != CPU)
    assert gpu.weights_bytes > 55 * GIB
    # unified: what the GPU holds comes out of the same RAM
    assert device(result, CPU).capacity_bytes < 128 * GIB - gpu.used_bytes + GIB
    assert 10 < result.speed.decode_tps < 100


def test_a_405b_dense_model_on_a_32gb_cpu_machine_streams_from_disk() -> None:
    result = plan(catalog_spec("llama-3.1-405b"), machine(memory_gb=32))
    assert not result.fits and result.streams_from_disk
    assert result.speed.decode_bound_by == "disk"
    assert 0 < result.speed.decode_tps < 0.5
    assert any(reason.setting == "use_mmap" for reason in result.reasons)
    assert any("smaller quant" in line for line in result.advice)


def test_apple_silicon_offloads_everything_within_metals_working_set() -> None:
    profile = machine(
        gpus=[{"model": "apple-m2-max"}],
        memory_gb=64,
        os="darwin",
        cpu={"cores": 12, "threads": 12, "flags": ["neon", "dotprod"]},
    )
    result = plan(catalog_spec("qwen2.5-32b"), profile)
    assert result.fits and result.config.n_gpu_layers == -1
    metal = next(budget for budget in result.devices if budget.device != CPU)
    working_set = profile.gpus[0].recommended_working_set_bytes
    assert working_set is not None and metal.used_bytes <= working_set
    assert working_set < 64 * GIB


def test_two_gpus_share_a_70b_model() -> None:
    result = plan(catalog_spec("llama-3.1-70b"), load_spec(SPECS / "two-rtx-3090.json"))
    assert result.fits and result.config.n_gpu_layers == -1
    first, second = device(result, "CUDA0"), device(result, "CUDA1")
    assert first.weights_bytes == pytest.approx(second.weights_bytes, rel=0.1)
    assert device(result, CPU).weights_bytes < 2 * GIB


def test_a_v100_never_gets_a_bf16_kv_cache() -> None:
    result = plan(
        catalog_spec("llama-3.1-8b"), machine(gpus=[{"model": "v100-32gb"}], memory_gb=64)
    )
    assert result.fits and result.config.type_k in ("f16", "q8_0", "q4_0")


def test_a_descriptor_plans_without_any_file() -> None:
    descriptor = {
        "schema": 1,
        "name": "My 70B",
        "architecture": "llama",
        "total_params": 70553706496,
        "layers": 80,
        "hidden_size": 8192,
        "heads": 64,
        "kv_heads": 8,
        "ffn_size": 28672,
        "context": 131072,
        "vocab_size": 128256,
        "quant": "Q4_K_M",
    }
    result = plan(spec_from_descriptor(descriptor), load_spec(SPECS / "eight-h100.json"))
    assert result.fits and result.config.n_gpu_layers == -1
    assert result.confidence == "estimated"


def test_nothing_fitting_says_what_would() -> None:
    result = plan(
        catalog_spec("deepseek-v3"),
        machine(gpus=[{"model": "t4"}], memory_gb=16, disk={"read_gb_s": 0.5}),
        n_ctx=4096,
    )
    assert not result.fits
    assert result.advice
    assert result.speed.decode_tps < 0.1


def test_calibration_changes_the_prediction() -> None:
    spec = catalog_spec("llama-3.1-8b")
    profile = machine(memory_gb=32)
    guessed = plan(spec, profile)
    measured = plan(spec, profile, calibration={"cpu_read_bytes_per_s": 40e9})
    assert measured.confidence == "calibrated" and guessed.confidence == "estimated"
    assert measured.speed.decode_tps == pytest.approx(2 * guessed.speed.decode_tps, rel=0.05)


def test_a_plan_is_json() -> None:
    import json

    result = plan(catalog_spec("gemma-3-4b"), machine(memory_gb=16))
    data = json.loads(json.dumps(result.to_dict()))
    assert data["config"]["n_ctx"] == result.config.n_ctx
    assert {"weights_bytes", "kv_bytes", "free_bytes"} <= set(data["devices"][0])


def test_a_fixed_cost_per_layer_weighs_on_small_models_most() -> None:
    profile = machine(memory_gb=32)
    figures = {"cpu_read_bytes_per_s": 20e9, "decode_efficiency": 0.6}
    overhead = {**figures, "decode_overhead_s_per_layer": 30e-6}  # recorded on a 2-core VM
    small, big = catalog_spec("gemma-3-1b"), catalog_spec("llama-3.1-70b")
    slowdown = {
        name: plan(spec, profile, n_ctx=2048, calibration=overhead).speed.decode_tps_empty_context
        / plan(spec, profile, n_ctx=2048, calibration=figures).speed.decode_tps_empty_context
        for name, spec in (("small", small), ("big", big))
    }
    assert slowdown["small"] < slowdown["big"] < 1.0


def test_each_weight_type_reads_at_its_own_calibrated_efficiency() -> None:
    profile = machine(memory_gb=32)
    spec = catalog_spec("llama-3.1-8b")  # Q4_K_M: Q4_K and Q6_K weights
    base = {"cpu_read_bytes_per_s": 20e9, "decode_efficiency": 0.6}
    slow_k = {**base, "decode_efficiency:Q4_K": 0.3, "decode_efficiency:Q6_K": 0.3}
    fast = plan(spec, profile, n_ctx=2048, calibration=base).speed.decode_tps_empty_context
    slow = plan(spec, profile, n_ctx=2048, calibration=slow_k).speed.decode_tps_empty_context
    assert slow == pytest.approx(fast / 2, rel=0.05)  # nearly all bytes are Q4_K and Q6_K


def test_a_type_never_measured_takes_the_nearest_measured_one() -> None:
    profile = machine(memory_gb=32)  # AVX2: Q4_0 and Q4_K are repacked
    calibration = {
        "cpu_read_bytes_per_s": 20e9,
        "decode_efficiency": 0.5,
        "decode_efficiency:Q8_0": 0.6,
        "decode_efficiency:Q4_0": 0.8,
        "decode_efficiency:Q4_K": 0.7,
        "decode_row_s:Q4_K": 10e-9,
    }
    costs = describe_machine(profile, calibration).cpu_costs("decode")
    assert costs.nearest("Q5_0") == "Q8_0"  # a legacy type without repacked kernels
    assert costs.nearest("IQ4_NL") == "Q4_0"  # repacked like Q4_0
    assert costs.nearest("Q3_K") == "Q4_K"  # a K-quant
    assert costs.nearest("F16") == "Q8_0"  # nothing alike: the nearest not repacked, by bits
    # a token of 1 GB of Q3_K in 1M rows costs what Q4_K's bytes and rows cost
    assert costs.seconds({"Q3_K": 1e9}, {"Q3_K": 1e6}) == pytest.approx(
        1e9 / (20e9 * 0.7) + 1e6 * 10e-9
    )
    assert describe_machine(profile, {}).cpu_costs("decode").per_unit == {}


def test_prefill_counts_the_blocks_not_the_embeddings() -> None:
    profile = machine(memory_gb=32)
    spec = catalog_spec("gemma-3-1b")  # 302M of its 1B weights are the embeddings
    result = plan(spec, profile, n_ctx=2048, calibration={"cpu_flops": 100e9})
    blocks = spec.layer_params
    assert result.speed.prefill_tps == pytest.approx(
        100e9 * PREFILL_EFFICIENCY / (2 * blocks), rel=0.05
    )


# --- parallel requests (slots) ----------------------------------------------------------------


def slots_reason(result: Plan) -> str:
    return next(reason.why for reason in result.reasons if reason.setting == "n_parallel")


def test_room_to_spare_gives_four_slots_and_nothing_else_changes() -> None:
    spec, profile = (
        catalog_spec("llama-3.1-8b"),
        machine(gpus=[{"model": "rtx-3090"}], memory_gb=32),
    )
    result = plan(spec, profile, n_ctx=8192)
    one = plan(spec, profile, n_parallel=1, n_ctx=8192)
    assert result.fits and result.config.n_parallel == DEFAULT_PARALLEL == 4
    assert result.config == one.config.with_changes(n_parallel=4)  # context, KV, layers kept
    assert result.config.n_ctx == 8192 and result.config.total_context == 4 * 8192
    assert device(result, "CUDA0").kv_bytes == 4 * device(one, "CUDA0").kv_bytes
    assert result.speed.decode_tps == pytest.approx(one.speed.decode_tps)  # one request's speed
    assert "4 × 8192 tokens" in slots_reason(result)
    assert describe_slots(result) == (
        f"4 parallel requests × 8192 tokens: KV cache for 32768 tokens, "
        f"{result.kv_bytes / GIB:.1f} GiB"
    )
    assert_within_capacity(result)


def test_tight_memory_gives_one_slot_and_says_why() -> None:
    spec, profile = catalog_spec("llama-3.1-8b"), machine(memory_gb=8)  # 6 GiB after the margin
    result = plan(spec, profile, n_ctx=8192)
    assert result.fits and result.config.n_parallel == 1
    assert result.config == plan(spec, profile, n_parallel=1, n_ctx=8192).config
    why = slots_reason(result)
    assert why.startswith("One request at a time: a second slot's KV cache would need ")
    assert "more on CPU" in why and "does not shorten the context" in why
    two = result.config.with_changes(n_parallel=2)
    assert not evaluate_config(spec, profile, two).fits  # it really does not, as it is


def test_the_longest_context_is_never_shortened_for_slots() -> None:
    spec, profile = (
        catalog_spec("llama-3.1-8b"),
        machine(gpus=[{"model": "rtx-3090"}], memory_gb=32),
    )
    result = plan(spec, profile, goal="longest-context")
    assert (
        result.config.n_ctx
        == plan(spec, profile, goal="longest-context", n_parallel=1).config.n_ctx
    )
    assert result.config.n_parallel == 1 and "One request at a time" in slots_reason(result)


def test_fewer_than_four_slots_when_only_they_fit() -> None:
    result = plan(
        catalog_spec("llama-3.1-70b"),
        machine(gpus=[{"model": "rtx-3090"}], memory_gb=64),
        n_ctx=8192,
    )
    assert result.fits and 1 < result.config.n_parallel < DEFAULT_PARALLEL
    assert f"{result.config.n_parallel} requests at once" in slots_reason(result)
    assert_within_capacity(result)


def test_slots_asked_for_are_honoured_where_they_fit() -> None:
    spec, profile = catalog_spec("llama-3.1-8b"), machine(memory_gb=8)
    result = plan(spec, profile, n_parallel=2, n_ctx=4096)
    assert result.fits and result.config.n_parallel == 2 and result.config.n_ctx == 4096
    assert slots_reason(result).startswith("As asked: 2 requests at once")
    assert_within_capacity(result)
    single = plan(spec, profile, n_parallel=1)
    assert single.config.n_parallel == 1 and slots_reason(single).startswith("As asked: one")


def test_slots_asked_for_that_do_not_fit_are_refused_with_the_number_that_would() -> None:
    spec, profile = catalog_spec("llama-3.1-8b"), machine(memory_gb=8)
    result = plan(spec, profile, n_parallel=64, n_ctx=8192)
    assert not result.fits and result.config.n_parallel == 64
    (advice,) = result.advice
    assert advice.startswith("64 parallel requests of 8192 tokens each do not fit")
    fewer = int(advice.split("--parallel ")[1].split(")")[0])
    assert plan(spec, profile, n_parallel=fewer, n_ctx=8192).fits
    assert not plan(spec, profile, n_parallel=fewer + 1, n_ctx=8192).fits


def test_a_plans_slots_are_in_its_json() -> None:
    result = plan(catalog_spec("gemma-3-4b"), machine(memory_gb=16))
    slots = result.to_dict()["slots"]
    assert (
        slots["n_parallel"] == result.config.n_parallel == result.to_dict()["config"]["n_parallel"]
    )
    assert slots["total_context"] == result.config.n_ctx * result.config.n_parallel
    assert slots["kv_bytes"] == sum(d.kv_bytes for d in result.devices) and slots["text"]


# --- threads --------------------------------------------------------------------------------


def cpu_speed(spec: ModelSpec, figures: dict[str, float], **threads: int) -> SpeedEstimate:
    """The predicted speed of `spec` on an 8-core, 16-thread CPU with these threads."""
    config = EngineConfig(spec.name, n_ctx=2048, flash_attn=True, **threads)
    return evaluate_config(spec, machine(memory_gb=32), config, figures).speed


def test_a_thread_count_calibration_measured_scales_its_prediction_by_what_it_measured() -> None:
    spec = catalog_spec("llama-3.1-8b")
    figures = {
        "cpu_read_bytes_per_s": 20e9,
        "decode_efficiency": 0.6,
        "decode_threads": 8,
        "prefill_threads": 16,
        "decode_thread_scale:4": 0.7,
        "prefill_thread_scale:4": 0.45,
    }
    full, half = cpu_speed(spec, figures, n_threads=8), cpu_speed(spec, figures, n_threads=4)
    assert half.decode_tps_empty_context / full.decode_tps_empty_context == pytest.approx(
        0.7, rel=0.02
    )
    assert half.prefill_tps == pytest.approx(full.prefill_tps)  # its batch threads: all 16
    half_batch = cpu_speed(spec, figures, n_threads=8, n_threads_batch=4)
    assert half_batch.prefill_tps / full.prefill_tps == pytest.approx(0.45)


def test_unmeasured_thread_counts_scale_with_the_cores_used_and_no_faster_than_ram() -> None:
    spec = catalog_spec("llama-3.1-8b")
    figures = {"cpu_read_bytes_per_s": 20e9, "decode_efficiency": 0.6}
    eight = cpu_speed(spec, figures, n_threads=8).decode_tps_empty_context
    four = cpu_speed(spec, figures, n_threads=4).decode_tps_empty_context
    assert four == pytest.approx(eight / 2, rel=0.02)
    # SMT siblings add no cores: 16 threads on 8 cores decode as 8 do
    assert cpu_speed(spec, figures, n_threads=16).decode_tps_empty_context == pytest.approx(eight)
    prefill = cpu_speed(spec, figures, n_threads=8).prefill_tps  # batch: all 16 threads
    assert cpu_speed(spec, figures, n_threads=8, n_threads_batch=4).prefill_tps == (
        pytest.approx(prefill / 2)
    )
    # 4 threads that read RAM at only 3 GB/s are bound by it
    slow_ram = {**figures, "cpu_read_bytes_per_s:4": 3e9}
    config = EngineConfig(spec.name, n_ctx=2048, n_threads=4)
    read = sum(token_work(spec, config, (), pieces_from_spec(spec)).read_bytes[CPU].values())
    bound = cpu_speed(spec, slow_ram, n_threads=4).decode_tps_empty_context
    assert bound == pytest.approx(3e9 / read, rel=0.02) and bound < four
