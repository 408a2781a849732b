"""`hearthside tune`: measured settings, stored, compared with llama-cpp-python's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main
from hearthside.autotune import tuner
from hearthside.autotune.wisdom import WisdomDB
from tests.fixtures.synthetic_gguf import write_synthetic_gguf


def test_tuning_a_model_file_prints_and_stores_the_winner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the defaults and the planner's pick only: the run ends when they are measured, with
    # speculation and the audit, well within a budget that leaves room for a loaded machine
    monkeypatch.setattr(tuner, "candidates", lambda base, _profile: [base])
    model = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    assert main(["tune", str(model), "--budget-s", "60", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["best"]["outcome"] == "ok" and result["best"]["decode_tps"] > 0
    assert result["baseline"]["config"]["n_ctx"] == 512
    assert result["speedup_over_defaults"] > 0
    workloads = [decision["workload"] for decision in result["speculation"]]
    assert workloads, "speculation is measured on the winner, per kind of prompt"
    with WisdomDB() as wisdom:
        saved = {row["model"] for row in wisdom.export()["defaults"]}
    model_key = result["key"]["model"]
    assert saved == {model_key} | {f"{model_key}/speculative/{w}" for w in workloads}

    assert main(["tune", str(model), "--budget-s", "5"]) == 0  # the runs above answer
    text = capsys.readouterr().out
    assert "<- chosen" in text and "llama-cpp-python defaults" in text
    assert "Speculative decoding, measured per kind of prompt:" in text
