"""A model whose `general.name` is a megabyte loads and answers like any other (issue 36).

llama.cpp logs the name whole while loading; a log parser that backtracked over that line
hung every chat, tune and serve of such a file although it passed the validator and
`models add`. Both files here are the same real one-layer llama model, one with a normal
name and one with a 1 MB name, driven through the real CLI in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hearthside.core.display_text import ELLIPSIS, MAX_SHOWN_CHARS
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.gguf_samples import write_tiny_gguf

LONG_NAME = "N" * (1024 * 1024)
CLI = [sys.executable, "-m", "hearthside.app.cli"]
TIMEOUT_S = 240


def hearthside(*argv: str) -> tuple[str, float]:
    """stdout of a successful `hearthside ...`, and the seconds it took."""
    started = time.monotonic()
    result = subprocess.run(
        [*CLI, *argv], capture_output=True, text=True, timeout=TIMEOUT_S, env=dict(os.environ)
    )
    took_s = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout, took_s


def add_and_chat(model: Path) -> tuple[str, float]:
    """The model's id once added, and the seconds `models add` plus one chat took."""
    _, add_s = hearthside("models", "add", str(model))
    listing, _ = hearthside("models", "list", "--json")
    (model_id,) = [
        m["id"] for m in json.loads(listing)["models"] if Path(m["path"]).stem == model.stem
    ]
    answer, chat_s = hearthside(
        "chat", "--model", model_id, "--prompt", "hi", "--max-tokens", "8", "--temperature", "0"
    )
    assert answer.strip(), "the chat printed no answer"
    return model_id, add_s + chat_s


@pytest.mark.slow
def test_a_megabyte_name_loads_and_answers_as_fast_as_a_normal_one(tmp_path: Path) -> None:
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()  # no 253 MB default model for this test
    plain = write_tiny_gguf(tmp_path / "plain-name.gguf", seed=5, loadable=True)
    long = write_tiny_gguf(tmp_path / "long-name.gguf", seed=5, loadable=True, name=LONG_NAME)

    _, plain_s = add_and_chat(plain)
    long_id, long_s = add_and_chat(long)

    assert long_s < 3 * plain_s + 10, f"{long_s:.1f} s with a 1 MB name, {plain_s:.1f} s without"

    listing, _ = hearthside("models", "list")
    assert len(listing) < 4 * MAX_SHOWN_CHARS  # two rows, each name cut to what a person reads
    assert "N" * MAX_SHOWN_CHARS not in listing and "N" * 100 + ELLIPSIS in listing
    shown, _ = hearthside("models", "show", long_id)
    assert len(shown) < 20 * MAX_SHOWN_CHARS
    assert "N" * MAX_SHOWN_CHARS not in shown and ELLIPSIS in shown
