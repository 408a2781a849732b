"""`hearthside models ...` through a real argparse parser, and once through the real command."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.app.models_cli import add_models_parser
from hearthside.app.progress import ProgressLine
from hearthside.core.models.default_model import DEFAULT_MODEL_ID, GEMMA_MODEL_ID, licence_notice
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_models(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    return int(args.handler(args))


@pytest.fixture
def default_already_offered() -> None:
    """Record that this data dir had its default model once, so commands don't install it:
    most tests here are about other models and need not assemble 253 MB."""
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()


@pytest.fixture
def readable_model(tmp_path: Path) -> Path:
    return write_tiny_gguf(tmp_path / "user files" / "Tiny Chat.gguf", seed=3, loadable=True)


@pytest.mark.usefixtures("default_already_offered")
def test_add_list_default_remove_round_trip(
    readable_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_models("add", str(readable_model), "--name", "Tiny chat") == 0
    out = capsys.readouterr().out
    assert "Added tiny-chat (Tiny chat" in out
    assert "hearthside models default tiny-chat" in out

    assert run_models("default", "tiny-chat") == 0
    assert "is now the default model" in capsys.readouterr().out
    assert run_models("default") == 0
    assert capsys.readouterr().out.startswith("tiny-chat (Tiny chat")

    assert run_models("list") == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ID", "NAME", "SIZE", "QUANT", "ARCH", "DEFAULT"]
    assert table[1].split()[0] == "tiny-chat"
    assert table[1].rstrip().endswith("*")

    assert run_models("list", "--json") == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["schema"] == 1
    [model] = listing["models"]
    assert (model["id"], model["is_default"], model["architecture"]) == ("tiny-chat", True, "llama")

    assert run_models("remove", "tiny-chat") == 0
    assert "Its file was deleted." in capsys.readouterr().out
    assert not Path(model["path"]).exists()
    assert readable_model.exists()
    assert run_models("list") == 0
    assert "No models installed." in capsys.readouterr().out


@pytest.mark.usefixtures("default_already_offered")
def test_linked_model_is_left_in_place(
    readable_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_models("add", str(readable_model), "--link") == 0
    assert "Hearthside will never delete that file" in capsys.readouterr().out
    assert run_models("list") == 0
    assert "(linked)" in capsys.readouterr().out
    assert run_models("remove", "tiny-chat") == 0
    assert "Its file was left at" in capsys.readouterr().out
    assert readable_model.exists()


@pytest.mark.usefixtures("default_already_offered")
def test_remove_keep_file(readable_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_models("add", str(readable_model))
    copied = data_dir() / "models" / "tiny-chat.gguf"
    assert run_models("remove", "tiny-chat", "--keep-file") == 0
    assert "Its file was left at" in capsys.readouterr().out
    assert copied.exists()


@pytest.mark.usefixtures("default_already_offered")
def test_errors_are_one_plain_line_on_stderr_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"definitely not a model")
    assert run_models("add", str(junk)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: This is not a valid GGUF model file")

    assert run_models("remove", "nope") == 2
    assert capsys.readouterr().err == (
        "error: No model called 'nope'.\nRun `hearthside models list` to see what is installed.\n"
    )
    assert run_models("default", "../etc") == 2
    assert "No model called" in capsys.readouterr().err


@pytest.mark.usefixtures("default_already_offered")
def test_default_without_one_says_how_to_choose(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_models("default") == 1
    assert "No default model is set" in capsys.readouterr().err


@pytest.mark.slow  # assembles the real 253 MB default model
def test_first_list_installs_the_default_model_and_shows_its_licence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_models("list") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[0] == DEFAULT_MODEL_ID
    assert "Licences:" in out
    assert f"{DEFAULT_MODEL_ID}: {licence_notice()}" in out

    assert run_models("install-default") == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Installed {DEFAULT_MODEL_ID} (SmolLM2 135M Instruct (Q4_1), ")
    assert "(the default)" in out
    assert licence_notice() in out


def test_progress_line_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert ProgressLine("Copying").callback is None

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with ProgressLine("Copying") as line:
        assert line.callback is not None
        for done in (0, 1, 50, 51, 100):
            line.callback(done, 100)
    shown = [f"\rCopying: {percent:3d}%\033[K" for percent in (0, 1, 50, 51, 100)]
    assert terminal.getvalue() == "".join(shown) + "\n"


@pytest.mark.slow  # assembles the real 253 MB default model
def test_the_real_command_lists_models_as_json() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", "models", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "HEARTHSIDE_HOME": str(data_dir())},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    listed = {model["id"]: model["is_default"] for model in listing["models"]}
    assert listed == {DEFAULT_MODEL_ID: True, GEMMA_MODEL_ID: False}
