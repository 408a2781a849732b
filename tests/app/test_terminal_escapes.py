"""Strings from a model file never steer the terminal: `models add/list/show` escape them.

A GGUF's `general.name` is written by whoever made the file. Printed raw, `ESC[2J` clears the
screen, `ESC]0;…BEL` sets the window title and a newline adds a fake row to the table.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.app.cli_support import printable
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

HOSTILE_NAME = "Evil\x1b[2J\x1b]0;pwned\x07 a\nfake row\r\u202egnp.exe\x9b"
STEERING = ("\x1b", "\x07", "\r", "\u202e", "\x9b")


@pytest.fixture
def hostile_model(tmp_path: Path, hearthside_home: Path) -> Path:
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()  # no 253 MB default model for this test
    return write_tiny_gguf(tmp_path / "hostile.gguf", seed=7, loadable=True, name=HOSTILE_NAME)


def hearthside(*argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.app.cli", *argv],
        capture_output=True, text=True, timeout=120, env=dict(os.environ),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def assert_nothing_steers(text: str) -> None:
    for character in STEERING:
        assert character not in text
    assert "a\nfake row" not in text
    assert "\\x1b[2J" in text and "\\nfake row" in text  # shown, harmlessly, as escapes


def test_models_add_list_and_show_escape_the_name(hostile_model: Path) -> None:
    added = hearthside("models", "add", str(hostile_model))
    assert_nothing_steers(added)
    assert len(added.splitlines()) == 2  # "Added …" and the hint to make it the default

    listing = hearthside("models", "list")
    assert_nothing_steers(listing)
    table = listing.splitlines()
    assert len(table) == 2  # the header and the one model: no fake row
    assert table[0].split()[:2] == ["ID", "NAME"]
    model_id = table[1].split()[0]

    shown = hearthside("models", "show", model_id)
    assert_nothing_steers(shown)
    first_line = shown.splitlines()[0]
    assert first_line.startswith("Evil\\x1b[2J\\x1b]0;pwned\\x07 a\\nfake row\\r\\u202egnp.exe")


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("\x1b]0;pwned\x07", "\\x1b]0;pwned\\x07"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
        ("\u202eevil\u2066\u200f\u2028", "\\u202eevil\\u2066\\u200f\\u2028"),
        ("Llama 3.1 8B Instruct — Q4_K_M ✓", "Llama 3.1 8B Instruct — Q4_K_M ✓"),
    ],
    ids=["csi", "osc", "line-breaks", "c0-c1", "bidi", "ordinary-unicode"],
)
def test_printable_escapes_only_what_steers_a_terminal(raw: str, shown: str) -> None:
    assert printable(raw) == shown
