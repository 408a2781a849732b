"""The memory model: llama.cpp's placement rules, and predictions against real loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.autotune.memory import (
    CPU,
    REPACKED_ON_X86_AVX2,
    LayerPlacement,
    compare_with_load,
    estimate_memory,
    pieces_from_gguf,
    repacked_types,
)
from hearthside.core.engine.config import EngineConfig, TensorOverride
from hearthside.core.engine.engine import Engine
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf_info
from tests.fixtures.synthetic_gguf import write_synthetic_gguf

pytestmark = pytest.mark.beside

GIB = 1 << 30
EXPERTS_ON_CPU = (TensorOverride(r"ffn_.*_exps", "CPU"),)


def test_llama_cpp_counts_the_output_layer_among_the_gpu_layers() -> None:
    config = EngineConfig("m.gguf", n_gpu_layers=3)
    placement = LayerPlacement(8, config, ["CUDA0"])
    assert [placement.device_of(layer) for layer in range(9)] == [CPU] * 6 + ["CUDA0"] * 3


def test_all_layers_means_the_blocks_and_the_output() -> None:
    placement = LayerPlacement(8, EngineConfig("m.gguf", n_gpu_layers=-1), ["CUDA0"])
    assert {placement.device_of(layer) for layer in range(9)} == {"CUDA0"}


def test_no_gpu_keeps_everything_on_the_cpu() -> None:
    placement = LayerPlacement(8, EngineConfig("m.gguf", n_gpu_layers=-1), [])
    assert {placement.device_of(layer) for layer in range(9)} == {CPU}


def test_a_tensor_split_deals_layers_in_proportion() -> None:
    config = EngineConfig("m.gguf", n_gpu_layers=-1, tensor_split=(3.0, 1.0))
    placement = LayerPlacement(79, config, ["CUDA0", "CUDA1"])
    first = sum(placement.device_of(layer) == "CUDA0" for layer in range(80))
    assert first == 60


def test_each_slot_holds_its_own_kv_cache_and_logits_row() -> None:
    spec = catalog_spec("gemma-3-4b")  # sliding-window layers too: each slot has its window
    one = estimate_memory(spec, EngineConfig("m.gguf", n_ctx=8192, flash_attn=True))
    four = estimate_memory(spec, EngineConfig("m.gguf", n_ctx=8192, flash_attn=True, n_parallel=4))
    assert four.devices[CPU].kv_bytes == 4 * one.devices[CPU].kv_bytes
    assert four.devices[CPU].output_bytes == 4 * one.devices[CPU].output_bytes
    assert four.devices[CPU].weights_bytes == one.devices[CPU].weights_bytes
    assert four.devices[CPU].compute_bytes >= one.devices[CPU].compute_bytes  # masks span them


def test_a_70b_model_split_over_two_gpus_holds_its_weights_there() -> None:
    spec = catalog_spec("llama-3.1-70b")
    config = EngineConfig("m.gguf", n_ctx=8192, n_gpu_layers=-1)
    estimate = estimate_memory(spec, config, gpus=["CUDA0", "CUDA1"])
    gpu0, gpu1 = estimate.devices["CUDA0"], estimate.devices["CUDA1"]
    assert gpu0.weights_bytes == pytest.approx(gpu1.weights_bytes, rel=0.1)
    on_gpus = gpu0.weights_bytes + gpu1.weights_bytes
    assert on_gpus + estimate.devices[CPU].weights_bytes == pytest.approx(spec.size_bytes, rel=1e-6)
    assert estimate.devices[CPU].weights_bytes == spec.embeddings.bytes  # the input stays home
    # 80 layers x 8192 cells x 2 x 8 KV heads x 128 dims x 2 bytes = 2.5 GiB of f16 KV
    assert gpu0.kv_bytes + gpu1.kv_bytes == 80 * 8192 * 2 * 8 * 128 * 2
    assert estimate.devices[CPU].kv_bytes == 0


def test_partial_offload_puts_the_last_layers_on_the_gpu() -> None:
    spec = catalog_spec("llama-3.1-70b")
    estimate = estimate_memory(spec, EngineConfig("m.gguf", n_gpu_layers=41), gpus=["CUDA0"])
    assert estimate.devices["CUDA0"].layers == list(range(40, 80))
    assert estimate.devices[CPU].layers == list(range(40))
    half_the_blocks = spec.layer_bytes / 2 + spec.embeddings.bytes
    assert estimate.devices[CPU].weights_bytes == pytest.approx(half_the_blocks, rel=0.001)


def test_moe_experts_overridden_to_the_cpu_leave_attention_on_the_gpu() -> None:
    spec = catalog_spec("qwen3-30b-a3b")
    config = EngineConfig("m.gguf", n_gpu_layers=-1, tensor_overrides=EXPERTS_ON_CPU)
    estimate = estimate_memory(spec, config, gpus=["CUDA0"])
    cpu, gpu = estimate.devices[CPU], estimate.devices["CUDA0"]
    assert cpu.weights_bytes >= spec.routed_expert_bytes
    assert gpu.weights_bytes < 0.15 * spec.size_bytes  # attention, norms, router, output
    assert gpu.kv_bytes > 0 and cpu.kv_bytes == 0


def test_tied_embeddings_are_copied_to_the_gpu_that_runs_the_output() -> None:
    spec = catalog_spec("gemma-3-4b")
    assert spec.tied_embeddings
    on_gpu = estimate_memory(spec, EngineConfig("m.gguf", n_gpu_layers=-1), gpus=["CUDA0"])
    assert on_gpu.devices["CUDA0"].weights_bytes + on_gpu.devices[CPU].weights_bytes == (
        spec.size_bytes + spec.embeddings.bytes
    )


def test_flash_attention_shrinks_the_compute_buffer_at_long_context() -> None:
    spec = catalog_spec("llama-3.1-8b")
    without = estimate_memory(spec, EngineConfig("m.gguf", n_ctx=32768))
    with_fa = estimate_memory(spec, EngineConfig("m.gguf", n_ctx=32768, flash_attn=True))
    assert with_fa.devices[CPU].compute_bytes < without.devices[CPU].compute_bytes / 4


def test_only_cpus_with_the_kernels_repack() -> None:
    assert repacked_types(["avx2", "fma"], "x86_64") == REPACKED_ON_X86_AVX2
    assert "Q2_K" in repacked_types(["avx2", "avx512f"], "x86_64")  # an AVX-512 kernel
    assert "Q2_K" not in REPACKED_ON_X86_AVX2
    assert repacked_types(["sse4_2"], "x86_64") == frozenset()
    assert "Q4_0" in repacked_types(["neon", "dotprod"], "arm64")


LOADS = [
    ("tiny-dense", "Q8_0"),
    ("tiny-moe", "Q4_0"),
    ("tiny-gemma3", "Q8_0"),
    ("tiny-deepseek2", "Q8_0"),
    ("tiny-gpt-oss", "Q8_0"),
]
SETTINGS = [(1024, "f16", False), (4096, "q8_0", True), (8192, "q4_0", True)]


@pytest.fixture(scope="module")
def synthetic_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("memory-models")
    return {
        name: write_synthetic_gguf(folder / f"{name}.gguf", name, quant) for name, quant in LOADS
    }


@pytest.mark.parametrize("name", [name for name, _ in LOADS])
def test_predictions_match_what_llama_cpp_allocates(
    name: str, synthetic_models: dict[str, Path]
) -> None:
    assert_predicted_like_allocated(synthetic_models[name])


def test_the_default_models_buffers_are_predicted(default_model_file: Path) -> None:
    assert_predicted_like_allocated(default_model_file)


def assert_predicted_like_allocated(path: Path) -> None:
    info = validate_gguf(path)
    spec = spec_from_gguf_info(info)
    for n_ctx, cache_type, flash_attn in SETTINGS:
        config = EngineConfig(
            str(path),
            n_ctx=n_ctx,
            type_k=cache_type,
            type_v=cache_type,
            flash_attn=flash_attn,
            n_threads=1,
        )
        engine = Engine(config)
        try:
            report = engine.load_report
        finally:
            engine.close()
        estimate = estimate_memory(
            spec, config, repacked=REPACKED_ON_X86_AVX2, pieces=pieces_from_gguf(info)
        )
        off = [c for c in compare_with_load(estimate, report) if not c.within_tolerance]
        assert not off, f"{path.name} at {n_ctx} {cache_type}: {off}"
