"""`hearthside tune`: measured settings and their quality, stored, compared with llama.cpp's
and llama-cpp-python's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main
from hearthside.app.tune_cli import _event_text
from hearthside.autotune import tuner
from hearthside.autotune.tuner import TuneEvent
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import CHAT_CONTEXT
from tests.fixtures.synthetic_gguf import write_synthetic_gguf


@pytest.mark.usefixtures("repeat_noise_ignored")
def test_tuning_a_model_file_prints_and_stores_the_winner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the defaults and the planner's pick only: the run ends when they are measured, with
    # speculation and the audit, well within a budget that leaves room for a loaded machine
    monkeypatch.setattr(
        tuner, "candidates", lambda base, _profile: [base, base.with_changes(type_k="q8_0")]
    )
    model = write_synthetic_gguf(tmp_path / "tiny.gguf", "tiny-dense", "Q8_0")
    assert main(["tune", str(model), "--budget-s", "60", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["best"]["outcome"] == "ok" and result["best"]["decode_tps"] > 0
    baseline, constructor = result["baseline"], result["llama_cpp_python_defaults"]
    assert baseline["config"]["flash_attn"] and baseline["config"]["n_ctx"] == CHAT_CONTEXT
    assert constructor["config"]["n_ctx"] == 512 and not constructor["config"]["flash_attn"]
    assert result["speedup_over_defaults"] > 0
    assert result["speedup_over_llama_cpp_python_defaults"] > 0
    # every measured run says its quality against the file with an f16 KV cache
    assert result["quality_reference"] == "tiny.gguf with an f16 KV cache"
    qualities = {run["config"]["type_k"]: run["quality"] for run in result["runs"]}
    assert qualities["f16"]["source"] == "reference" and qualities["f16"]["mean_kld"] == 0.0
    q8_0 = qualities["q8_0"]
    assert q8_0["source"] == "measured", result["notes"]
    assert q8_0["mean_kld"] >= 0.0 and 0.0 < q8_0["top1_agreement"] <= 1.0
    assert q8_0["perplexity"] > 1.0
    workloads = [decision["workload"] for decision in result["speculation"]]
    assert workloads, "speculation is measured on the winner, per kind of prompt"
    with WisdomDB() as wisdom:
        saved = {row["model"] for row in wisdom.export()["defaults"]}
    model_key = result["key"]["model"]
    assert saved == {model_key} | {f"{model_key}/speculative/{w}" for w in workloads}

    assert main(["tune", str(model), "--budget-s", "5"]) == 0  # the runs above answer
    text = capsys.readouterr().out
    assert "<- chosen" in text and "llama-cpp-python defaults" in text
    assert "llama.cpp defaults" in text and "KLD" in text
    assert "Speculative decoding, measured per kind of prompt:" in text


def test_the_progress_line_says_when_a_setting_was_measured_beside_busy_programs() -> None:
    config = {"n_threads": 2, "flash_attn": True, "n_ubatch": 512, "type_k": "f16"}
    note = "other programs kept 1.2 cores busy meanwhile: this speed may read low"
    busy = _event_text(TuneEvent("measured", 1, 4, config, 40.0, 21.0, 300.0, note))
    assert busy == f"[1/4] measured: 2 threads, flash on, ubatch 512, KV f16 → 21.0 tok/s ({note})"
    quiet = _event_text(TuneEvent("measured", 2, 4, config, 40.0, 21.0, 300.0))
    assert quiet.endswith("→ 21.0 tok/s")
