"""Local re-quantization of the real default model with llama.cpp, in a child process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import llama_cpp
import pytest

from hearthside.core.errors import ModelStoreError
from hearthside.core.models.default_model import GEMMA_MODEL_NAME
from hearthside.core.models.quantize import (
    QUANT_TYPES,
    QuantizeCancelled,
    plan_quantize,
    precision_warning,
    quant_type,
    quantize_model,
)
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir
from tests.small_disk import small_tmpfs

pytestmark = pytest.mark.beside


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


@pytest.fixture
def default_model(store: ModelStore, default_model_file: Path) -> ModelRecord:
    """The real Gemma 3 270M Q4_K_M, registered in place as the default model."""
    record = store.add(
        default_model_file,
        link=True,
        name=GEMMA_MODEL_NAME,
        licence="Gemma terms",
        check_native=False,  # not the point here, and a second per test
    )
    return store.set_default(record.id)


def model_files(store: ModelStore) -> list[str]:
    return sorted(path.name for path in store.models_dir.iterdir() if path.is_file())


@pytest.mark.slow  # quantizes, hashes and loads the real 253 MB model
def test_quantize_default_to_q4_0_makes_a_loadable_registered_variant(
    store: ModelStore, default_model: ModelRecord
) -> None:
    plan = plan_quantize(store, "default", "q4_0")
    reports: list[tuple[int, int]] = []

    record = quantize_model(store, "default", "q4_0", progress=lambda *r: reports.append(r))

    assert plan.warnings == ()
    assert default_model.id == "gemma-3-270m-q4_k_m"
    assert record.id == "gemma-3-270m-q4_0"  # the source's own quant suffix is replaced
    assert record.path == store.models_dir / f"{record.id}.gguf"
    assert (record.quant, record.variant_of) == ("Q4_0", default_model.id)
    assert record.source == f"quantized:{default_model.id}"
    assert record.name == "Gemma 3 270M (Q4_0)"
    assert record.licence == default_model.licence
    assert record.architecture == "gemma3"
    assert record.parameter_count == default_model.parameter_count
    assert record.size_bytes < default_model.size_bytes <= plan.estimated_bytes
    assert record.size_bytes <= plan.estimated_bytes
    assert record.path.stat().st_mode & 0o777 == 0o600
    assert reports[-1] == (236, 236)  # llama.cpp's per-tensor lines drive the progress
    assert store.variants_of(default_model.id) == [record]
    assert model_files(store) == [record.path.name]  # no .part left
    model = llama_cpp.Llama(str(record.path), n_ctx=128, verbose=False)
    try:
        completion = model.create_completion(
            "The capital of France is", max_tokens=8, temperature=0
        )
    finally:
        model.close()
    assert completion["usage"]["completion_tokens"] >= 1
    assert completion["choices"][0]["text"].strip()

    with pytest.raises(ModelStoreError, match=f"already has a Q4_0 variant: '{record.id}'"):
        quantize_model(store, "default", "Q4_0")


def test_more_bits_than_the_source_is_a_warning_not_an_error(
    store: ModelStore, default_model: ModelRecord
) -> None:
    plan = plan_quantize(store, default_model.id, "Q8_0")
    [warning] = plan.warnings
    assert "Q4_K_M" in warning and "cannot bring back the precision" in warning
    assert plan.estimated_bytes > default_model.size_bytes

    warned: list[str] = []
    stop_at_once = threading.Event()
    stop_at_once.set()
    with pytest.raises(QuantizeCancelled):
        quantize_model(
            store, default_model.id, "Q8_0", cancel=stop_at_once, on_warning=warned.append
        )
    assert warned == [warning]  # told before the work started


def test_precision_warning_rules() -> None:
    assert precision_warning("F16", quant_type("Q8_0")) is None
    assert precision_warning("BF16", quant_type("F16")) is None
    assert precision_warning("Q8_0", quant_type("Q4_K_M")) is None
    assert precision_warning("Q4_K_M", quant_type("Q4_0")) is None
    assert precision_warning("IQ2_XS", quant_type("Q2_K")) is not None
    assert precision_warning("Q4_K_M", quant_type("Q5_K_M")) is not None
    assert precision_warning(None, quant_type("F16")) is None


def test_an_invalid_type_is_a_clear_error_listing_the_valid_ones(
    store: ModelStore, default_model: ModelRecord
) -> None:
    with pytest.raises(ModelStoreError, match="'Q4_X' is not a quantization type") as raised:
        quantize_model(store, default_model.id, "Q4_X")
    hint = raised.value.hint or ""
    for name in ("Q8_0", "Q6_K", "Q5_K_M", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_0", "Q3_K_M", "Q2_K"):
        assert name in hint
    assert set(QUANT_TYPES) >= {"F16", "Q8_0", "Q2_K"}

    with pytest.raises(ModelStoreError, match="is already Q4_K_M"):
        quantize_model(store, default_model.id, "Q4_K_M")
    assert model_files(store) == []


def test_cancel_kills_the_work_and_keeps_nothing(
    store: ModelStore, default_model: ModelRecord
) -> None:
    cancel = threading.Event()
    reports: list[int] = []

    def cancel_once_it_is_working(done: int, _total: int) -> None:
        reports.append(done)
        cancel.set()

    with pytest.raises(QuantizeCancelled, match="nothing was kept"):
        quantize_model(
            store, default_model.id, "Q6_K", progress=cancel_once_it_is_working, cancel=cancel
        )

    assert reports and reports[0] < 236  # it was stopped part-way
    assert model_files(store) == []
    assert store.list() == [default_model]


def test_too_little_space_is_refused_before_starting(
    default_model_file: Path, hearthside_home: Path
) -> None:
    with small_tmpfs(hearthside_home, 8), ModelStore(data_dir()) as store:
        source = store.add(default_model_file, link=True, check_native=False)
        with pytest.raises(ModelStoreError, match="Not enough free disk space") as raised:
            quantize_model(store, source.id, "Q4_0")
        assert "fewer bits per weight" in (raised.value.hint or "")
        assert model_files(store) == []
