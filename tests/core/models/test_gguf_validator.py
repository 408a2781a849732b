"""The GGUF validator: a real small file, every truncation of it, hand-made attacks, random
bytes, and the real default model."""

from __future__ import annotations

import json
import os
import struct
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hearthside.core.models.gguf_validator import (
    GGUFArraySummary,
    GGUFInfo,
    GGUFValidationError,
    validate_gguf,
)

# A malformed file is refused in milliseconds; a loop or a giant read would take far longer,
# and the 2-core CI machine stalls for half a second at times.
MALFORMED_LIMIT_S = 1.0

# GGUF value type ids (GGUFValueType) and ggml tensor type ids (GGMLQuantizationType).
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY = range(10)
UINT64, INT64, FLOAT64 = 10, 11, 12
F32, F16, Q8_0 = 0, 1, 8

WriteFile = Callable[[bytes], Path]


# --- a hand-made GGUF builder ------------------------------------------------------------------


def gguf_string(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(data)) + data


def kv(key: str | bytes, value_type: int, payload: bytes) -> bytes:
    return gguf_string(key) + struct.pack("<I", value_type) + payload


def kv_u32(key: str, value: int) -> bytes:
    return kv(key, UINT32, struct.pack("<I", value))


def kv_text(key: str, text: str | bytes) -> bytes:
    return kv(key, STRING, gguf_string(text))


def kv_array(key: str, element_type: int, length: int, elements: bytes = b"") -> bytes:
    return kv(key, ARRAY, struct.pack("<IQ", element_type, length) + elements)


def tensor_info(
    name: str | bytes, shape: Sequence[int], ggml_type: int = F32, offset: int = 0
) -> bytes:
    dims = struct.pack("<I", len(shape)) + b"".join(struct.pack("<Q", dim) for dim in shape)
    return gguf_string(name) + dims + struct.pack("<IQ", ggml_type, offset)


def gguf_file(
    kvs: Sequence[bytes] = (),
    tensors: Sequence[bytes] = (),
    *,
    data: bytes = b"",
    alignment: int = 32,
    tensor_count: int | None = None,
    kv_count: int | None = None,
    version: int = 3,
    magic: bytes = b"GGUF",
) -> bytes:
    """Header, KV table, tensor table, zero padding to `alignment`, then `data`."""
    n_tensors = len(tensors) if tensor_count is None else tensor_count
    n_kv = len(kvs) if kv_count is None else kv_count
    head = magic + struct.pack("<IQQ", version, n_tensors, n_kv) + b"".join([*kvs, *tensors])
    return head + b"\0" * (-len(head) % alignment) + data


def one_f32_tensor(
    shape: Sequence[int] = (8,), offset: int = 0, name: str = "w", n_data_bytes: int = 32
) -> bytes:
    """A valid file holding one F32 tensor (8 floats by default): the base of most attacks."""
    return gguf_file(
        [kv_text("general.architecture", "llama")],
        [tensor_info(name, shape, F32, offset)],
        data=b"\0" * n_data_bytes,
    )


@pytest.fixture
def write(tmp_path: Path) -> WriteFile:
    def write_bytes(content: bytes) -> Path:
        path = tmp_path / "model.gguf"
        # Unlink first: ext4 flushes a file truncated and rewritten in place (auto_da_alloc),
        # which made thousands of rewrites take seconds.
        path.unlink(missing_ok=True)
        path.write_bytes(content)
        return path

    return write_bytes


def expect_rejected(path: Path, *fragments: str) -> GGUFValidationError:
    start = time.perf_counter()
    with pytest.raises(GGUFValidationError) as caught:
        validate_gguf(path)
    elapsed_s = time.perf_counter() - start
    assert elapsed_s < MALFORMED_LIMIT_S, f"took {elapsed_s * 1000:.1f} ms"
    error = caught.value
    for fragment in fragments:
        assert fragment in error.message, error.message
    assert error.hint, "every rejection tells the user what to do next"
    return error


