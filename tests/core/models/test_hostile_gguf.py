"""Hostile GGUF files: what `models add` refuses, and the contained first full load.

Issue 22 item 3: files the validator passed used to abort llama.cpp (GGML_ASSERT on layer
counts), hang it (a NaN norm epsilon) or raise a Python traceback at the first real load, in
the app's own process. Every file here is a real GGUF written with the `gguf` package and
loaded, where it gets that far, by the real llama.cpp in a child process.
"""

from __future__ import annotations

import math
import os
import struct
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hearthside.core.errors import HearthsideError, ModelFileError
from hearthside.core.models.child_check import check_loads_in_child, deadline_for
from hearthside.core.models.gguf_validator import GGUFValidationError, validate_gguf
from hearthside.core.models.store import ModelStore, resolve_model_path
from hearthside.core.paths import data_dir
from tests.core.models.malformed_gguf import (
    ARCH,
    REMOVE,
    T,
    flip_byte,
    header_fields,
    tensor_info_offsets,
    with_bytes,
    write_small_llama,
)


@pytest.fixture
def store() -> Iterator[ModelStore]:
    with ModelStore(data_dir()) as opened:
        yield opened


@pytest.fixture(scope="module")
def good_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_small_llama(tmp_path_factory.mktemp("good") / "good.gguf").read_bytes()


def key(name: str) -> str:
    return f"{ARCH}.{name}"


# --- the validator refuses the numbers that crash or hang llama.cpp --------------------------

REFUSED_METADATA = {
    "0 layers": (key("block_count"), (0, T.UINT32), "the model has 0 layers"),
    "1000 layers": (key("block_count"), (1000, T.UINT32), "has 1,000 layers, more than the 512"),
    "2^32-1 layers": (key("block_count"), (0xFFFFFFFF, T.UINT32), "4,294,967,295 layers"),
    "more layers than weights": (key("block_count"), (3, T.UINT32), "weights of only 2"),
    "layers as text": (key("block_count"), ("two", T.STRING), "not a whole number"),
    "context 0": (key("context_length"), (0, T.UINT32), "context length is 0 tokens"),
    "context 2^32-1": (key("context_length"), (0xFFFFFFFF, T.UINT32), "4,294,967,295 tokens"),
    "context -1": (key("context_length"), (-1, T.INT64), "context length is -1 tokens"),
    "embedding 0": (key("embedding_length"), (0, T.UINT32), "embedding width is 0"),
    "embedding 2^20": (key("embedding_length"), (1 << 20, T.UINT32), "1,048,576 values"),
    "0 heads": (key("attention.head_count"), (0, T.UINT32), "0 attention heads"),
    "0 kv heads": (key("attention.head_count_kv"), (0, T.UINT32), "0 attention heads"),
    "2^32-1 heads": (key("attention.head_count"), (0xFFFFFFFF, T.UINT32), "4,294,967,295"),
    "huge feed-forward": (key("feed_forward_length"), (1 << 30, T.UINT32), "feed-forward"),
    "rms eps NaN": (key("attention.layer_norm_rms_epsilon"), (math.nan, T.FLOAT32), "is nan"),
    "rms eps inf": (key("attention.layer_norm_rms_epsilon"), (math.inf, T.FLOAT32), "is inf"),
    "rms eps 0": (key("attention.layer_norm_rms_epsilon"), (0.0, T.FLOAT32), "is 0.0, not above"),
    "rms eps < 0": (key("attention.layer_norm_rms_epsilon"), (-1.0, T.FLOAT32), "-1.0"),
    "layer norm eps NaN": (key("attention.layer_norm_epsilon"), (math.nan, T.FLOAT32), "nan"),
    "rope base NaN": (key("rope.freq_base"), (math.nan, T.FLOAT32), "rope.freq_base is nan"),
    "1000 experts": (key("expert_count"), (1000, T.UINT32), "1,000 experts, more than the 512"),
    "experts used, none there": (key("expert_used_count"), (2, T.UINT32), "but has none"),
}


@pytest.mark.parametrize("case", REFUSED_METADATA, ids=list(REFUSED_METADATA))
def test_the_validator_refuses_numbers_that_crash_or_hang_llama_cpp(
    case: str, tmp_path: Path
) -> None:
    name, change, words = REFUSED_METADATA[case]
    path = write_small_llama(tmp_path / "bad.gguf", metadata={name: change})
    with pytest.raises(GGUFValidationError) as refused:
        validate_gguf(path)
    assert words in refused.value.message
    assert refused.value.message.startswith("This file says ")
    assert refused.value.message.endswith("; it is damaged or not a model.")
    assert refused.value.hint


