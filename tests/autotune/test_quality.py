"""Measured quality: KL divergence, top-1 agreement and perplexity of real re-quantized files
and KV-cache types against the real default model, through the engine worker."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from hearthside.autotune.quality import (
    TAIL_SAMPLES,
    TOP_K,
    Candidate,
    QualityError,
    QualityReport,
    choose_reference,
    chunked,
    kept_tokens,
    kl_divergence,
    load_eval_text,
    log_softmax,
    measure_quality,
    reference_cache_path,
)
from hearthside.autotune.wisdom import QualityRecord, WisdomDB, WisdomError
from hearthside.core.models.store import ModelRecord
from tests.gguf_samples import quantize_file

pytestmark = pytest.mark.beside

SHORT_CTX = 128
# One chunk of 128 SmolLM2 tokens (the text averages ~4.3 characters a token): 63 scored.
SHORT_TEXT_CHARS = 700


def requantized(source: Path, quant: str, folder: Path) -> Path:
    return quantize_file(source, folder / f"smollm2-{quant.lower()}.gguf", quant)


@dataclasses.dataclass(frozen=True)
class Measured:
    first: QualityReport  # reference itself, q4_0 KV, Q4_0 weights: computes the reference
    cached: QualityReport  # Q8_0 weights, a fresh DB: the reference comes from the disk cache
    again: QualityReport  # the first candidates again: all from the DB
    cache_file: Path


@pytest.fixture(scope="module")
def measured(chat_model_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Measured:
    folder = tmp_path_factory.mktemp("quality")
    reference = Candidate(chat_model_file, "Q4_1")
    first_candidates = [
        reference,
        Candidate(chat_model_file, "Q4_1", "q4_0"),
        Candidate(requantized(chat_model_file, "Q4_0", folder), "Q4_0"),
    ]
    q8_0 = Candidate(requantized(chat_model_file, "Q8_0", folder), "Q8_0")
    text = load_eval_text().head(SHORT_TEXT_CHARS)
    options = {"text": text, "n_ctx": SHORT_CTX, "cache_dir": folder}
    with WisdomDB(folder / "first.db") as db:
        first = measure_quality(reference, first_candidates, db, **options)
        again = measure_quality(reference, first_candidates, db, **options)
    with WisdomDB(folder / "second.db") as db:
        cached = measure_quality(reference, [q8_0], db, **options)
    cache_file = next(folder.glob("*.npz"))
    return Measured(first, cached, again, cache_file)


def figures(report: QualityReport) -> dict[str, QualityRecord]:
    return {result.candidate.name: result.record for result in report.results}


@pytest.mark.slow  # five engine passes over 128 tokens, shared by the tests below
def test_the_reference_against_itself_agrees_everywhere(measured: Measured) -> None:
    itself = figures(measured.first)["Q4_1 + f16 KV"]

    assert itself.mean_kld == pytest.approx(0.0, abs=1e-6)
    assert itself.top1_agreement == 1.0
    assert itself.perplexity == pytest.approx(itself.reference_perplexity, rel=1e-6)
    assert itself.n_tokens == SHORT_CTX // 2 - 1
    assert itself.reference == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert 1.0 < itself.reference_perplexity < 100.0


@pytest.mark.slow
def test_fewer_bits_cost_more_kl_divergence(measured: Measured) -> None:
    q4_0 = figures(measured.first)["Q4_0 + f16 KV"]
    q8_0 = figures(measured.cached)["Q8_0 + f16 KV"]

    assert q4_0.mean_kld > q8_0.mean_kld > 0
    assert q4_0.kld_p99 > q8_0.kld_p99
    assert q4_0.top1_agreement <= q8_0.top1_agreement
    assert q4_0.reference_perplexity == q8_0.reference_perplexity  # the same cached reference
    assert q4_0.candidate_model != q8_0.candidate_model != q4_0.reference_model


@pytest.mark.slow
def test_a_q4_0_kv_cache_is_worse_than_f16(measured: Measured) -> None:
    by_name = figures(measured.first)
    f16, q4_0 = by_name["Q4_1 + f16 KV"], by_name["Q4_1 + q4_0 KV"]

    assert q4_0.mean_kld > f16.mean_kld + 1e-3
    assert q4_0.top1_agreement < f16.top1_agreement
    assert (q4_0.candidate_model, q4_0.kv_type) == (f16.candidate_model, "q4_0")


@pytest.mark.slow
def test_the_reference_pass_runs_once_and_results_are_reused(measured: Measured) -> None:
    assert measured.first.reference_computed
    assert not any(result.reused for result in measured.first.results)
    # a new candidate in a fresh DB: one pass of its own, the reference read from the cache
    assert not measured.cached.reference_computed
    assert not measured.cached.results[0].reused
    # the same candidates again: every figure from the DB, no pass at all
    assert not measured.again.reference_computed
    assert all(result.reused for result in measured.again.results)
    assert figures(measured.again) == figures(measured.first)
    assert measured.cache_file.name.endswith(f"-ctx{SHORT_CTX}-top64-tail64.npz")


def test_kl_divergence_is_exact_over_the_head_and_estimates_the_tail_from_draws() -> None:
    # p = [0.7, 0.2, 0.1], q = [0.4, 0.3, 0.3]; the head is token 0, tokens 1 and 2 drawn once
    reference = np.log(np.array([[0.7, 0.2, 0.1]]))
    candidate = np.log(np.array([[0.4, 0.3, 0.3]]))

    kld = kl_divergence(reference, candidate, np.array([0.3]), head=1)

    tail = 0.3 * (math.log(0.2 / 0.3) + math.log(0.1 / 0.3)) / 2
    assert kld == pytest.approx([0.7 * math.log(0.7 / 0.4) + tail])
    assert kl_divergence(reference, reference, np.array([0.3]), head=1) == pytest.approx([0])


def test_kept_tokens_estimate_the_full_kl_divergence_of_flat_distributions() -> None:
    """Rows as flat as a small model's (the top 64 of 4096 tokens hold well under all the
    mass) and independent noise on every token, the worst case for the draws: over 1000
    positions the estimate stays within 5% of the exact KLD."""
    rng = np.random.default_rng(7)
    reference = log_softmax(rng.normal(0, 2.0, (1000, 4096)).astype(np.float32))
    candidate = log_softmax(reference + rng.normal(0, 0.3, reference.shape).astype(np.float32))

    ids, tail_mass = kept_tokens(reference, np.random.default_rng(0))
    estimate = kl_divergence(
        np.take_along_axis(reference, ids, axis=1),
        np.take_along_axis(candidate, ids, axis=1),
        tail_mass,
    )

    exact = (np.exp(reference.astype(np.float64)) * (reference - candidate)).sum(axis=1)
    assert tail_mass.mean() > 0.2  # the tail matters here
    assert ids.shape == (1000, TOP_K + TAIL_SAMPLES)
    assert (ids[:, 0] == reference.argmax(axis=1)).all()
    assert estimate.mean() == pytest.approx(exact.mean(), rel=0.05)
    assert not np.allclose(estimate, exact, rtol=0.05)  # per position it is only an estimate


def test_chunks_are_whole_and_start_with_bos() -> None:
    chunks = chunked(list(range(10, 31)), 8, bos=1)

    assert chunks.tolist() == [[1, *range(11, 18)], [1, *range(19, 26)]]  # 5 tokens dropped
    assert chunked([5, 6, 7, 8], 4, bos=None).tolist() == [[5, 6, 7, 8]]
    with pytest.raises(QualityError, match="fewer than one chunk of 8"):
        chunked([1, 2, 3], 8, bos=None)


def model_record(model_id: str, size_bytes: int, **changes: object) -> ModelRecord:
    record = ModelRecord(
        id=model_id,
        name=model_id,
        path=Path(f"/models/{model_id}.gguf"),
        size_bytes=size_bytes,
        sha256="0" * 64,
        architecture="llama",
        quant=model_id.split("-")[-1].upper(),
        parameter_count=1_000_000,
        added_at="2026-01-01T00:00:00",
        source="file",
        licence=None,
        is_default=False,
        linked=False,
    )
    return dataclasses.replace(record, **changes)


def test_the_reference_is_the_most_precise_original_never_a_variant() -> None:
    original = model_record("m-q4_1", 562_500)
    finer_variant = model_record(
        "m-q8_0", 1_062_500, variant_of="m-q4_1", source="quantized:m-q4_1"
    )
    other_original = model_record("m-q5_k_m", 700_000)

    assert choose_reference([original, finer_variant]) == original
    assert choose_reference([original, finer_variant, other_original]) == other_original
    with pytest.raises(QualityError, match="none can stand as the reference"):
        choose_reference([finer_variant])


def stored_record(**changes: object) -> QualityRecord:
    record = QualityRecord(
        reference_model="ref0123456789abc",
        candidate_model="cand0123456789ab",
        kv_type="q8_0",
        text_hash="f" * 64,
        n_ctx=512,
        candidate="Q4_0",
        reference="model-Q8_0.gguf",
        n_tokens=1530,
        mean_kld=0.0421,
        kld_p99=0.61,
        top1_agreement=0.912,
        perplexity=9.87,
        reference_perplexity=9.41,
    )
    return dataclasses.replace(record, **changes)


def test_quality_rows_round_trip_and_travel_with_an_export(tmp_path: Path) -> None:
    with WisdomDB(tmp_path / "a.db") as db:
        saved = db.save_quality(stored_record())
        db.save_quality(stored_record(kv_type="f16", mean_kld=0.03))
        assert saved.created_at
        assert db.quality("ref0123456789abc", "cand0123456789ab", "q8_0", "f" * 64, 512) == saved
        assert db.quality("ref0123456789abc", "cand0123456789ab", "q8_0", "f" * 64, 1024) is None
        assert [r.kv_type for r in db.qualities("ref0123456789abc")] == ["f16", "q8_0"]
        document = db.export()
    with WisdomDB(tmp_path / "b.db") as db:
        added = db.import_(document)
        again = db.import_(document)
        assert added["quality"] == 2 and again["quality"] == 0
        assert db.qualities("ref0123456789abc")[1] == saved


def test_an_import_with_a_broken_quality_row_imports_nothing(tmp_path: Path) -> None:
    with WisdomDB(tmp_path / "a.db") as db:
        db.save_quality(stored_record())
        document = db.export()
    del document["quality"][0]["mean_kld"]
    with WisdomDB(tmp_path / "b.db") as db:
        with pytest.raises(WisdomError, match="not valid"):
            db.import_(document)
        assert db.qualities("ref0123456789abc") == []


def test_the_cache_is_keyed_by_model_text_and_context(tmp_path: Path) -> None:
    text = load_eval_text()
    path = reference_cache_path(tmp_path, "abc", text, 512)

    assert path != reference_cache_path(tmp_path, "abc", text.head(100), 512)
    assert path != reference_cache_path(tmp_path, "abc", text, 1024)
    assert path != reference_cache_path(tmp_path, "abd", text, 512)
