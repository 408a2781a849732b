"""`hearthside plan`: a model's settings on this or another machine, as text or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hearthside.app.cli import main

SPECS = Path(__file__).parents[1] / "fixtures" / "probe" / "specs"


def test_a_catalog_model_on_a_what_if_machine_prints_a_json_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(
        ["plan", "llama-3.1-70b", "--hardware-spec", str(SPECS / "two-rtx-3090.json"), "--json"]
    )
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["fits"] and plan["config"]["n_gpu_layers"] == -1
    assert {device["device"] for device in plan["devices"]} == {"CPU", "CUDA0", "CUDA1"}
    assert plan["speed"]["decode_tps"] > 0 and plan["reasons"]


def test_a_descriptor_file_plans_without_a_model_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    descriptor = tmp_path / "my-moe.json"
    descriptor.write_text(
        json.dumps(
            {
                "schema": 1,
                "name": "My 30B-A3B",
                "architecture": "qwen3moe",
                "total_params": 30532122624,
                "layers": 48,
                "hidden_size": 2048,
                "heads": 32,
                "kv_heads": 4,
                "head_dim": 128,
                "experts": 128,
                "experts_used": 8,
                "expert_ffn_size": 768,
                "context": 40960,
                "vocab_size": 151936,
                "quant": "Q4_K_M",
            }
        )
    )
    code = main(["plan", str(descriptor), "--hardware-spec", str(SPECS / "mac-m3-ultra.json")])
    text = capsys.readouterr().out
    assert code == 0
    assert text.startswith("My 30B-A3B: fits")
    assert "MTL0" in text and "Why" in text


def test_the_default_model_plans_for_this_machine(
    default_model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["plan", str(default_model_file), "--goal", "longest-context", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0
    assert plan["config"]["n_ctx"] == 32768  # the model's trained context
    assert plan["config"]["type_k"] == "f16"  # fits at full precision, so it stays


def test_an_unknown_model_says_how_to_name_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "no-such-model"]) == 2
    err = capsys.readouterr().err
    assert "no-such-model" in err and "catalog id" in err


def test_a_model_bigger_than_memory_is_planned_to_stream_from_disk(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hardware = tmp_path / "small.json"
    hardware.write_text(json.dumps({"schema": 1, "gpus": [{"model": "t4"}], "memory_gb": 32}))
    code = main(["plan", "deepseek-v3", "--hardware-spec", str(hardware), "--ctx", "4096"])
    out = capsys.readouterr().out
    assert code == 0
    assert "streams from disk" in out and "bound by disk" in out
    assert "Advice" in out
