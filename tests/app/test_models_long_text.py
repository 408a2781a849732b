"""Issue 36 item 5: text from a model file is escaped *and* shortened before it is printed.

A GGUF string may be 16 MiB; `models list` once printed 117 MB for one `general.name` made of
control characters (each escaped to four). Real files written with the `gguf` package, the
real registry and the real argparse commands.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hearthside.app.models_cli import add_models_parser
from hearthside.core.display_text import ELLIPSIS, MAX_SHOWN_CHARS, shortened
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.core.models.malformed_gguf import T, write_small_llama

pytestmark = pytest.mark.beside

HUGE_NAME = "Hostile" + "\x01" * (4 << 20)  # 4 MiB of control characters: 16 MiB escaped
# A whole printed field, escaped: each kept character becomes at most 6 ("\u202e").
MAX_FIELD_PRINTED = 6 * MAX_SHOWN_CHARS


def run_models(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="hearthside")
    add_models_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["models", *argv])
    return int(args.handler(args))


@pytest.fixture
def hostile_file(tmp_path: Path) -> Path:
    return write_small_llama(
        tmp_path / "hostile.gguf", metadata={"general.name": (HUGE_NAME, T.STRING)}
    )


@pytest.fixture
def registered(hostile_file: Path) -> str:
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()
        record = store.add(hostile_file, licence="L" * 100_000, check_native=False)
    assert len(record.name) == MAX_SHOWN_CHARS  # the registry keeps a readable name
    return record.id


def test_shortened_keeps_short_text_and_cuts_long_text_to_the_limit() -> None:
    assert shortened("Gemma 3") == "Gemma 3"
    assert shortened("x" * MAX_SHOWN_CHARS) == "x" * MAX_SHOWN_CHARS
    cut = shortened("x" * (MAX_SHOWN_CHARS + 1))
    assert len(cut) == MAX_SHOWN_CHARS and cut.endswith(ELLIPSIS)
    assert shortened("abcdef", 4) == "abc" + ELLIPSIS


def test_models_list_prints_each_field_shortened(
    registered: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_models("list") == 0
    out = capsys.readouterr().out
    assert len(out) < 4 * MAX_FIELD_PRINTED  # the name, the licence, the table's frame
    assert "Hostile\\x01\\x01" in out and ELLIPSIS in out
    assert "L" * MAX_SHOWN_CHARS not in out


def test_models_show_of_the_file_prints_its_name_shortened(
    hostile_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()
    assert run_models("show", str(hostile_file)) == 0
    out = capsys.readouterr().out
    first_line = out.splitlines()[0]
    assert first_line.startswith("Hostile\\x01")
    assert len(first_line) < 2 * MAX_FIELD_PRINTED
    assert len(out) < 4 * MAX_FIELD_PRINTED + 4000  # the facts and the tensor table