def validate_within_limit(path: Path) -> GGUFInfo | GGUFValidationError:
    """Whatever the input, the answer is a GGUFInfo or a GGUFValidationError, and quickly."""
    start = time.perf_counter()
    try:
        result: GGUFInfo | GGUFValidationError = validate_gguf(path)
    except GGUFValidationError as error:
        assert_diagnosed(error)
        result = error
    assert time.perf_counter() - start < MALFORMED_LIMIT_S
    return result


def assert_diagnosed(error: GGUFValidationError) -> None:
    """A specific check caught the problem, not the last-resort handler for raw errors."""
    assert error.__cause__ is None or isinstance(error.__cause__, OSError), error.message


# --- a small real file written by gguf.GGUFWriter ----------------------------------------------


def write_small_gguf(path: Path) -> None:
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("tiny-test")
    writer.add_file_type(7)  # LLAMA_FTYPE_MOSTLY_Q8_0
    writer.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "hello", "wörld"])
    writer.add_array("llama.test.layer_sizes", [3, 1, 4, 1, 5])
    writer.add_tensor("token_embd.weight", np.arange(32, dtype=np.float32).reshape(4, 8))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones((3, 16), dtype=np.float16))
    weights = np.linspace(-1.0, 1.0, 128, dtype=np.float32).reshape(2, 64)
    q8_0 = gguf.GGMLQuantizationType.Q8_0
    writer.add_tensor("output.weight", gguf.quants.quantize(weights, q8_0), raw_dtype=q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def small_gguf_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("small-gguf") / "tiny.gguf"
    write_small_gguf(path)
    return path.read_bytes()


@pytest.fixture
def small_gguf(small_gguf_bytes: bytes, write: WriteFile) -> Path:
    return write(small_gguf_bytes)


def test_small_real_file_is_read_exactly(small_gguf: Path) -> None:
    info = validate_gguf(small_gguf)

    assert info.version == 3
    assert info.file_size == small_gguf.stat().st_size
    assert info.alignment == 32
    assert info.architecture == "llama"
    assert info.model_name == "tiny-test"
    assert info.quant_name == "Q8_0"
    assert info.chat_template is not None and "messages" in info.chat_template
    assert info.metadata["tokenizer.ggml.tokens"] == GGUFArraySummary(STRING, 3, None)
    assert info.metadata["llama.test.layer_sizes"] == GGUFArraySummary(INT32, 5, (3, 1, 4, 1, 5))

    by_name = {tensor.name: tensor for tensor in info.tensors}
    embd, norm, output = (
        by_name["token_embd.weight"],
        by_name["blk.0.attn_norm.weight"],
        by_name["output.weight"],
    )
    assert (embd.shape, embd.type_name, embd.n_bytes) == ((8, 4), "F32", 128)
    assert (norm.shape, norm.type_name, norm.n_bytes) == ((16, 3), "F16", 96)
    # Q8_0: 2 rows x 2 blocks of 32 values x 34 bytes (an f16 scale + 32 int8).
    assert (output.shape, output.type_name, output.n_bytes) == ((64, 2), "Q8_0", 136)
    assert info.data_offset % 32 == 0
    assert embd.offset == info.data_offset
    assert norm.offset == info.data_offset + 128
    assert output.offset == info.data_offset + 128 + 96
    assert info.parameter_count == 32 + 48 + 128


def test_small_real_file_agrees_with_gguf_reader(small_gguf: Path) -> None:
    info = validate_gguf(small_gguf)  # GGUFReader only ever sees files that passed

    reader = gguf.GGUFReader(small_gguf)
    expected = [
        (t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset, t.n_bytes)
        for t in reader.tensors
    ]
    actual = [(t.name, t.shape, t.ggml_type, t.offset, t.n_bytes) for t in info.tensors]
    assert actual == expected
    assert reader.data_offset == info.data_offset


def test_tensor_bytes_match_the_data_written(small_gguf: Path, small_gguf_bytes: bytes) -> None:
    info = validate_gguf(small_gguf)
    embd = next(t for t in info.tensors if t.name == "token_embd.weight")

    stored = np.frombuffer(small_gguf_bytes[embd.offset : embd.offset + embd.n_bytes], "<f4")

    assert stored.tolist() == list(range(32))


def test_summary_is_json_and_metadata_is_read_only(small_gguf: Path) -> None:
    info = validate_gguf(small_gguf)

    summary = json.loads(json.dumps(info.to_dict(), allow_nan=False))

    assert summary["quant_name"] == "Q8_0"
    assert summary["parameter_count"] == 208
    assert [t["shape"] for t in summary["tensors"]] == [[8, 4], [16, 3], [64, 2]]
    assert summary["metadata"]["llama.test.layer_sizes"]["values"] == [3, 1, 4, 1, 5]
    assert isinstance(info.metadata, MappingProxyType)
    writable_looking: Any = info.metadata
    with pytest.raises(TypeError):
        writable_looking["general.name"] = "changed"


def test_every_truncation_is_rejected_quickly(small_gguf_bytes: bytes, write: WriteFile) -> None:
    info = validate_gguf(write(small_gguf_bytes))
    end_of_last_tensor = max(t.offset + t.n_bytes for t in info.tensors)

    slowest_s = 0.0
    for cut in range(end_of_last_tensor):
        path = write(small_gguf_bytes[:cut])
        start = time.perf_counter()
        with pytest.raises(GGUFValidationError) as caught:
            validate_gguf(path)
        slowest_s = max(slowest_s, time.perf_counter() - start)
        assert_diagnosed(caught.value)

    assert slowest_s < MALFORMED_LIMIT_S


# --- hand-made attacks -------------------------------------------------------------------------


def test_hand_made_base_file_is_valid(write: WriteFile) -> None:
    info = validate_gguf(write(one_f32_tensor()))

    assert [(t.name, t.shape, t.n_bytes) for t in info.tensors] == [("w", (8,), 32)]
    assert info.quant_name == "F32"


HEADER_ATTACKS = {
    "tensor_count_2^63": (gguf_file(tensor_count=1 << 63), "tensors; the limit"),
    "tensor_count_2^64-1": (gguf_file(tensor_count=(1 << 64) - 1), "tensors; the limit"),
    "kv_count_2^63": (gguf_file(kv_count=1 << 63), "metadata entries; the limit"),
    "kv_count_2^64-1": (gguf_file(kv_count=(1 << 64) - 1), "metadata entries; the limit"),
    "counts_beyond_file": (gguf_file(tensor_count=1000, kv_count=1000), "need at least"),
    "version_1": (gguf_file(version=1), "version 1"),
    "big_endian_version": (gguf_file(version=3 << 24), "big-endian"),
    "unknown_version": (gguf_file(version=0xDEADBEEF), "only versions 2 and 3"),
    "wrong_magic": (gguf_file(magic=b"GGML"), 'signature "GGUF"'),
    "four_byte_file": (b"GGUF", "only 4 bytes"),
    "empty_file": (b"", "empty"),
}


@pytest.mark.parametrize(("content", "fragment"), HEADER_ATTACKS.values(), ids=list(HEADER_ATTACKS))
def test_bad_header_is_rejected(write: WriteFile, content: bytes, fragment: str) -> None:
    expect_rejected(write(content), fragment)


def test_version_1_and_big_endian_say_what_to_download(write: WriteFile) -> None:
    old = expect_rejected(write(gguf_file(version=1)), "obsolete")
    big = expect_rejected(write(gguf_file(version=2 << 24)), "big-endian")

    assert old.hint is not None and "version 3" in old.hint
    assert big.hint is not None and "little-endian" in big.hint


def _array_of_2_63_bytes() -> bytes:
    # The shape of the file that makes gguf 0.19's GGUFReader loop with unbounded memory.
    return gguf_file([kv_array("a", UINT8, 1 << 63)])


METADATA_ATTACKS = {
    "array_length_2^63": (_array_of_2_63_bytes(), "the limit is 67,108,864"),
    "string_array_length_2^63": (gguf_file([kv_array("a", STRING, 1 << 63)]), "the limit"),
    "array_longer_than_file": (gguf_file([kv_array("a", UINT32, 1 << 20)]), "can hold"),
    "array_string_length_2^63": (
        gguf_file([kv_array("a", STRING, 2, gguf_string("ok") + struct.pack("<Q", 1 << 63))]),
        "string 1 in",
    ),
    "array_string_past_end": (
        gguf_file([kv_array("a", STRING, 2, gguf_string("ok") + gguf_string("x" * 1000)[:20])]),
        "string 1 in",
    ),
    "array_string_length_cut_off": (
        gguf_file([kv_array("a", STRING, 3, gguf_string("x" * 40) + b"\x01\x00")], alignment=1),
        "ends early in metadata entry 1",
    ),
    "key_length_2^63": (
        gguf_file([struct.pack("<Q", 1 << 63) + b"key"]),
        "the limit is 65,535",
    ),
    "value_string_length_2^63": (
        gguf_file([kv("a", STRING, struct.pack("<Q", 1 << 63))]),
        "the limit is 16,777,216",
    ),
    "value_string_past_end": (
        gguf_file([kv("a", STRING, struct.pack("<Q", 1000) + b"short")]),
        "ends early",
    ),
    "unknown_value_type": (gguf_file([kv("a", 13, b"\0" * 8)]), "unknown value type 13"),
    "unknown_element_type": (gguf_file([kv_array("a", 99, 1, b"\0" * 8)]), "unknown value type"),
    "nested_array": (
        gguf_file([kv_array("a", ARRAY, 1, struct.pack("<IQ", UINT8, 0))]),
        "array of arrays",
    ),
    "bool_value_2": (gguf_file([kv("a", BOOL, b"\x02")]), "not 0 or 1"),
    "bool_in_small_array": (
        gguf_file([kv_array("a", BOOL, 3, b"\x01\x00\x07")]),
        "neither 0 nor 1",
    ),
    "bool_in_large_array": (
        gguf_file([kv_array("a", BOOL, 5000, b"\x01" * 4999 + b"\x02")]),
        "neither 0 nor 1",
    ),
    "empty_key": (gguf_file([kv("", UINT8, b"\0")]), "is empty"),
    "key_not_utf8": (gguf_file([kv(b"\xff\xfe", UINT8, b"\0")]), "not valid UTF-8"),
    "value_not_utf8": (gguf_file([kv_text("a", b"caf\xc3")]), "not valid UTF-8"),
    "duplicate_key": (
        gguf_file([kv_u32("a", 1), kv_u32("a", 2)]),
        'key "a" appears twice',
    ),
    "alignment_0": (gguf_file([kv_u32("general.alignment", 0)]), "power of two"),
    "alignment_3": (gguf_file([kv_u32("general.alignment", 3)]), "power of two"),
    "alignment_too_big": (gguf_file([kv_u32("general.alignment", 1 << 17)]), "power of two"),
    "alignment_not_u32": (
        gguf_file([kv("general.alignment", UINT64, struct.pack("<Q", 32))]),
        "not a 32-bit unsigned integer",
    ),
}


@pytest.mark.parametrize(
    ("content", "fragment"), METADATA_ATTACKS.values(), ids=list(METADATA_ATTACKS)
)
def test_bad_metadata_is_rejected(write: WriteFile, content: bytes, fragment: str) -> None:
    expect_rejected(write(content), fragment)


def _two_f32_tensors(first_offset: int, second_offset: int, second_name: str = "b") -> bytes:
    return gguf_file(
        tensors=[
            tensor_info("a", (16,), F32, first_offset),  # 64 bytes
            tensor_info(second_name, (8,), F32, second_offset),
        ],
        data=b"\0" * 256,
    )


TENSOR_ATTACKS = {
    "unknown_ggml_type": (
        gguf_file(tensors=[tensor_info("w", (8,), 999)], data=b"\0" * 64),
        "unknown tensor type 999",
    ),
    "removed_ggml_type_4": (
        gguf_file(tensors=[tensor_info("w", (32,), 4)], data=b"\0" * 64),
        "unknown tensor type 4",
    ),
    "n_dims_5": (one_f32_tensor(shape=(1, 1, 1, 1, 8)), "has 5 dimensions"),
    "n_dims_0": (one_f32_tensor(shape=()), "has 0 dimensions"),
    "dimension_0": (one_f32_tensor(shape=(8, 0)), "invalid dimension"),
    "dimension_2^63": (one_f32_tensor(shape=(8, 1 << 63)), "invalid dimension"),
    "wrapped_dimensions_2^64": (one_f32_tensor(shape=(1 << 32, 1 << 32)), "2^63-1 elements"),
    "wrapped_dimensions_2^63": (one_f32_tensor(shape=(1 << 31, 1 << 31, 2)), "2^63-1 elements"),
    "row_not_whole_blocks": (
        gguf_file(tensors=[tensor_info("w", (33,), Q8_0)], data=b"\0" * 64),
        "not a multiple of the Q8_0 block size 32",
    ),
    "offset_past_eof": (one_f32_tensor(offset=1 << 20), "but the file is"),
    "offset_2^64-1": (one_f32_tensor(offset=(1 << 64) - 32), "but the file is"),
    "data_missing": (one_f32_tensor(n_data_bytes=31), "but the file is"),
    "size_past_eof": (one_f32_tensor(shape=(8, 1 << 40)), "but the file is"),
    "misaligned_offset": (_two_f32_tensors(0, 68), "not a multiple of the alignment 32"),
    "overlapping_tensors": (_two_f32_tensors(0, 32), "overlap"),
    "same_offset": (_two_f32_tensors(64, 64), "overlap"),
    "duplicate_tensor_name": (_two_f32_tensors(0, 64, second_name="a"), '"a" appears twice'),
    "empty_tensor_name": (one_f32_tensor(name=""), "is empty"),
    "tensor_name_too_long": (
        gguf_file(tensors=[struct.pack("<Q", 1 << 16) + b"x" * 100]),
        "the limit is 65,535",
    ),
}


@pytest.mark.parametrize(("content", "fragment"), TENSOR_ATTACKS.values(), ids=list(TENSOR_ATTACKS))
def test_bad_tensor_table_is_rejected(write: WriteFile, content: bytes, fragment: str) -> None:
    expect_rejected(write(content), fragment)


def test_adjacent_tensors_and_custom_alignment_are_accepted(write: WriteFile) -> None:
    content = gguf_file(
        [kv_u32("general.alignment", 64)],
        [tensor_info("a", (16,), F32, 0), tensor_info("b", (8,), F32, 64)],
        alignment=64,
        data=b"\0" * 96,
    )

    info = validate_gguf(write(content))

    assert info.alignment == 64
    assert info.data_offset % 64 == 0
    assert [t.offset - info.data_offset for t in info.tensors] == [0, 64]


def test_quant_name_falls_back_to_the_type_holding_most_bytes(write: WriteFile) -> None:
    content = gguf_file(
        tensors=[tensor_info("small", (8,), F32, 0), tensor_info("big", (64,), F16, 32)],
        data=b"\0" * 160,
    )

    assert validate_gguf(write(content)).quant_name == "F16"


def test_quant_name_comes_from_llama_file_type(write: WriteFile) -> None:
    content = gguf_file(
        [kv_u32("general.file_type", 15)], [tensor_info("w", (8,))], data=b"\0" * 32
    )

    assert validate_gguf(write(content)).quant_name == "Q4_K_M"


def test_no_tensors_and_no_metadata_is_a_valid_empty_model(write: WriteFile) -> None:
    info = validate_gguf(write(gguf_file()))

    assert (info.tensors, dict(info.metadata), info.quant_name) == ((), {}, None)
    assert info.parameter_count == 0


# --- paths that are not files ------------------------------------------------------------------


def test_missing_path_is_rejected(tmp_path: Path) -> None:
    expect_rejected(tmp_path / "nothing-here.gguf", "does not exist")


def test_directory_is_rejected(tmp_path: Path) -> None:
    expect_rejected(tmp_path, "is a folder")


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this OS")
def test_dev_zero_is_rejected_without_reading() -> None:
    expect_rejected(Path("/dev/zero"), "is a device")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this OS")
@pytest.mark.timeout(10)
def test_fifo_is_rejected_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)

    expect_rejected(fifo, "is a pipe")


