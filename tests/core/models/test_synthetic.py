"""Synthetic GGUFs load and generate in the real engine, in every family and weight type."""

from __future__ import annotations

import time
from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf
from tests.fixtures.synthetic_gguf import SHAPES, synthetic_tensors, write_synthetic_gguf

PROMPT = "Question: what is the colour of the sky?\nAnswer:"


def generate(path: Path, n_tokens: int = 8) -> tuple[str, int]:
    """Greedy text from the model at `path`, after checking its logits are real numbers."""
    # One thread: on shared CI cores, threads waiting at llama.cpp's barriers cost seconds.
    engine = Engine(EngineConfig(str(path), n_ctx=256, n_threads=1, n_threads_batch=1))
    try:
        llm = engine.llama
        llm.eval(llm.tokenize(PROMPT.encode()))
        last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
        logits = np.ctypeslib.as_array(last, shape=(llm.n_vocab(),))
        assert np.isfinite(logits).all() and logits.std() > 0
        llm.reset()
        reply = llm.create_completion(PROMPT, max_tokens=n_tokens, temperature=0)
    finally:
        engine.close()
    assert isinstance(reply, dict)  # not a stream
    return reply["choices"][0]["text"], reply["usage"]["completion_tokens"]


@pytest.mark.parametrize(
    ("shape_name", "quant"),
    [
        ("tiny-dense", "F16"),
        ("tiny-dense", "Q4_0"),
        ("tiny-moe", "Q8_0"),
        ("tiny-gemma3", "BF16"),
        ("tiny-deepseek2", "Q8_0"),
        ("tiny-gpt-oss", "F32"),
    ],
)
def test_synthetic_models_load_and_generate(tmp_path: Path, shape_name: str, quant: str) -> None:
    path = write_synthetic_gguf(tmp_path / f"{shape_name}.gguf", shape_name, quant)
    text, n_generated = generate(path)
    assert n_generated >= 1 and text


def test_k_quant_files_get_the_tensor_types_llama_cpp_would_choose(tmp_path: Path) -> None:
    quantized = write_synthetic_gguf(
        tmp_path / "quantized.gguf", "tiny-moe", "Q4_K_M", via_quantizer=True
    )
    direct = write_synthetic_gguf(
        tmp_path / "direct.gguf", "tiny-moe", "Q4_K_M", via_quantizer=False
    )
    assert not [path.name for path in tmp_path.iterdir() if path not in (quantized, direct)]
    types = {t.name: t.type_name for t in validate_gguf(quantized).tensors}
    assert {t.name: t.type_name for t in validate_gguf(direct).tensors} == types
    assert {"Q4_K", "Q6_K"} <= set(types.values())  # the mix: more bits where llama.cpp wants
    spec = spec_from_gguf(direct)
    assert spec.file_type == "Q4_K_M" and spec.size_bytes == spec_from_gguf(quantized).size_bytes
    _, n_generated = generate(direct, n_tokens=2)
    assert n_generated >= 1


def test_weights_are_random_and_differ_by_seed(tmp_path: Path) -> None:
    first = write_synthetic_gguf(tmp_path / "a.gguf", "tiny-dense", "Q8_0", seed=1)
    second = write_synthetic_gguf(tmp_path / "b.gguf", "tiny-dense", "Q8_0", seed=2)
    tensor = validate_gguf(first).tensors[2]
    with first.open("rb") as a, second.open("rb") as b:
        a.seek(tensor.offset)
        b.seek(tensor.offset)
        data_a, data_b = a.read(tensor.n_bytes), b.read(tensor.n_bytes)
    assert data_a != data_b
    assert len(set(data_a[2::34])) > 100  # Q8_0 quants vary, block after block


def test_the_gemma3_shape_has_every_sixth_layer_global(tmp_path: Path) -> None:
    path = write_synthetic_gguf(tmp_path / "gemma.gguf", "tiny-gemma3", "Q8_0")
    spec = spec_from_gguf(path)
    assert spec.sliding_window == 128
    assert [i for i, layer in enumerate(spec.layers) if not layer.sliding_window] == [5, 11]


def test_moe_shapes_carry_the_tensors_llama_cpp_expects() -> None:
    names = {tensor.name for tensor in synthetic_tensors(SHAPES["tiny-moe"])}
    for suffix in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        assert f"blk.3.{suffix}.weight" in names
    assert "blk.0.ffn_gate.weight" not in names


@pytest.mark.slow
def test_a_1_5b_model_is_written_quickly_and_runs(tmp_path: Path) -> None:
    start = time.perf_counter()
    path = write_synthetic_gguf(tmp_path / "dense-1.5b.gguf", "dense-1.5b", "Q4_0")
    elapsed_s = time.perf_counter() - start
    assert elapsed_s < 60  # about 3 s on two idle cores; shared CI cores are slower
    spec = spec_from_gguf(path)
    assert 1.4e9 < (spec.total_params or 0) < 1.6e9
    assert spec.file_type == "Q4_0"
    _, n_generated = generate(path, n_tokens=2)
    assert n_generated >= 1
