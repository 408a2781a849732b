"""The memory model held to 5%, with no absolute slack, on buffers of 320 MiB and more.

Synthetic models (tests/fixtures/large_memory_shapes.py) loaded by the real engine; every
buffer llama.cpp logs at that size is compared with `estimate_memory`'s prediction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.autotune.memory import (
    CPU,
    LARGE_BUFFER_BYTES,
    REPACKED_ON_X86_AVX2,
    BufferComparison,
    compare_with_load,
    estimate_memory,
    pieces_from_gguf,
)
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf_info
from tests.fixtures.large_memory_shapes import LARGE_CASES, LARGE_SHAPES, LargeCase, case_settings
from tests.fixtures.synthetic_gguf import write_synthetic_gguf

pytestmark = pytest.mark.beside

MIB = 1024 * 1024


def test_a_large_buffer_gets_no_absolute_slack() -> None:
    allocated = 400 * MIB
    assert BufferComparison(CPU, "kv", round(allocated * 1.049), allocated).within_tolerance
    assert not BufferComparison(CPU, "kv", round(allocated * 1.051), allocated).within_tolerance
    assert not BufferComparison(CPU, "kv", round(allocated * 0.949), allocated).within_tolerance


def test_a_small_buffer_does_not_pass_with_a_zero_prediction() -> None:
    assert not BufferComparison(CPU, "compute", 0, 2 * MIB).within_tolerance
    assert not BufferComparison(CPU, "compute", 0, LARGE_BUFFER_BYTES - 1).within_tolerance
    assert BufferComparison(CPU, "compute", 9 * MIB, 10 * MIB).within_tolerance  # 5% + 1 MiB


@pytest.fixture(scope="module")
def large_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("large-memory-models")
    return {
        name: write_synthetic_gguf(folder / f"{name}-{quant}.gguf", shape, quant)
        for name, (shape, quant) in LARGE_SHAPES.items()
    }


@pytest.mark.parametrize("case", LARGE_CASES, ids=[case.name for case in LARGE_CASES])
def test_large_buffers_are_predicted_within_5_percent(
    case: LargeCase, large_models: dict[str, Path]
) -> None:
    path = large_models[case.shape]
    config = EngineConfig(str(path), **case_settings(case))
    engine = Engine(config)
    try:
        report = engine.load_report
    finally:
        engine.close()
    info = validate_gguf(path)
    estimate = estimate_memory(
        spec_from_gguf_info(info),
        config,
        repacked=REPACKED_ON_X86_AVX2,
        pieces=pieces_from_gguf(info),
    )
    large = [c for c in compare_with_load(estimate, report) if c.is_large]
    assert case.large_kinds <= {c.purpose for c in large}, f"not all ≥ 320 MiB: {large}"
    off = [f"{c.purpose} {c.relative_error:+.1%}" for c in large if not c.within_tolerance]
    assert not off, f"{case.name}: {off}"
