"""KV-cache sensitivity per model family: a KV type measured on one model of a family stands in,
named as such, for the other models of that family until they are measured themselves."""

from __future__ import annotations

import dataclasses
import sqlite3
from pathlib import Path

import pytest

from hearthside.autotune.family_quality import kv_priors, kv_priors_for_file
from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.goals import kv_quality_text, prior_quality, quality_words
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, evaluate_config, plan
from hearthside.autotune.quality import Candidate, load_eval_text, measure_quality
from hearthside.autotune.tune_quality import kv_quality
from hearthside.autotune.wisdom import WISDOM, QualityRecord, WisdomDB
from hearthside.core.engine.config import CHAT_CONTEXT, EngineConfig
from hearthside.core.models.catalog import catalog_spec
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile
from tests.autotune.test_planner import machine
from tests.gguf_samples import quantize_file

pytestmark = pytest.mark.beside

SHORT_CTX = 128
SHORT_TEXT_CHARS = 700  # one chunk of 128 SmolLM2 tokens: 63 positions scored


def kv_row(model: str, kv_type: str, mean_kld: float, **changes: object) -> QualityRecord:
    """A KV type measured on a model's own file (the shape the tuner and `hearthside quality
    --kv` store): reference and candidate are the same file."""
    record = QualityRecord(
        reference_model=model,
        candidate_model=model,
        kv_type=kv_type,
        text_hash="f" * 64,
        n_ctx=512,
        candidate="Q4_K_M",
        reference="gemma-3-270m-Q4_K_M.gguf",
        n_tokens=2000,
        mean_kld=mean_kld,
        kld_p99=mean_kld * 10,
        top1_agreement=0.8,
        perplexity=20.0,
        reference_perplexity=16.0,
        architecture="gemma3",
    )
    return dataclasses.replace(record, **changes)


def test_a_family_measurement_stands_in_for_another_model_and_says_where_it_is_from(
    tmp_path: Path,
) -> None:
    with WisdomDB(tmp_path / "wisdom.db") as db:
        db.save_quality(kv_row("gemma270m", "q4_0", 0.30))  # Gemma 3 270M, measured here
        db.save_quality(kv_row("gemma270m", "q8_0", 0.025))
        db.save_quality(kv_row("smollm2", "q4_0", 0.087, architecture="llama"))

        other_gemma = kv_priors(db, "gemma3", "gemma1b")
        qwen = kv_priors(db, "qwen3", "qwen06b")
        own = kv_priors(db, "gemma3", "gemma270m")

    q4_0 = other_gemma["q4_0"]
    assert q4_0.source == "family" and not q4_0.measured
    assert q4_0.mean_kld == 0.30 and q4_0.measured_on == "gemma-3-270m"
    assert kv_quality_text("q4_0", q4_0) == (
        "q4_0 KV: KLD 0.30 measured on gemma-3-270m (same family, gemma3)"
    )
    assert quality_words(q4_0) == "KLD ~0.30 (measured on gemma-3-270m, gemma3 family)"
    assert other_gemma["q8_0"].mean_kld == 0.025
    assert q4_0.to_dict()["source"] == "family" and q4_0.to_dict()["family"] == "gemma3"
    assert qwen == {}  # another family learns nothing from gemma3 or llama: global priors
    assert own["q4_0"].source == "measured"  # the model's own figure, not its family's
    assert kv_quality_text("q4_0", prior_quality("q4_0")) == (
        "q4_0 KV: KLD 0.20 (a prior, not measured yet)"
    )


def test_own_measurement_beats_the_family_and_the_family_figure_is_its_worst(
    tmp_path: Path,
) -> None:
    with WisdomDB(tmp_path / "wisdom.db") as db:
        db.save_quality(kv_row("gemma270m", "q4_0", 0.30))
        db.save_quality(kv_row("gemma1b", "q4_0", 0.12, reference="gemma-3-1b-it-Q8_0.gguf"))
        # gemma-3-4b measured twice: its figure over more tokens is the one that counts
        db.save_quality(kv_row("gemma4b", "q4_0", 0.90, n_tokens=100, n_ctx=128))
        db.save_quality(kv_row("gemma4b", "q4_0", 0.10, reference="gemma-3-4b-it.gguf"))

        unmeasured = kv_priors(db, "gemma3", "gemma12b")["q4_0"]
        measured_itself = kv_priors(db, "gemma3", "gemma1b")["q4_0"]

    assert (unmeasured.source, unmeasured.mean_kld) == ("family", 0.30)
    assert unmeasured.measured_on == "gemma-3-270m"  # the highest of the family's figures
    assert (measured_itself.source, measured_itself.mean_kld) == ("measured", 0.12)