def test_the_message_for_zero_layers_is_plain(tmp_path: Path) -> None:
    path = write_small_llama(tmp_path / "bad.gguf", metadata={key("block_count"): (0, T.UINT32)})
    with pytest.raises(GGUFValidationError) as refused:
        validate_gguf(path)
    assert (
        refused.value.message
        == "This file says the model has 0 layers; it is damaged or not a model."
    )


def test_real_layouts_that_look_odd_still_pass(tmp_path: Path) -> None:
    # A recurrent model (Mamba, RWKV) has 0 attention heads and no attention weights; one part
    # of a split model holds only some layers; a vocabulary-only file holds no tensors at all.
    recurrent = write_small_llama(
        tmp_path / "recurrent.gguf",
        metadata={key("attention.head_count"): (0, T.UINT32)},
        attention=False,
    )
    split_part = write_small_llama(
        tmp_path / "part.gguf",
        metadata={key("block_count"): (8, T.UINT32), "split.count": (2, T.UINT16)},
    )
    vocabulary_only = write_small_llama(tmp_path / "vocab.gguf", weights=False)
    per_layer_ffn = write_small_llama(
        tmp_path / "ffn.gguf", metadata={key("feed_forward_length"): ([256, 256], T.ARRAY)}
    )
    for path in (recurrent, split_part, vocabulary_only, per_layer_ffn):
        validate_gguf(path)


# --- the first full load happens in a child process ------------------------------------------


def test_a_real_small_model_loads_and_decodes_in_the_child(tmp_path: Path) -> None:
    check_loads_in_child(write_small_llama(tmp_path / "good.gguf"))


def test_a_llama_cpp_abort_becomes_this_file_is_damaged_with_the_assert_text(
    tmp_path: Path,
) -> None:
    # Straight to the child, past the validator: llama.cpp's own GGML_ASSERT fires.
    path = write_small_llama(tmp_path / "bad.gguf", metadata={key("block_count"): (0, T.UINT32)})
    with pytest.raises(ModelFileError) as failed:
        check_loads_in_child(path)
    assert failed.value.message == (
        "This file is damaged: GGML_ASSERT(hparams.n_layer_all > 0 && "
        "hparams.n_layer_all <= LLAMA_MAX_LAYERS) failed."
    )
    assert "did not add it" in (failed.value.hint or "")


def test_a_refused_load_says_what_llama_cpp_objected_to(tmp_path: Path) -> None:
    path = write_small_llama(
        tmp_path / "bad.gguf", metadata={key("attention.head_count_kv"): (3, T.UINT32)}
    )
    validate_gguf(path)  # plausible numbers; only the weights' shapes disagree
    with pytest.raises(ModelFileError) as failed:
        check_loads_in_child(path)
    assert failed.value.message.startswith(
        "llama.cpp could not load this model file (it refused to load it: "
        "tensor 'blk.0.attn_k.weight' has wrong shape"
    )


def test_a_python_error_in_the_child_becomes_a_plain_message(tmp_path: Path) -> None:
    # llama-cpp-python itself raises on a 2^32-1 context length (seen past the validator).
    path = write_small_llama(
        tmp_path / "bad.gguf", metadata={key("context_length"): (0xFFFFFFFF, T.UINT32)}
    )
    with pytest.raises(ModelFileError) as failed:
        check_loads_in_child(path)
    assert "ValueError: Array length must be >= 0" in failed.value.message
    assert "Traceback" not in failed.value.user_text()


def test_an_uncaught_traceback_in_the_child_is_reduced_to_its_last_line(tmp_path: Path) -> None:
    crashing = [sys.executable, "-c", "raise ValueError('Array length must be >= 0, not -1')"]
    with pytest.raises(ModelFileError) as failed:
        check_loads_in_child(tmp_path, command=crashing)
    assert failed.value.message == (
        "llama.cpp could not load this model file (the check exited with code 1: "
        "ValueError: Array length must be >= 0, not -1)."
    )


def test_a_loader_that_hangs_or_aborts_is_stopped_at_the_deadline(tmp_path: Path) -> None:
    # Past the validator, a NaN norm epsilon makes this llama.cpp either spin forever in its
    # load or abort on GGML_ASSERT(eps >= 0.0f), depending on the run; either way the check
    # ends within its deadline with a plain message.
    path = write_small_llama(
        tmp_path / "bad.gguf",
        metadata={key("attention.layer_norm_rms_epsilon"): (math.nan, T.FLOAT32)},
    )
    started = time.monotonic()
    with pytest.raises(ModelFileError) as stopped:
        check_loads_in_child(path, timeout_s=4)
    assert stopped.value.message in {
        "This file is damaged: GGML_ASSERT(eps >= 0.0f) failed.",
        "llama.cpp did not finish loading this model file within 4 s, so Hearthside stopped it.",
    }
    assert time.monotonic() - started < 10


