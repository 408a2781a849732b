"""Issue 36 items 1d and 3: the size of a model file is checked against what it holds, and the
bytes `models add` registers are the bytes it checked.

A sparse 64 GiB file with a small model's header once took 150 s of hashing zeros and was
registered as a 68.7 GB model; a source swapped between the native check and the copy got a
file registered that `models add` refuses when given directly. Every file here is a real GGUF
(written with the `gguf` package, or the real default models), loaded by the real llama.cpp
in a child process where the test gets that far.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.errors import EngineError, ModelFileError
from hearthside.core.models.child_check import check_loads_in_child
from hearthside.core.models.gguf_validator import (
    MAX_TRAILING_BYTES,
    GGUFValidationError,
    tensor_data_end,
    validate_gguf,
)
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from tests.core.models.malformed_gguf import ARCH, T, write_small_llama
from tests.fixtures.synthetic_gguf import SHAPES, write_synthetic_gguf

GIB = 1 << 30
BAD_KV_HEADS = {f"{ARCH}.attention.head_count_kv": (3, T.UINT32)}  # 4 heads: llama.cpp refuses


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


def data_end(path: Path) -> int:
    info = validate_gguf(path)
    return tensor_data_end(info.tensors, info.data_offset, info.alignment)


def nothing_registered(store: ModelStore) -> bool:
    return store.list() == [] and list(store.models_dir.glob("*.gguf*")) == []


# --- trailing bytes --------------------------------------------------------------------------


@pytest.mark.parametrize("link", [False, True], ids=["copy", "link"])
def test_a_sparse_64_gib_file_is_refused_at_once_and_nothing_is_registered(
    store: ModelStore, tmp_path: Path, link: bool
) -> None:
    padded = write_small_llama(tmp_path / "padded.gguf")
    os.truncate(padded, 64 * GIB)  # sparse: no disk used, but 64 GiB to hash or copy
    started = time.monotonic()
    with pytest.raises(GGUFValidationError) as refused:
        store.add(padded, link=link)
    took_s = time.monotonic() - started
    assert took_s < 1.0
    message = refused.value.message
    assert f"is {64 * GIB:,} bytes long, but its model data end at byte" in message
    assert "belong to no part of the model" in message
    assert "Download the model again" in (refused.value.hint or "")
    assert nothing_registered(store)


def test_the_tolerance_is_exactly_max_trailing_bytes(tmp_path: Path) -> None:
    path = write_small_llama(tmp_path / "m.gguf")
    end = data_end(path)
    os.truncate(path, end + MAX_TRAILING_BYTES)
    validate_gguf(path)
    os.truncate(path, end + MAX_TRAILING_BYTES + 1)
    with pytest.raises(GGUFValidationError, match=f"the other {MAX_TRAILING_BYTES + 1:,} bytes"):
        validate_gguf(path)


def test_real_files_end_within_one_alignment_step_of_their_data(
    chat_model_file: Path, default_model_file: Path, tmp_path: Path
) -> None:
    files = [
        chat_model_file,
        default_model_file,
        write_small_llama(tmp_path / "small.gguf"),
        write_small_llama(tmp_path / "vocab-only.gguf", weights=False),
        write_synthetic_gguf(tmp_path / "dense.gguf", SHAPES["tiny-dense"], "Q8_0"),
        write_synthetic_gguf(tmp_path / "moe.gguf", SHAPES["tiny-moe"], "F16"),
    ]
    for path in files:
        info = validate_gguf(path)
        assert info.file_size - data_end(path) <= info.alignment, path.name


# --- the bytes registered are the bytes checked ----------------------------------------------


@pytest.mark.slow
def test_a_source_swapped_after_its_first_look_is_checked_as_copied_and_not_added(
    store: ModelStore, tmp_path: Path
) -> None:
    source = write_small_llama(tmp_path / "model.gguf")
    # Same size, same layout, one number llama.cpp refuses (4 heads, 3 KV heads).
    swapped_in = write_small_llama(tmp_path / "swapped-in.gguf", metadata=BAD_KV_HEADS)
    assert swapped_in.stat().st_size == source.stat().st_size
    validate_gguf(swapped_in)  # the pure-Python checks cannot tell: only the native load can

    def swap_when_the_copy_starts(done_bytes: int, _total_bytes: int) -> None:
        if done_bytes == 0:  # after the source was looked at, before it is opened for copying
            os.replace(swapped_in, source)

    with pytest.raises(ModelFileError, match="could not load this model file") as refused:
        store.add(source, progress=swap_when_the_copy_starts)
    assert nothing_registered(store)
    # What was copied is what is now at the path: it is remembered as bad, like a direct add.
    assert store.bad_file_reason(source) == refused.value.message
    with pytest.raises(ModelFileError, match="could not load this model file"):
        store.add(source)


@pytest.mark.slow
def test_a_linked_file_rewritten_while_it_is_checked_is_checked_again(
    store: ModelStore, tmp_path: Path
) -> None:
    linked = write_small_llama(tmp_path / "linked.gguf")
    bad = write_small_llama(tmp_path / "bad.gguf", metadata=BAD_KV_HEADS)
    hashed: list[int] = []

    def swap_once_hashing_ends(done_bytes: int, total_bytes: int) -> None:
        if done_bytes == total_bytes and not hashed:
            hashed.append(done_bytes)
            os.replace(bad, linked)  # after the check and the hash, before registering

    with pytest.raises(ModelFileError, match="could not load this model file"):
        store.add(linked, link=True, progress=swap_once_hashing_ends)
    assert hashed and store.list() == []


def test_a_good_copy_is_registered_with_the_facts_of_the_copy(
    store: ModelStore, tmp_path: Path
) -> None:
    source = write_small_llama(tmp_path / "good.gguf")
    record = store.add(source)
    assert record.path.read_bytes() == source.read_bytes()
    assert record.size_bytes == source.stat().st_size
    assert not list(store.models_dir.glob("*.part"))


# --- a check killed for want of memory is not a verdict on the file --------------------------


def test_a_check_killed_by_sigkill_says_memory_ran_out_and_marks_nothing_bad(
    store: ModelStore, tmp_path: Path
) -> None:
    model = write_small_llama(tmp_path / "m.gguf")
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    with pytest.raises(EngineError) as failed:
        check_loads_in_child(model, command=killed)
    assert not isinstance(failed.value, ModelFileError)
    assert "ran out of memory" in failed.value.message
    assert "not found to be damaged" in (failed.value.hint or "")


@pytest.mark.skipif(not Path("/proc/self/oom_score_adj").exists(), reason="Linux's OOM killer")
def test_the_checking_child_is_the_first_the_oom_killer_picks(tmp_path: Path) -> None:
    report = (
        "import sys, time; time.sleep(1); "
        "adj = open('/proc/self/oom_score_adj').read().strip(); "
        "sys.stderr.write('hearthside-check: score ' + adj + '\\n'); sys.exit(3)"
    )
    with pytest.raises(ModelFileError, match="score 1000"):
        check_loads_in_child(tmp_path / "m.gguf", command=[sys.executable, "-c", report])
