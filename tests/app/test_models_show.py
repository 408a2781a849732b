"""`hearthside models show REF [--json]` through the real argparse parser."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from hearthside.app.models_cli import add_models_parser
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.fixtures.synthetic_gguf import SyntheticShape, write_synthetic_gguf

pytestmark = pytest.mark.beside


def run_models(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    return int(args.handler(args))


def test_show_json_prints_only_the_spec_and_it_round_trips(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_synthetic_gguf(tmp_path / "moe.gguf", "tiny-moe", "Q8_0")
    assert run_models("show", str(path), "--json") == 0
    out = capsys.readouterr().out
    spec = ModelSpec.from_dict(json.loads(out))
    assert spec == spec_from_gguf(path)
    assert (spec.n_expert, spec.n_expert_used) == (8, 2)


def test_show_default_gives_a_complete_spec_of_the_default_model(
    default_model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()
        record = store.add(default_model_file, link=True, check_native=False)
        store.set_default(record.id)
    assert run_models("show", "default", "--json") == 0
    spec = ModelSpec.from_dict(json.loads(capsys.readouterr().out))
    assert spec.architecture == "gemma3" and spec.unknown == ()
    assert spec.ref == record.id

    assert run_models("show", "default") == 0
    text = capsys.readouterr().out
    assert "268M total" in text
    assert "18 (15 with a 512-token sliding window, 3 global)" in text
    assert "4 heads, 1 KV head, head dims K 256 / V 256" in text
    assert "Q4_K_M" in text and "tied to embeddings" in text
    assert "Could not be determined" not in text


def test_show_a_catalog_model_as_a_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models("show", "qwen3-30b-a3b") == 0
    text = capsys.readouterr().out
    assert text.startswith("Qwen3 30B-A3B  (qwen3moe, from catalog qwen3-30b-a3b)")
    assert "30.5B total, 3.4B active per token" in text
    assert "128 routed, 8 used per token, FFN 768 each" in text
    table = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert {"TENSORS", "embeddings", "attention", "experts", "norms"} <= set(table)
    assert "Qwen/Qwen3-30B-A3B-GGUF" in text


def test_show_lists_what_could_not_be_determined(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shape = SyntheticShape("futurenet", 2, 128, 2, 1, 256, sliding_window=64)
    path = write_synthetic_gguf(tmp_path / "future.gguf", shape, "F16")
    assert run_models("show", str(path)) == 0
    assert "Could not be determined: sliding_window." in capsys.readouterr().out


def test_show_an_unknown_model_is_an_error_with_a_hint(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_models("show", "lama-3.1-70b", "--json") == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "error: No model called 'lama-3.1-70b'. Did you mean llama-3.1-70b" in captured.err
    assert "descriptor .json" in captured.err
