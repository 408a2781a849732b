"""The window says when it loads less than was asked for: a context beyond the one the model
was trained on is capped, and the message bar (and the model's tooltip) says so."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtWidgets import QApplication

from tests.app.gui.window_helpers import open_window

pytestmark = [pytest.mark.gui, pytest.mark.beside]


def test_the_window_says_why_it_loads_a_shorter_context(
    qapp: QApplication, hearthside_home: Path, default_model_file: Path
) -> None:
    with open_window(hearthside_home, str(default_model_file), n_ctx=131072) as window:
        loaded = window.bridge.loaded_model
        assert loaded is not None and loaded.config.n_ctx == 32768  # Gemma 3 270M's own
        said = "The model was trained on 32768 tokens, so the context is 32768, not 131072."
        assert window.message_bar.text.startswith(said)
        assert said in window.model_label.toolTip()