@pytest.mark.skipif(
    sys.platform == "win32" or os.geteuid() == 0, reason="root reads files whatever their mode"
)
def test_unreadable_file_is_rejected(small_gguf: Path) -> None:
    small_gguf.chmod(0)
    try:
        error = expect_rejected(small_gguf, "not allowed to read")
    finally:
        small_gguf.chmod(0o600)
    assert error.hint is not None and "permissions" in error.hint


def test_messages_never_contain_the_path(tmp_path: Path, write: WriteFile) -> None:
    missing = tmp_path / "secret-user-name" / "model.gguf"

    errors = [expect_rejected(missing), expect_rejected(write(b"GGUF"))]

    assert all(str(tmp_path) not in error.user_text() for error in errors)


# --- properties --------------------------------------------------------------------------------

# Each example overwrites the same single file, so sharing tmp_path between examples is safe.
PROPERTY_SETTINGS = settings(
    max_examples=300,
    deadline=500,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@PROPERTY_SETTINGS
@given(
    content=st.one_of(
        st.binary(max_size=512),
        st.binary(max_size=512).map(lambda tail: b"GGUF\x03\x00\x00\x00" + tail),
    )
)
def test_random_bytes_give_info_or_validation_error(write: WriteFile, content: bytes) -> None:
    validate_within_limit(write(content))


@PROPERTY_SETTINGS
@given(data=st.data())
def test_mutated_real_file_gives_info_or_validation_error(
    write: WriteFile, small_gguf_bytes: bytes, data: st.DataObject
) -> None:
    mutated = bytearray(small_gguf_bytes)
    positions = st.integers(min_value=0, max_value=len(mutated) - 1)
    edits = data.draw(st.lists(st.tuples(positions, st.integers(0, 255)), max_size=8))
    for position, value in edits:
        mutated[position] = value
    length = data.draw(st.integers(min_value=0, max_value=len(mutated)))

    validate_within_limit(write(bytes(mutated[:length])))


# --- the real default model --------------------------------------------------------------------


@pytest.mark.slow
def test_default_model_validates_quickly(default_model_file: Path) -> None:
    start = time.perf_counter()
    info = validate_gguf(default_model_file)
    elapsed_s = time.perf_counter() - start

    assert elapsed_s < 2.0
    assert info.architecture == "gemma3"
    assert info.quant_name == "Q4_K_M"
    # The packaged Gemma 3 270M GGUF carries no tokenizer.chat_template (gguf's own reader
    # agrees), so the app must supply Gemma's template; this fails if the package changes.
    assert info.chat_template is None
    assert len(info.tensors) > 100
    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert isinstance(tokens, GGUFArraySummary) and tokens.length > 200_000
    assert max(t.offset + t.n_bytes for t in info.tensors) <= info.file_size
    assert 200_000_000 < info.parameter_count < 400_000_000
