"""`hearthside quality`: figures from the autotune DB, and errors in plain words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main
from hearthside.autotune.fingerprint import model_fingerprint
from hearthside.autotune.quality import DEFAULT_EVAL_CTX, load_eval_text
from hearthside.autotune.wisdom import QualityRecord, WisdomDB
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir

pytestmark = pytest.mark.beside


@pytest.fixture
def installed_default(chat_model_file: Path) -> Path:
    with ModelStore(data_dir()) as store:
        record = store.add(chat_model_file, link=True, check_native=False)
        store.set_default(record.id)
    return chat_model_file


def stored_figures(path: Path, kv_type: str, mean_kld: float) -> None:
    fingerprint = model_fingerprint(path)
    record = QualityRecord(
        reference_model=fingerprint,
        candidate_model=fingerprint,
        kv_type=kv_type,
        text_hash=load_eval_text().sha256,
        n_ctx=DEFAULT_EVAL_CTX,
        candidate="Q4_1",
        reference=path.name,
        n_tokens=1533,
        mean_kld=mean_kld,
        kld_p99=mean_kld * 8,
        top1_agreement=1 - mean_kld,
        perplexity=7.5 * (1 + mean_kld),
        reference_perplexity=7.5,
    )
    with WisdomDB() as db:
        db.save_quality(record)


def test_figures_already_measured_are_shown_without_a_pass(
    installed_default: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_figures(installed_default, "f16", 0.0)
    stored_figures(installed_default, "q8_0", 0.0125)

    code = main(["quality", "--kv", "f16,q8_0", "--json"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["reference"]["path"] == str(installed_default)
    assert not report["reference_computed"]
    assert [(r["name"], r["reused"], r["mean_kld"]) for r in report["results"]] == [
        ("Q4_1 + f16 KV", True, 0.0),
        ("Q4_1 + q8_0 KV", True, 0.0125),
    ]


def test_the_table_names_the_reference_and_each_candidate(
    installed_default: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored_figures(installed_default, "q8_0", 0.0125)

    assert main(["quality", "--kv", "q8_0"]) == 0

    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"Reference: {installed_default.name} with an f16 KV cache")
    assert "perplexity 7.500 over 1533 tokens (chunks of 1024)" in lines[0]
    assert lines[1].split() == ["candidate", "mean", "KLD", "KLD", "p99", "top-1", "PPL", "PPL",
                                "vs", "ref"]  # fmt: skip
    assert lines[2].split() == [
        "Q4_1", "+", "q8_0", "KV", "0.0125", "0.1000", "98.8%", "7.594", "+1.2%", "(stored)"
    ]  # fmt: skip


def test_an_unknown_kv_type_is_refused_before_anything_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["quality", "--kv", "f16,q3_0"])

    assert exited.value.code == 2
    assert "unknown KV-cache type q3_0; use one or more of f32, f16" in capsys.readouterr().err


def test_a_model_that_is_not_installed_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quality", "no-such-model"]) == 2
    assert "No model called 'no-such-model'" in capsys.readouterr().err


def test_a_variant_that_is_not_installed_says_how_to_make_it(
    installed_default: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["quality", "--variants", "q4_0"]) == 2

    error = capsys.readouterr().err
    assert "has no installed Q4_0 variant (installed: none)" in error
    assert "hearthside models quantize" in error and "Q4_0" in error