def only_a_q8_0_cache_fits(spec: ModelSpec, n_ctx: int) -> HardwareProfile:
    """A CPU-only machine with memory for `spec` and an n_ctx q8_0 KV cache, not an f16 one."""
    roomy = machine(memory_gb=32)

    def used(kv: str) -> int:
        config = EngineConfig(spec.name, n_ctx=n_ctx, type_k=kv, type_v=kv, flash_attn=True)
        candidate = evaluate_config(spec, roomy, config, free_margin_bytes=0)
        return sum(device.used_bytes for device in candidate.devices)

    ram = DEFAULT_FREE_MARGIN_BYTES + (used("q8_0") + used("f16")) // 2
    memory = dataclasses.replace(roomy.memory, total_bytes=ram, available_bytes=ram)
    return dataclasses.replace(roomy, memory=memory)


def test_the_family_figures_decide_what_a_cache_too_big_for_memory_becomes() -> None:
    """Memory forces a quantized cache at the chat's context: a family whose quantized caches
    stay within the budget gets the finest one that fits (never coarser than memory needs),
    a family they hurt keeps full precision at a shorter context instead."""
    spec = catalog_spec("llama-3.1-8b")
    profile = only_a_q8_0_cache_fits(spec, CHAT_CONTEXT)
    careless_family = {
        kv: dataclasses.replace(
            prior_quality(kv), mean_kld=0.01, source="family", measured_on="Llama-3.2-1B",
            family="llama",
        )
        for kv in ("q8_0", "q4_0")
    }  # fmt: skip
    sensitive_family = {
        kv: dataclasses.replace(
            prior_quality(kv), mean_kld=0.4, source="family", measured_on="x", family="llama"
        )
        for kv in ("q8_0", "q4_0")
    }

    by_priors = plan(spec, profile, goal="fastest")
    careless = plan(spec, profile, goal="fastest", kv_priors=careless_family)
    sensitive = plan(spec, profile, goal="fastest", kv_priors=sensitive_family)

    assert (by_priors.config.type_k, by_priors.config.n_ctx) == ("q8_0", CHAT_CONTEXT)
    assert (careless.config.type_k, careless.config.n_ctx) == ("q8_0", CHAT_CONTEXT)
    kv_reason = next(r for r in careless.reasons if r.setting == "type_k/type_v")
    assert "q8_0 KV: KLD 0.010 measured on Llama-3.2-1B (same family, llama)" in kv_reason.why
    assert "does not fit this context in memory" in kv_reason.why
    # both quantized caches hurt this family: full precision, at the shorter context that fits
    assert sensitive.config.type_k == "f16" and sensitive.config.n_ctx < CHAT_CONTEXT


@pytest.mark.slow  # one reference pass and one q4_0 pass over 128 tokens, one re-quantization
def test_a_kv_type_measured_by_the_engine_is_the_prior_of_another_file_of_the_family(
    chat_model_file: Path, tmp_path: Path
) -> None:
    text = load_eval_text().head(SHORT_TEXT_CHARS)
    q8_0 = quantize_file(chat_model_file, tmp_path / "smollm2-q8_0.gguf", "Q8_0")
    with WisdomDB(tmp_path / "wisdom.db") as db:
        reference = Candidate(chat_model_file, "Q4_1")
        report = measure_quality(
            reference,
            [Candidate(chat_model_file, "Q4_1", "q4_0")],
            db,
            text=text,
            n_ctx=SHORT_CTX,
            cache_dir=tmp_path,
        )
        measured = report.results[0].record
        # the other file has not been measured: the tuner, out of time, takes the family's
        tuned = kv_quality(
            q8_0,
            {"f16", "q4_0"},
            db,
            rigor="quick",
            seconds_left=lambda: 0.0,
            prefill_tps=500.0,
            text=text,
            n_ctx=SHORT_CTX,
            cache_dir=tmp_path,
        )
        planned = kv_priors_for_file(db, q8_0)

    assert measured.architecture == "llama" and measured.mean_kld > 0
    family = tuned.of("q4_0")
    assert family.source == "family" and family.mean_kld == measured.mean_kld
    assert family.measured_on == "SmolLM2-135M-Instruct"  # SmolLM2-135M-Instruct.Q4_1.gguf
    (note,) = tuned.notes
    assert "q4_0 KV not measured" in note.reason
    assert "(same family, llama) stands in" in note.reason
    assert planned["q4_0"] == family and model_fingerprint(q8_0) != measured.reference_model
    assert tuned.of("q8_0") == prior_quality("q8_0")  # nobody in the family measured q8_0


def test_rows_from_before_families_are_named_once_their_model_is_read(tmp_path: Path) -> None:
    path = tmp_path / "wisdom.db"
    with WisdomDB(path) as db:
        db.save_quality(kv_row("gemma270m", "q4_0", 0.30, architecture=""))
        document = db.export()
    with WisdomDB(path) as db:
        assert kv_priors(db, "gemma3", "gemma1b") == {}  # no family known yet
        kv_priors(db, "gemma3", "gemma270m")  # the tuner or the plan read gemma270m's file
        assert kv_priors(db, "gemma3", "gemma1b")["q4_0"].source == "family"

    del document["quality"][0]["architecture"]  # an export from before schema 6
    with WisdomDB(tmp_path / "other.db") as db:
        assert db.import_(document)["quality"] == 1
        assert db.qualities("gemma270m")[0].architecture == ""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == WISDOM.schema_version
