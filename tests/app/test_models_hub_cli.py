"""`hearthside models search|pull|quantize` against a real local hub, through argparse."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.app.models_cli import add_models_parser
from hearthside.core.models.default_model import GEMMA_MODEL_SHA256
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.units import format_bytes
from tests.hub_server import HubServer, write_llama_gguf

pytestmark = pytest.mark.beside

GEMMA_REPO = "acme/gemma-3-270m-GGUF"
GEMMA_FILE = "gemma-3-270m-Q4_K_M.gguf"
TINY_REPO = "acme/tiny-GGUF"


def run_models(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    return int(args.handler(args))


class Terminal(io.StringIO):
    """Typed answers on a stdin that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def default_already_offered() -> None:
    """`models list` must not assemble the bundled default model in these tests."""
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("tiny-hub")
    small = write_llama_gguf(folder / "Tiny-F32.gguf", hidden=128, feed_forward=256, seed=2)
    large = write_llama_gguf(folder / "Tiny-Big-F32.gguf", hidden=256, seed=3)
    return small + large


@pytest.fixture
def hub(tiny_files: list[Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer() as server:
        for path in tiny_files:
            server.state.add_file(TINY_REPO, path.name, path)
        server.state.repos[TINY_REPO].downloads = 42
        monkeypatch.setenv("HEARTHSIDE_HUB_ENDPOINT", server.url)
        monkeypatch.setenv("HEARTHSIDE_HUB_ALLOW_INSECURE_LOOPBACK", "1")
        yield server


def test_search_prints_a_table_and_json(hub: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models("search", "tiny") == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["REPO", "DOWNLOADS", "LIKES", "UPDATED"]
    assert lines[1].split() == [TINY_REPO, "42", "0", "2025-08-14"]

    assert run_models("search", "tiny", "--json", "--limit", "5") == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["schema"] == 1
    assert payload["results"][0]["repo"] == TINY_REPO
    assert hub.state.requests[-1].query["limit"] == ["5"]


def test_pull_asks_which_file_on_a_terminal(
    hub: HubServer,
    tiny_files: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(sys, "stdin", Terminal("7\n2\n"))

    assert run_models("pull", TINY_REPO) == 0

    out = capsys.readouterr().out
    assert "1  Tiny-F32.gguf" in out and "2  Tiny-Big-F32.gguf" in out  # smallest first
    assert "Type a number from 1 to 2." in out
    assert "Added tiny-big-f32 (Hub Test Llama 3 (F32)," in out
    with ModelStore(data_dir()) as store:
        [record] = store.list()
    assert record.path.read_bytes() == tiny_files[1].read_bytes()


def test_pull_without_a_terminal_needs_a_choice(
    hub: HubServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))

    assert run_models("pull", TINY_REPO) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {TINY_REPO} has 2 GGUF files; say which one to download.")
    assert "--quant" in err and "Tiny-Big-F32.gguf" in err
    assert hub.state.file_requests() == []

    assert run_models("pull", f"{TINY_REPO}:Tiny-F32.gguf", "--json") == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["model"]["source"] == f"hub:{TINY_REPO}/Tiny-F32.gguf"


def test_pull_refuses_bad_references(hub: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models("pull", f"{TINY_REPO}:../../etc/evil.gguf") == 2
    assert "not a file name Hearthside downloads" in capsys.readouterr().err
    assert run_models("pull", "not-a-repo") == 2
    assert "not a hub repo id" in capsys.readouterr().err
    assert run_models("pull", f"{TINY_REPO}:Missing.gguf") == 2
    assert "There is no GGUF model file Missing.gguf" in capsys.readouterr().err
    assert run_models("pull", TINY_REPO, "--quant", "Q4_K_M") == 2
    assert "Available: F32." in capsys.readouterr().err
    assert hub.state.file_requests() == []


def test_quantize_with_an_unknown_type_lists_the_valid_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_models("quantize", "default", "Q9_Z") == 2
    err = capsys.readouterr().err
    assert "'Q9_Z' is not a quantization type" in err
    assert "Q8_0, Q6_K, Q5_K_M" in err


@pytest.mark.slow  # serves, downloads and re-quantizes the real 253 MB default model
def test_pull_the_real_model_then_quantize_default_q4_0(
    hub: HubServer, default_model_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hub.state.add_file(GEMMA_REPO, GEMMA_FILE, default_model_file)

    assert run_models("pull", GEMMA_REPO, "--quant", "q4_k_m", "--yes") == 0
    size = format_bytes(default_model_file.stat().st_size)  # 253 × 10^6 bytes, in MiB
    assert f"Added gemma-3-270m-q4_k_m (Gemma 3 270m (Q4_K_M), {size})." in capsys.readouterr().out
    assert run_models("default", "gemma-3-270m-q4_k_m") == 0

    assert run_models("quantize", "default", "Q4_0") == 0
    out = capsys.readouterr().out
    assert (
        " MiB), a Q4_0 variant of" in out
        and "Added gemma-3-270m-q4_0 (Gemma 3 270m (Q4_0), " in out
    )

    assert run_models("list") == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0] == ["ID", "NAME", "SIZE", "QUANT", "ARCH", "DEFAULT"]
    assert rows[2][0] == "gemma-3-270m-q4_0"
    assert "(variant of gemma-3-270m-q4_k_m)" in " ".join(rows[2])
    assert "Q4_0" in rows[2]
    assert run_models("list", "--json") == 0
    models = {m["id"]: m for m in json.loads(capsys.readouterr().out)["models"]}
    assert models["gemma-3-270m-q4_k_m"]["sha256"] == GEMMA_MODEL_SHA256
    assert models["gemma-3-270m-q4_k_m"]["source"] == f"hub:{GEMMA_REPO}/{GEMMA_FILE}"
    assert models["gemma-3-270m-q4_0"]["variant_of"] == "gemma-3-270m-q4_k_m"


def test_the_real_command_searches(hub: HubServer) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "models", "search", "tiny", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HEARTHSIDE_HOME": str(data_dir())},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["results"][0]["repo"] == TINY_REPO
