"""The tuner's quality phase: each KV-cache type the candidates use, measured against the tuned
file with an f16 KV cache, stored and reused; one that does not fit the time keeps its prior."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.autotune.goals import KLD_BUDGET, RunQuality, prior_quality
from hearthside.autotune.quality import load_eval_text
from hearthside.autotune.tune_quality import kv_quality
from hearthside.autotune.wisdom import WisdomDB

pytestmark = pytest.mark.beside

SHORT_CTX = 128
SHORT_TEXT_CHARS = 700  # one chunk of 128 SmolLM2 tokens


@pytest.mark.slow  # a reference pass and one q8_0 pass over 128 tokens
def test_a_kv_type_is_measured_once_then_reused_and_one_out_of_time_keeps_its_prior(
    chat_model_file: Path, tmp_path: Path
) -> None:
    options = {
        "rigor": "quick",
        "prefill_tps": 500.0,
        "text": load_eval_text().head(SHORT_TEXT_CHARS),
        "n_ctx": SHORT_CTX,
        "cache_dir": tmp_path,
    }
    heard: list[tuple[str, RunQuality]] = []
    with WisdomDB(tmp_path / "wisdom.db") as db:
        first = kv_quality(
            chat_model_file,
            {"f16", "q8_0"},
            db,
            seconds_left=lambda: 600.0,
            listener=lambda kv, quality: heard.append((kv, quality)),
            **options,
        )
        q8_0 = first.of("q8_0")
        assert q8_0.source == "measured" and 0.0 < q8_0.mean_kld < KLD_BUDGET
        assert q8_0.top1_agreement is not None and 0.8 < q8_0.top1_agreement <= 1.0
        assert first.of("f16").source == "reference" and first.of("f16").mean_kld == 0.0
        assert heard == [("q8_0", q8_0)] and not first.notes
        assert "SmolLM2" in first.reference and "f16" in first.reference

        # no time left: what the DB holds needs none; q4_0 would need two passes' worth
        second = kv_quality(
            chat_model_file, {"f16", "q8_0", "q4_0"}, db, seconds_left=lambda: 0.0, **options
        )
    assert second.of("q8_0") == q8_0
    assert second.of("q4_0") == prior_quality("q4_0")
    (note,) = second.notes
    assert note.phase == "quality" and "q4_0 KV not measured" in note.reason