@pytest.mark.skipif(os.name != "posix", reason="process groups")
def test_a_killed_check_leaves_no_process_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    with pytest.raises(ModelFileError, match="did not finish loading"):
        check_loads_in_child(tmp_path, timeout_s=2, command=[sys.executable, "-c", code])
    grandchild = int(pid_file.read_text())
    assert _gone_within(grandchild, 5.0), "the hung check's own child is still running"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if _is_zombie(pid):
            return True  # killed, waiting for init to reap it
        time.sleep(0.05)
    return False


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_the_deadline_grows_with_the_file() -> None:
    assert deadline_for(0) == 60
    assert deadline_for(40 * 10**9) == 60 + 40 * 15


# --- a file that fails is not added, and is remembered as bad --------------------------------


@pytest.mark.slow
def test_a_file_that_fails_its_load_is_not_added_and_is_remembered(
    store: ModelStore, tmp_path: Path
) -> None:
    bad = write_small_llama(
        tmp_path / "bad.gguf", metadata={key("attention.head_count_kv"): (3, T.UINT32)}
    )
    with pytest.raises(ModelFileError, match="could not load this model file") as failed:
        store.add(bad)
    assert store.list() == []
    assert list(store.models_dir.glob("*.gguf*")) == []
    assert store.bad_file_reason(bad) == failed.value.message

    # Loading it by path later is refused at once, with the same reason.
    with pytest.raises(ModelFileError) as refused:
        resolve_model_path(store, str(bad))
    assert refused.value.message == failed.value.message
    assert "checked this file before" in (refused.value.hint or "")

    # Adding it again checks it again (and it fails again).
    with pytest.raises(ModelFileError, match="could not load this model file"):
        store.add(bad)

    # A new file at the same path is a new file: it is checked, passes, and is forgotten.
    write_small_llama(bad, seed=1)
    assert store.bad_file_reason(bad) is None
    assert resolve_model_path(store, str(bad)) == bad
    assert store.add(bad, link=True).path == bad.resolve()


# --- the corpus: every hostile file through `models add`, then a full load -------------------


def _metadata_case(name: str, value: object) -> Callable[[Path], bytes]:
    def build(directory: Path) -> bytes:
        return write_small_llama(directory / "m.gguf", metadata={name: value}).read_bytes()

    return build


def _u64_at(offset: int, value: int) -> Callable[[bytes], bytes]:
    return lambda data: with_bytes(data, offset, struct.pack("<Q", value))


def _tensor_offset(index: int, value: Callable[[bytes], int]) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        where = tensor_info_offsets(data)[index]
        return with_bytes(data, where, struct.pack("<Q", value(data)))

    return damage


def _tensor_dim(index: int, value: int) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        # The last dim sits just before the type (u32) and the offset (u64).
        where = tensor_info_offsets(data)[index] - 4 - 8
        return with_bytes(data, where, struct.pack("<Q", value))

    return damage


def _tensor_type(index: int, value: int) -> Callable[[bytes], bytes]:
    def damage(data: bytes) -> bytes:
        return with_bytes(data, tensor_info_offsets(data)[index] - 4, struct.pack("<I", value))

    return damage


def _kv_count(delta: int) -> Callable[[bytes], bytes]:
    return lambda data: _u64_at(16, header_fields(data)[2] + delta)(data)


BYTE_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda data: b"",
    "magic only": lambda data: data[:4],
    "header cut": lambda data: data[:20],
    "metadata cut": lambda data: data[:200],
    "tensor table cut": lambda data: data[: tensor_info_offsets(data)[3]],
    "data cut in half": lambda data: data[: len(data) // 2],
    "last byte missing": lambda data: data[:-1],
    "magic flipped": lambda data: flip_byte(data, 0),
    "version flipped": lambda data: flip_byte(data, 4),
    "version byte 2 flipped": lambda data: flip_byte(data, 6),
    "tensor count low byte flipped": lambda data: flip_byte(data, 8),
    "tensor count high byte flipped": lambda data: flip_byte(data, 15),
    "kv count low byte flipped": lambda data: flip_byte(data, 16),
    "kv count high byte flipped": lambda data: flip_byte(data, 23),
    "2^63 tensors": _u64_at(8, 1 << 63),
    "one tensor more": lambda data: _u64_at(8, header_fields(data)[1] + 1)(data),
    "one tensor fewer": lambda data: _u64_at(8, header_fields(data)[1] - 1)(data),
    "2^64-1 metadata entries": _u64_at(16, (1 << 64) - 1),
    "one metadata entry more": _kv_count(+1),
    "one metadata entry fewer": _kv_count(-1),
    "tensor offset 2^63": _tensor_offset(0, lambda data: 1 << 63),
    "tensor offset past the end": _tensor_offset(-1, lambda data: len(data)),
    "tensor offset unaligned": _tensor_offset(1, lambda data: 4),
    "tensors overlap": _tensor_offset(2, lambda data: 0),
    "dimension 2^40": _tensor_dim(0, 1 << 40),
    "dimension 0": _tensor_dim(1, 0),
    "unknown tensor type": _tensor_type(0, 9999),
}

