"""EngineConfig: every knob validated, round-trips through JSON, maps onto llama.cpp."""

from __future__ import annotations

import json

import pytest

from hearthside.core.engine.config import (
    EngineConfig,
    EngineConfigError,
    SamplingParams,
    SpeculativeConfig,
)

pytestmark = pytest.mark.beside


def test_round_trips_through_json() -> None:
    config = EngineConfig(
        model_path="/m.gguf",
        n_ctx=8192,
        n_gpu_layers=-1,
        tensor_split=(0.6, 0.4),
        type_k="q8_0",
        type_v="q8_0",
        flash_attn=True,
        numa="distribute",
        speculative=SpeculativeConfig(mode="prompt_lookup", draft_tokens=3),
    )
    assert EngineConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_llama_kwargs_carry_the_settings() -> None:
    kwargs = EngineConfig(
        model_path="/m.gguf", n_threads=3, n_threads_batch=5, type_k="q4_0", split_mode="row"
    ).llama_kwargs()
    assert kwargs["n_threads"] == 3 and kwargs["n_threads_batch"] == 5
    assert kwargs["type_k"] == 2 and kwargs["type_v"] == 1
    assert kwargs["split_mode"] == 2


def test_default_threads_come_from_the_machine() -> None:
    config = EngineConfig(model_path="/m.gguf")
    assert config.decode_threads >= 1
    assert config.batch_threads >= config.decode_threads


@pytest.mark.parametrize(
    "changes",
    [
        {"n_ctx": 8},
        {"n_ubatch": 1024, "n_batch": 512},
        {"n_threads": 0},
        {"type_k": "q9_9"},
        {"type_v": "q8_0"},  # quantized V without flash attention
        {"split_mode": "diagonal"},
        {"numa": "everywhere"},
        {"n_gpu_layers": -2},
    ],
)
def test_bad_settings_are_refused_with_a_message(changes: dict) -> None:
    with pytest.raises(EngineConfigError) as error:
        EngineConfig(model_path="/m.gguf", **changes)
    assert error.value.message


def test_newer_schema_is_refused() -> None:
    with pytest.raises(EngineConfigError, match="newer"):
        EngineConfig.from_dict({"model_path": "/m.gguf", "schema": 99})


@pytest.mark.parametrize(
    "changes", [{"temperature": -1}, {"top_p": 0}, {"max_tokens": 0}, {"stop": ("",)}]
)
def test_bad_sampling_is_refused(changes: dict) -> None:
    with pytest.raises(EngineConfigError):
        SamplingParams(**changes)
