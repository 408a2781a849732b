"""Tensor buffer-type overrides reach llama.cpp's loader, and what it allocated is read back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, TensorOverride
from hearthside.core.engine.engine import Engine
from hearthside.core.engine.load_report import device_of, parse_load_log
from hearthside.core.engine.tensor_overrides import (
    LlamaWithOverrides,
    TensorOverrideError,
    engine_device_names,
    native_overrides,
)

pytestmark = pytest.mark.beside

MIB = 1024 * 1024
GEMMA_KV_HEADS = 1
GEMMA_HEAD_DIM = 256
GEMMA_GLOBAL_LAYERS = 3  # of 18: every 6th layer attends to the whole context


def test_the_cpu_is_always_an_engine_device() -> None:
    assert "CPU" in engine_device_names()


def test_overridden_tensors_are_placed_where_asked(default_model_file: Path) -> None:
    pattern = r"blk\.[0-3]\.ffn_down"
    config = EngineConfig(
        str(default_model_file), n_ctx=256, tensor_overrides=(TensorOverride(pattern, "CPU"),)
    )
    engine = Engine(config)
    try:
        placed = engine.load_report.overridden
        assert sorted(placed) == [f"blk.{layer}.ffn_down.weight" for layer in range(4)]
        assert all(device_of(buffer) == "CPU" for buffer in placed.values())
        reply = engine.llama.create_completion(
            "Question: Name a colour.\nAnswer:", max_tokens=4, temperature=0
        )
        assert reply["choices"][0]["text"].strip()  # type: ignore[index]
    finally:
        engine.close()


def test_an_unknown_device_is_refused_with_the_devices_there_are(
    default_model_file: Path,
) -> None:
    config = EngineConfig(
        str(default_model_file), tensor_overrides=(TensorOverride("ffn", "CUDA7"),)
    )
    with pytest.raises(TensorOverrideError) as caught:
        Engine(config)
    assert "CUDA7" in caught.value.message
    assert "CPU" in (caught.value.hint or "")


def test_a_bad_pattern_is_refused_before_anything_loads() -> None:
    with pytest.raises(TensorOverrideError, match="regular expression"):
        native_overrides([TensorOverride("blk.(", "CPU")])


def test_overrides_stay_with_their_own_model(default_model_file: Path) -> None:
    """Another model loaded at the same time, without overrides, is untouched by them."""
    with_overrides = LlamaWithOverrides(
        str(default_model_file),
        n_ctx=256,
        verbose=False,
        tensor_overrides=native_overrides([TensorOverride("ffn_down", "CPU")]),
    )
    try:
        assert with_overrides.model_params.tensor_buft_overrides
        plain = Engine(EngineConfig(str(default_model_file), n_ctx=256))
        try:
            assert plain.load_report.overridden == {}
            assert not plain.llama.model_params.tensor_buft_overrides
        finally:
            plain.close()
    finally:
        with_overrides.close()


def test_overrides_round_trip_through_json_settings() -> None:
    config = EngineConfig("m.gguf", tensor_overrides=(TensorOverride(r"exps\.", "CPU"),))
    assert EngineConfig.from_dict(config.to_dict()) == config
    assert config.tensor_overrides[0].to_flag() == r"exps\.=CPU"


def test_the_load_report_has_the_kv_cache_llama_cpp_made(default_model_file: Path) -> None:
    n_ctx = 2048  # larger than the sliding window's cache (window + one batch)
    config = EngineConfig(
        str(default_model_file),
        n_ctx=n_ctx,
        type_k="q8_0",
        type_v="q8_0",
        flash_attn=True,
        swa_full=False,
    )
    engine = Engine(config)
    try:
        report = engine.load_report
    finally:
        engine.close()
    full_context = [cache for cache in report.kv_caches if cache.cells == n_ctx]
    assert [cache.layers for cache in full_context] == [GEMMA_GLOBAL_LAYERS]
    q8_0_bytes_per_value = 34 / 32
    expected = n_ctx * GEMMA_GLOBAL_LAYERS * 2 * GEMMA_KV_HEADS * GEMMA_HEAD_DIM
    assert full_context[0].bytes == pytest.approx(expected * q8_0_bytes_per_value, abs=0.01 * MIB)
    assert report.kv_bytes == sum(cache.bytes for cache in report.kv_caches)
    file_bytes = default_model_file.stat().st_size
    assert 0.9 * file_bytes < report.model_bytes < 1.1 * file_bytes
    assert report.compute_bytes > 0
    assert list(report.devices) == ["CPU"]


# Recorded from llama.cpp loading a 32-layer model with 20 layers on an RTX 3090.
CUDA_LOAD_LOG = """\
load_tensors: offloading 20 repeating layers to GPU
load_tensors: offloaded 20/33 layers to GPU
load_tensors:        CUDA0 model buffer size =  2816.25 MiB
load_tensors:   CPU_Mapped model buffer size =  1959.52 MiB
llama_context:  CUDA_Host  output buffer size =     0.49 MiB
llama_kv_cache:      CUDA0 KV buffer size =   640.00 MiB
llama_kv_cache:        CPU KV buffer size =   384.00 MiB
llama_kv_cache: size = 1024.00 MiB (  8192 cells,  32 layers,  1/1 seqs), K (f16):  512.00 MiB, V (f16):  512.00 MiB
sched_reserve:      CUDA0 compute buffer size =   560.00 MiB
sched_reserve:  CUDA_Host compute buffer size =    24.01 MiB
"""  # noqa: E501


def test_a_partial_offload_log_is_split_between_gpu_and_host() -> None:
    report = parse_load_log(CUDA_LOAD_LOG.splitlines())
    gpu, host = report.devices["CUDA0"], report.devices["CPU"]
    assert gpu.model_bytes == round(2816.25 * MIB)
    assert gpu.kv_bytes == 640 * MIB
    assert gpu.compute_bytes == 560 * MIB
    assert host.model_bytes == round(1959.52 * MIB)
    assert host.kv_bytes == 384 * MIB
    assert host.compute_bytes == round(24.01 * MIB)
    assert host.output_bytes == round(0.49 * MIB)
    assert [(cache.cells, cache.layers, cache.type_k) for cache in report.kv_caches] == [
        (8192, 32, "f16")
    ]


def test_lines_that_are_not_buffer_reports_are_ignored() -> None:
    noise = ["llama_context: n_ctx = 4096", "print_info: n_layer = 32", "", "garbage MiB"]
    report = parse_load_log(noise)
    assert report.total_bytes == 0 and not report.kv_caches


@pytest.mark.parametrize(
    ("buffer", "device"),
    [
        ("CPU", "CPU"),
        ("CPU_Mapped", "CPU"),
        ("CPU_REPACK", "CPU"),
        ("CUDA_Host", "CPU"),
        ("CUDA0", "CUDA0"),
        ("ROCm1", "ROCm1"),
        ("Metal", "Metal"),
    ],
)
def test_host_buffers_count_as_system_memory(buffer: str, device: str) -> None:
    assert device_of(buffer) == device
    assert re.fullmatch(r"\w+", device)