METADATA_DAMAGE: dict[str, tuple[str, object]] = {
    "block_count 0": (key("block_count"), (0, T.UINT32)),
    "block_count 1000": (key("block_count"), (1000, T.UINT32)),
    "block_count 2^32-1": (key("block_count"), (0xFFFFFFFF, T.UINT32)),
    "block_count 3 of 2": (key("block_count"), (3, T.UINT32)),
    "context_length 0": (key("context_length"), (0, T.UINT32)),
    "context_length 2^32-1": (key("context_length"), (0xFFFFFFFF, T.UINT32)),
    "embedding_length 0": (key("embedding_length"), (0, T.UINT32)),
    "head_count 0": (key("attention.head_count"), (0, T.UINT32)),
    "head_count_kv 3": (key("attention.head_count_kv"), (3, T.UINT32)),
    "feed_forward_length 0": (key("feed_forward_length"), (0, T.UINT32)),
    "key_length 0": (key("attention.key_length"), (0, T.UINT32)),
    "rope dimension 0": (key("rope.dimension_count"), (0, T.UINT32)),
    "rms eps NaN": (key("attention.layer_norm_rms_epsilon"), (math.nan, T.FLOAT32)),
    "rms eps -1": (key("attention.layer_norm_rms_epsilon"), (-1.0, T.FLOAT32)),
    "1000 experts": (key("expert_count"), (1000, T.UINT32)),
    "no token types": ("tokenizer.ggml.token_type", REMOVE),
    "two token types": ("tokenizer.ggml.token_type", ([1, 1], T.ARRAY)),
    "bos token 100000": ("tokenizer.ggml.bos_token_id", (100000, T.UINT32)),
    "rope base 0": (key("rope.freq_base"), (0.0, T.FLOAT32)),
}


def _corpus(directory: Path, good: bytes) -> Iterator[tuple[str, Path]]:
    for number, (name, damage) in enumerate(BYTE_DAMAGE.items()):
        path = directory / f"bytes-{number}.gguf"
        path.write_bytes(damage(good))
        yield name, path
    for number, (name, (meta_key, value)) in enumerate(METADATA_DAMAGE.items()):
        yield name, write_small_llama(directory / f"meta-{number}.gguf", metadata={meta_key: value})


@pytest.mark.slow
def test_no_hostile_file_crashes_hangs_or_shows_a_traceback(
    store: ModelStore, tmp_path: Path, good_bytes: bytes
) -> None:
    """Every file goes through `ModelStore.add` (what `hearthside models add` runs) and each
    one it accepts through a full load by the real engine in a child process. This process
    surviving is the "0 crashes"; the rest is asserted per file."""
    directory = tmp_path / "corpus"
    directory.mkdir()
    outcomes: dict[str, str] = {}
    for name, path in _corpus(directory, good_bytes):
        started = time.monotonic()
        try:
            record = store.add(path, link=True)
        except HearthsideError as refused:
            outcomes[name] = _plain(name, refused)
        else:
            check_loads_in_child(record.path)  # what the app's first load would meet
            outcomes[name] = "accepted"
        elapsed = time.monotonic() - started
        assert elapsed < deadline_for(path.stat().st_size), f"{name} took {elapsed:.0f} s"
    accepted = sorted(name for name, outcome in outcomes.items() if outcome == "accepted")
    # Each of these loads and decodes: odd values llama.cpp copes with.
    assert accepted == ["bos token 100000", "no token types", "rope base 0"], outcomes
    assert len(outcomes) == len(BYTE_DAMAGE) + len(METADATA_DAMAGE)


def _plain(name: str, error: HearthsideError) -> str:
    text = error.user_text()
    assert isinstance(error, ModelFileError), f"{name}: {type(error).__name__}: {text}"
    assert text.strip() and error.hint, f"{name}: no message or no hint"
    assert "Traceback" not in text and 'File "' not in text, f"{name}: {text}"
    assert text.isprintable() or "\n" in text, f"{name}: {text!r}"
    return text
