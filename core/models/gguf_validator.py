"""A bounded, pure-Python GGUF validator that runs before any native load.

llama.cpp's GGUF parser has had memory-corruption bugs for lengths and tensor offsets that run
past the end of the file (the 2024 Talos set, CVE-2025-49847, CVE-2026-27940), and gguf 0.19's
`GGUFReader` loops with unbounded memory on a 43-byte file whose array claims 2^63 elements. So
this module reads the header, the metadata table and the tensor table itself: every length is
checked against the bytes left in the file before it is used, every count has a hard cap, and
the work and memory spent on one file have fixed budgets whatever the file claims.

Layout (GGUF v2/v3, little-endian):
    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x   (key: string, value_type u32, value)
    tensor_count x (name: string, n_dims u32, dims u64 x n_dims, ggml_type u32, offset u64)
    padding up to `general.alignment` (default 32), then the tensor data.
A string is a u64 byte length followed by UTF-8 bytes; an array is element_type u32, length u64,
then the elements.
"""

from __future__ import annotations

import math
import os
import re
import stat
import struct
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO, Final, NamedTuple, NoReturn

from gguf.constants import GGML_QUANT_SIZES, GGUFValueType

from hearthside.core.errors import ModelFileError

__all__ = [
    "GGUFArraySummary",
    "GGUFInfo",
    "GGUFTensor",
    "MAX_TRAILING_BYTES",
    "GGUFValidationError",
    "MetadataValue",
    "check_hyperparameters",
    "tensor_data_end",
    "validate_gguf",
]

_MAGIC: Final = b"GGUF"
_HEADER_BYTES: Final = 24
_SUPPORTED_VERSIONS: Final = frozenset({2, 3})
_DEFAULT_ALIGNMENT: Final = 32
_MAX_ALIGNMENT: Final = 1 << 16
_ALIGNMENT_KEY: Final = "general.alignment"

# Real models have tens of metadata entries and at most a few thousand tensors (even GGUFs with
# 128 unmerged experts per layer stay under 14k); the caps bound the Python objects one file can
# make us build to tens of MB and the walk over a crafted table to a fraction of a second.
_MAX_KV_PAIRS: Final = 1 << 14
_MAX_TENSORS: Final = 1 << 15
_MAX_KEY_BYTES: Final = 65_535
_MAX_TENSOR_NAME_BYTES: Final = 65_535
_MAX_VALUE_STRING_BYTES: Final = 16 << 20
_MAX_ARRAY_LENGTH: Final = 1 << 26
_MAX_KEPT_ARRAY_LENGTH: Final = 4096
_MAX_DIMS: Final = 4
_MAX_INT64: Final = (1 << 63) - 1

# Budgets for the whole file. Text and array values we keep bound memory; string-array and
# bool-array elements we step over one by one bound time (the biggest real vocabularies plus
# their merges are well under a million strings).
_MAX_KEPT_TEXT_BYTES: Final = 32 << 20
_MAX_KEPT_ARRAY_VALUES: Final = 1 << 18
_MAX_SCANNED_ELEMENTS: Final = 1 << 21

# Smallest possible encodings, used to refuse counts the file cannot hold before looping.
_MIN_KV_BYTES: Final = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES: Final = 8 + 1 + 4 + 8 + 4 + 8

_CHUNK_BYTES: Final = 1 << 20

# Writers pad the data section only up to `general.alignment` (at most 64 KiB), so a real file
# ends within one alignment step of its last tensor. Past that, bytes that belong to no tensor
# say the file is damaged or padded (a sparse 64 GiB file with a small model's header once got
# hashed for minutes and registered as a 68.7 GB model). 1 MiB leaves room for any writer's
# padding while refusing everything that could cost real time or disk.
MAX_TRAILING_BYTES: Final = 1 << 20

_REDOWNLOAD_HINT: Final = "Download the file again; it is damaged or not a GGUF model."

_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")

# A tensor entry after its name: the dims (u64 each), the ggml type (u32), the data offset (u64).
_TENSOR_TAILS: Final[Mapping[int, struct.Struct]] = {
    n_dims: struct.Struct(f"<{n_dims}QIQ") for n_dims in range(1, _MAX_DIMS + 1)
}

_SCALAR_FORMATS: Final[Mapping[int, str]] = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "B",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
_SCALAR_STRUCTS: Final[Mapping[int, struct.Struct]] = {
    value_type: struct.Struct("<" + code) for value_type, code in _SCALAR_FORMATS.items()
}

# ggml type id -> (name, values per block, bytes per block), for the types this gguf knows.
_GGML_TYPES: Final[Mapping[int, tuple[str, int, int]]] = {
    int(quant_type): (quant_type.name, block_size, type_bytes)
    for quant_type, (block_size, type_bytes) in GGML_QUANT_SIZES.items()
}

# llama.cpp include/llama.h `enum llama_ftype`; the gaps are ids llama.cpp has removed.
_LLAMA_FTYPE_NAMES: Final[Mapping[int, str]] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}


class GGUFValidationError(ModelFileError):
    """A model file is missing, unreadable or not a well-formed GGUF file."""


@dataclass(frozen=True)
class GGUFTensor:
    """One entry of the tensor table, with its data's place in the file checked."""

    name: str
    shape: tuple[int, ...]  # ggml order (ne0 first), as stored
    ggml_type: int
    type_name: str  # e.g. "Q4_K", "F16"
    offset: int  # absolute byte offset of the data in the file
    n_bytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class GGUFArraySummary:
    """A metadata array: its element type and length, and its values when small and numeric."""

    element_type: int  # GGUFValueType id of the elements
    length: int
    values: tuple[bool | int | float, ...] | None  # numeric/bool arrays of <= 4096 elements


MetadataValue = bool | int | float | str | GGUFArraySummary


@dataclass(frozen=True)
class GGUFInfo:
    """What a validated GGUF file holds; every offset and size in it has been checked."""

    path: Path
    file_size: int
    version: int
    alignment: int
    data_offset: int  # absolute offset where tensor data starts
    metadata: Mapping[str, MetadataValue] = field(hash=False)
    tensors: tuple[GGUFTensor, ...]

    @property
    def architecture(self) -> str | None:
        return self._text("general.architecture")

    @property
    def model_name(self) -> str | None:
        return self._text("general.name")

    @property
    def chat_template(self) -> str | None:
        return self._text("tokenizer.chat_template")

    @property
    def quant_name(self) -> str | None:
        """The llama.cpp file type name ("Q4_K_M"), else the tensor type holding most bytes."""
        file_type = self.metadata.get("general.file_type")
        if isinstance(file_type, int) and not isinstance(file_type, bool):
            name = _LLAMA_FTYPE_NAMES.get(file_type)
            if name is not None:
                return name
        return self._dominant_tensor_type()

    @property
    def parameter_count(self) -> int:
        return sum(tensor.n_elements for tensor in self.tensors)

    def to_dict(self) -> dict[str, object]:
        """A JSON-serialisable summary (non-finite floats become None)."""
        return {
            "path": str(self.path),
            "file_size": self.file_size,
            "version": self.version,
            "alignment": self.alignment,
            "data_offset": self.data_offset,
            "architecture": self.architecture,
            "model_name": self.model_name,
            "quant_name": self.quant_name,
            "parameter_count": self.parameter_count,
            "metadata": {key: _json_value(value) for key, value in self.metadata.items()},
            "tensors": [{**asdict(tensor), "shape": list(tensor.shape)} for tensor in self.tensors],
        }

    def _text(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def _dominant_tensor_type(self) -> str | None:
        bytes_by_type: Counter[str] = Counter()
        for tensor in self.tensors:
            bytes_by_type[tensor.type_name] += tensor.n_bytes
        most_common = bytes_by_type.most_common(1)
        return most_common[0][0] if most_common else None


def validate_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Check a GGUF file's structure with hard bounds; raise GGUFValidationError if malformed."""
    file_path = Path(path)
    try:
        with _open_regular_file(file_path) as stream:
            size = os.fstat(stream.fileno()).st_size
            return _parse(_BoundedReader(stream, size), file_path)
    except GGUFValidationError:
        raise
    except _Truncated as short:
        raise _malformed(f"it ends early: {short}") from None
    except MemoryError as exc:
        raise GGUFValidationError(
            "There was not enough memory to check the model file.",
            hint="Close other programs and try again.",
        ) from exc
    except OSError as exc:
        raise _unreadable(exc) from exc
    except (struct.error, UnicodeError, OverflowError) as exc:
        # Every read is length-checked first; this is the last line, so no raw error escapes.
        raise _malformed("its structure could not be read") from exc


# --- opening ---------------------------------------------------------------------------------


def _open_regular_file(path: Path) -> BinaryIO:
    # stat first so a FIFO or device is refused without opening it; O_NONBLOCK and the fstat
    # after opening cover a file swapped for one in between.
    _require_regular(_stat(path).st_mode)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    fd = os.open(path, flags)
    try:
        _require_regular(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb", buffering=0)


def _stat(path: Path) -> os.stat_result:
    try:
        return os.stat(path)
    except FileNotFoundError as exc:
        raise GGUFValidationError(
            "The model file does not exist.",
            hint="Check the path, or download the model again.",
        ) from exc
    except ValueError as exc:  # e.g. a NUL byte in the path
        raise GGUFValidationError(
            "The model path is not a valid file name.", hint="Choose the .gguf model file itself."
        ) from exc


def _require_regular(mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind = "a folder"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        kind = "a device"
    elif stat.S_ISFIFO(mode):
        kind = "a pipe"
    else:
        kind = "a special file"
    raise GGUFValidationError(
        f"The model path is {kind}, not a GGUF file.", hint="Choose the .gguf model file itself."
    )


def _unreadable(exc: OSError) -> GGUFValidationError:
    if isinstance(exc, PermissionError):
        return GGUFValidationError(
            "Hearthside is not allowed to read the model file.",
            hint="Check the file's permissions.",
        )
    reason = exc.strerror or type(exc).__name__
    return GGUFValidationError(
        f"The model file could not be read ({reason}).",
        hint="Check the disk, or download the model again.",
    )


def _malformed(detail: str) -> GGUFValidationError:
    return GGUFValidationError(
        f"This is not a valid GGUF model file: {detail}.", hint=_REDOWNLOAD_HINT
    )


# --- reading ---------------------------------------------------------------------------------


class _Truncated(Exception):
    """The file ended before a read; the caller adds which entry was being read."""

    def __init__(self, n_bytes: int, position: int, remaining: int) -> None:
        super().__init__(
            f"{n_bytes:,} bytes are needed at offset {position:,} but only {remaining:,} remain"
        )


class _BoundedReader:
    """Reads a file front to back through a 1 MiB window, checking lengths before using them."""

    def __init__(self, stream: BinaryIO, size: int) -> None:
        self.size = size
        self.position = 0
        self._stream = stream
        self._chunk = b""
        self._chunk_start = 0

    def remaining(self) -> int:
        return self.size - self.position

    def read(self, n_bytes: int) -> bytes:
        position = self.position
        if n_bytes > self.size - position:
            raise _Truncated(n_bytes, position, self.size - position)
        start = position - self._chunk_start
        if start + n_bytes <= len(self._chunk):
            data = self._chunk[start : start + n_bytes]
        elif n_bytes > _CHUNK_BYTES:
            data = self._read_at(position, n_bytes)
        else:
            self._refill()
            data = self._chunk[:n_bytes]
        self.position = position + n_bytes
        return data

    def skip(self, n_bytes: int) -> None:
        if n_bytes > self.remaining():
            raise _Truncated(n_bytes, self.position, self.remaining())
        self.position += n_bytes

    def u32(self) -> int:
        value: int = _U32.unpack(self.read(4))[0]
        return value

    def u64(self) -> int:
        value: int = _U64.unpack(self.read(8))[0]
        return value

    def skip_strings(self, count: int, max_bytes: int, where: str) -> None:
        """Step over `count` length-prefixed strings, checking each length without decoding."""
        # The hot loop of a 262k-token vocabulary, so it works on locals, not attributes.
        unpack_u64 = _U64.unpack_from
        chunk, chunk_start = self._chunk, self._chunk_start
        position, size = self.position, self.size
        for index in range(count):
            if position + 8 > chunk_start + len(chunk):
                if position + 8 > size:
                    raise _Truncated(8, position, size - position)
                self.position = position
                self._refill()
                chunk, chunk_start = self._chunk, self._chunk_start
            length: int = unpack_u64(chunk, position - chunk_start)[0]
            position += 8
            if length > max_bytes or length > size - position:
                raise _malformed(
                    f"string {index:,} in {where} claims {length:,} bytes but "
                    f"{min(size - position, max_bytes):,} is the most it can have"
                )
            position += length
        self.position = position

    def check_bools(self, count: int, where: str) -> None:
        left = count
        while left:
            data = self.read(min(left, _CHUNK_BYTES))
            if data.translate(None, b"\x00\x01"):
                raise _malformed(f"{where} holds a boolean that is neither 0 nor 1")
            left -= len(data)

    def _refill(self) -> None:
        self._chunk = self._read_at(self.position, min(_CHUNK_BYTES, self.remaining()))
        self._chunk_start = self.position

    def _read_at(self, offset: int, n_bytes: int) -> bytes:
        self._stream.seek(offset)
        parts = []
        left = n_bytes
        while left:
            part = self._stream.read(left)
            if not part:
                raise _malformed("it became shorter while it was being checked")
            parts.append(part)
            left -= len(part)
        return b"".join(parts)


@dataclass
class _Budget:
    """What one file may make us keep in memory or step over, summed over the whole file."""

    kept_text_bytes: int = 0
    kept_array_values: int = 0
    scanned_elements: int = 0

    def keep_text(self, n_bytes: int) -> None:
        self.kept_text_bytes += n_bytes
        if self.kept_text_bytes > _MAX_KEPT_TEXT_BYTES:
            raise _malformed(f"its names and texts exceed {_MAX_KEPT_TEXT_BYTES >> 20} MiB")

    def keep_array_values(self, count: int) -> None:
        self.kept_array_values += count
        if self.kept_array_values > _MAX_KEPT_ARRAY_VALUES:
            raise _malformed(f"its small arrays exceed {_MAX_KEPT_ARRAY_VALUES:,} values in all")

    def scan_elements(self, count: int) -> None:
        self.scanned_elements += count
        if self.scanned_elements > _MAX_SCANNED_ELEMENTS:
            raise _malformed(f"its arrays exceed {_MAX_SCANNED_ELEMENTS:,} strings or booleans")


def _read_text(
    reader: _BoundedReader, budget: _Budget, what: str, *, max_bytes: int, allow_empty: bool
) -> str:
    length = reader.u64()
    if length == 0 and not allow_empty:
        raise _malformed(f"{what} is empty")
    if length > max_bytes:
        raise _malformed(f"{what} is {length:,} bytes long; the limit is {max_bytes:,}")
    budget.keep_text(length)
    data = reader.read(length)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _malformed(f"{what} is not valid UTF-8 text") from None


# --- header ----------------------------------------------------------------------------------


def _parse(reader: _BoundedReader, path: Path) -> GGUFInfo:
    if reader.size < _HEADER_BYTES:
        detail = "the file is empty" if reader.size == 0 else f"it is only {reader.size:,} bytes"
        raise _malformed(f"{detail}, smaller than a GGUF header")
    version, tensor_count, kv_count = _read_header(reader)
    budget = _Budget()
    metadata, alignment = _read_metadata(reader, budget, kv_count)
    entries = _read_tensor_table(reader, budget, tensor_count)
    data_offset = _align_up(reader.position, alignment)
    tensors = _place_tensors(entries, data_offset, alignment, reader.size)
    _check_no_trailing_bytes(tensors, data_offset, alignment, reader.size)
    check_hyperparameters(metadata, tensors)
    return GGUFInfo(
        path=path,
        file_size=reader.size,
        version=version,
        alignment=alignment,
        data_offset=data_offset,
        metadata=MappingProxyType(metadata),
        tensors=tensors,
    )


def _read_header(reader: _BoundedReader) -> tuple[int, int, int]:
    if reader.read(4) != _MAGIC:
        raise _malformed('it does not start with the signature "GGUF"')
    version = reader.u32()
    _check_version(version)
    tensor_count = reader.u64()
    kv_count = reader.u64()
    _check_counts(tensor_count, kv_count, reader.remaining())
    return version, tensor_count, kv_count


def _check_version(version: int) -> None:
    if version in _SUPPORTED_VERSIONS:
        return
    if version == 1:
        raise GGUFValidationError(
            "This model file uses GGUF version 1, an obsolete format llama.cpp no longer reads.",
            hint="Download a current (version 3) GGUF of this model.",
        )
    if int.from_bytes(version.to_bytes(4, "little"), "big") in {1, *_SUPPORTED_VERSIONS}:
        raise GGUFValidationError(
            "This model file is a big-endian GGUF, which Hearthside does not support.",
            hint="Download the ordinary (little-endian) GGUF of this model.",
        )
    raise _malformed(f"its format version is {version:,}; only versions 2 and 3 exist")


def _check_counts(tensor_count: int, kv_count: int, remaining: int) -> None:
    if tensor_count > _MAX_TENSORS:
        raise _malformed(f"it claims {tensor_count:,} tensors; the limit is {_MAX_TENSORS:,}")
    if kv_count > _MAX_KV_PAIRS:
        raise _malformed(f"it claims {kv_count:,} metadata entries; the limit is {_MAX_KV_PAIRS:,}")
    needed = tensor_count * _MIN_TENSOR_INFO_BYTES + kv_count * _MIN_KV_BYTES
    if needed > remaining:
        raise _malformed(
            f"it claims {tensor_count:,} tensors and {kv_count:,} metadata entries, which need "
            f"at least {needed:,} bytes, but only {remaining:,} follow the header"
        )


def _align_up(offset: int, alignment: int) -> int:
    return (offset + alignment - 1) // alignment * alignment


# --- metadata --------------------------------------------------------------------------------


def _read_metadata(
    reader: _BoundedReader, budget: _Budget, kv_count: int
) -> tuple[dict[str, MetadataValue], int]:
    metadata: dict[str, MetadataValue] = {}
    alignment = _DEFAULT_ALIGNMENT
    for index in range(kv_count):
        try:
            key, value_type, value = _read_entry(reader, budget, metadata)
        except _Truncated as short:
            raise _malformed(f"it ends early in metadata entry {index + 1:,}: {short}") from None
        if key == _ALIGNMENT_KEY:
            alignment = _checked_alignment(value_type, value)
        metadata[key] = value
    return metadata, alignment


def _read_entry(
    reader: _BoundedReader, budget: _Budget, seen: Mapping[str, MetadataValue]
) -> tuple[str, int, MetadataValue]:
    key = _read_text(reader, budget, "a metadata key", max_bytes=_MAX_KEY_BYTES, allow_empty=False)
    if key in seen:
        raise _malformed(f'the metadata key "{_shorten(key)}" appears twice')
    value_type = reader.u32()
    return key, value_type, _read_value(reader, budget, value_type, key)


def _read_value(
    reader: _BoundedReader, budget: _Budget, value_type: int, key: str
) -> MetadataValue:
    if value_type == GGUFValueType.STRING:
        return _read_text(
            reader, budget, _describe_key(key), max_bytes=_MAX_VALUE_STRING_BYTES, allow_empty=True
        )
    if value_type == GGUFValueType.ARRAY:
        return _read_array(reader, budget, key)
    scalar = _SCALAR_STRUCTS.get(value_type)
    if scalar is None:
        raise _malformed(f"{_describe_key(key)} has unknown value type {value_type:,}")
    value: int | float = scalar.unpack(reader.read(scalar.size))[0]
    if value_type == GGUFValueType.BOOL:
        return _as_bool(value, key)
    return value


def _as_bool(value: int | float, key: str) -> bool:
    if value not in (0, 1):
        raise _malformed(f"{_describe_key(key)} holds a boolean stored as {value}, not 0 or 1")
    return bool(value)


def _read_array(reader: _BoundedReader, budget: _Budget, key: str) -> GGUFArraySummary:
    element_type = reader.u32()
    length = reader.u64()
    where = _describe_key(key)
    if element_type == GGUFValueType.ARRAY:
        # llama.cpp refuses arrays of arrays too, so no model it can run has one.
        raise _malformed(f"{where} is an array of arrays, which GGUF readers do not accept")
    if element_type != GGUFValueType.STRING and element_type not in _SCALAR_STRUCTS:
        raise _malformed(f"{where} is an array of unknown value type {element_type:,}")
    if length > _MAX_ARRAY_LENGTH:
        raise _malformed(f"{where} claims {length:,} elements; the limit is {_MAX_ARRAY_LENGTH:,}")
    if length * _min_element_bytes(element_type) > reader.remaining():
        raise _malformed(
            f"{where} claims {length:,} elements, more than the {reader.remaining():,} bytes "
            "left in the file can hold"
        )
    values = _read_array_values(reader, budget, element_type, length, where)
    return GGUFArraySummary(element_type=element_type, length=length, values=values)


def _min_element_bytes(element_type: int) -> int:
    if element_type == GGUFValueType.STRING:
        return 8  # its u64 length
    return _SCALAR_STRUCTS[element_type].size


def _read_array_values(
    reader: _BoundedReader, budget: _Budget, element_type: int, length: int, where: str
) -> tuple[bool | int | float, ...] | None:
    if element_type == GGUFValueType.STRING:
        budget.scan_elements(length)
        reader.skip_strings(length, _MAX_VALUE_STRING_BYTES, where)
        return None
    if length <= _MAX_KEPT_ARRAY_LENGTH:
        budget.keep_array_values(length)
        return _unpack_small_array(reader, element_type, length, where)
    if element_type == GGUFValueType.BOOL:
        budget.scan_elements(length)
        reader.check_bools(length, where)
        return None
    reader.skip(length * _min_element_bytes(element_type))
    return None


def _unpack_small_array(
    reader: _BoundedReader, element_type: int, length: int, where: str
) -> tuple[bool | int | float, ...]:
    data = reader.read(length * _min_element_bytes(element_type))
    values: tuple[int | float, ...] = struct.unpack(
        f"<{length}{_SCALAR_FORMATS[element_type]}", data
    )
    if element_type != GGUFValueType.BOOL:
        return values
    if data.translate(None, b"\x00\x01"):
        raise _malformed(f"{where} holds a boolean that is neither 0 nor 1")
    return tuple(bool(value) for value in values)


def _checked_alignment(value_type: int, value: MetadataValue) -> int:
    if value_type != GGUFValueType.UINT32 or not isinstance(value, int):
        type_name = _value_type_name(value_type)
        raise _malformed(f"{_ALIGNMENT_KEY} is a {type_name}, not a 32-bit unsigned integer")
    if not 1 <= value <= _MAX_ALIGNMENT or value & (value - 1):
        raise _malformed(
            f"{_ALIGNMENT_KEY} is {value:,}; it must be a power of two from 1 to {_MAX_ALIGNMENT:,}"
        )
    return value


def _value_type_name(value_type: int) -> str:
    try:
        return GGUFValueType(value_type).name
    except ValueError:
        return f"type {value_type}"


def _describe_key(key: str) -> str:
    return f'metadata "{_shorten(key)}"'


def _shorten(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --- tensors ---------------------------------------------------------------------------------


class _TensorEntry(NamedTuple):
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    relative_offset: int


def _read_tensor_table(
    reader: _BoundedReader, budget: _Budget, tensor_count: int
) -> list[_TensorEntry]:
    entries: list[_TensorEntry] = []
    seen_names: set[str] = set()
    for index in range(tensor_count):
        try:
            entry = _read_tensor_entry(reader, budget)
        except _Truncated as short:
            raise _malformed(f"it ends early in tensor {index + 1:,}: {short}") from None
        if entry.name in seen_names:
            raise _malformed(f'the tensor name "{_shorten(entry.name)}" appears twice')
        seen_names.add(entry.name)
        entries.append(entry)
    return entries


def _read_tensor_entry(reader: _BoundedReader, budget: _Budget) -> _TensorEntry:
    name = _read_text(
        reader, budget, "a tensor name", max_bytes=_MAX_TENSOR_NAME_BYTES, allow_empty=False
    )
    n_dims = reader.u32()
    if not 1 <= n_dims <= _MAX_DIMS:
        raise _malformed(
            f"{_describe_tensor(name)} has {n_dims:,} dimensions; it must have 1 to {_MAX_DIMS}"
        )
    # The dims, the type and the offset in one read: this loop runs once per tensor.
    layout = _TENSOR_TAILS[n_dims]
    *shape, ggml_type, relative_offset = layout.unpack(reader.read(layout.size))
    return _TensorEntry(name, tuple(shape), ggml_type, relative_offset)


def _describe_tensor(name: str) -> str:
    return f'tensor "{_shorten(name)}"'


def _place_tensors(
    entries: list[_TensorEntry], data_offset: int, alignment: int, file_size: int
) -> tuple[GGUFTensor, ...]:
    tensors = tuple(_place_tensor(entry, data_offset, alignment, file_size) for entry in entries)
    _check_no_overlap(tensors)
    return tensors


def _place_tensor(
    entry: _TensorEntry, data_offset: int, alignment: int, file_size: int
) -> GGUFTensor:
    type_name, n_bytes = _checked_size(entry)
    if entry.relative_offset % alignment:
        raise _malformed(
            f"{_describe_tensor(entry.name)} starts at data offset {entry.relative_offset:,}, "
            f"not a multiple of the alignment {alignment}"
        )
    offset = data_offset + entry.relative_offset
    if offset + n_bytes > file_size:
        raise _malformed(
            f"{_describe_tensor(entry.name)} needs bytes {offset:,} to {offset + n_bytes:,} "
            f"but the file is {file_size:,} bytes long"
        )
    return GGUFTensor(entry.name, entry.shape, entry.ggml_type, type_name, offset, n_bytes)


def tensor_data_end(tensors: tuple[GGUFTensor, ...], data_offset: int, alignment: int) -> int:
    """Where the file's tensor data end, padded to the alignment as writers pad it."""
    last_byte = max((tensor.offset + tensor.n_bytes for tensor in tensors), default=data_offset)
    return _align_up(last_byte, alignment)


def _check_no_trailing_bytes(
    tensors: tuple[GGUFTensor, ...], data_offset: int, alignment: int, file_size: int
) -> None:
    data_end = tensor_data_end(tensors, data_offset, alignment)
    trailing_bytes = file_size - data_end
    if trailing_bytes <= MAX_TRAILING_BYTES:
        return
    raise GGUFValidationError(
        f"This model file is {file_size:,} bytes long, but its model data end at byte "
        f"{data_end:,}: the other {trailing_bytes:,} bytes belong to no part of the model. "
        "The file is damaged, or something was appended to it.",
        hint="Download the model again, or choose the original .gguf file.",
    )


def _checked_size(entry: _TensorEntry) -> tuple[str, int]:
    """The type's name and the tensor's size in bytes, after checking shape and type."""
    shape = entry.shape
    if min(shape) == 0 or max(shape) > _MAX_INT64:
        raise _malformed(
            f"{_describe_tensor(entry.name)} has an invalid dimension in its shape {list(shape)}"
        )
    n_elements = math.prod(shape)
    if n_elements > _MAX_INT64:
        raise _malformed(
            f"{_describe_tensor(entry.name)} has a shape {list(shape)} "
            "with more than 2^63-1 elements"
        )
    known = _GGML_TYPES.get(entry.ggml_type)
    if known is None:
        raise _malformed(
            f"{_describe_tensor(entry.name)} has unknown tensor type {entry.ggml_type:,}"
        )
    type_name, block_size, type_bytes = known
    if shape[0] % block_size:
        raise _malformed(
            f"{_describe_tensor(entry.name)} has rows of {shape[0]:,} values, not a multiple "
            f"of the {type_name} block size {block_size}"
        )
    return type_name, n_elements // block_size * type_bytes


def _check_no_overlap(tensors: tuple[GGUFTensor, ...]) -> None:
    by_offset = sorted(tensors, key=lambda tensor: tensor.offset)
    for previous, current in pairwise(by_offset):
        if current.offset < previous.offset + previous.n_bytes:
            raise _malformed(
                f'the data of tensors "{_shorten(previous.name)}" and '
                f'"{_shorten(current.name)}" overlap'
            )


# --- hyperparameters -------------------------------------------------------------------------
#
# A well-formed file can still hold numbers that make llama.cpp abort (GGML_ASSERT on a layer
# count of 0 or above LLAMA_MAX_LAYERS, an expert count above LLAMA_MAX_EXPERTS), spin forever
# (a NaN norm epsilon) or silently compute garbage (a zero or infinite epsilon). They are
# refused here, before anything native sees them; anything subtler is left to the child load.

_MAX_LAYERS: Final = 512  # llama.cpp's LLAMA_MAX_LAYERS
_MAX_EXPERTS: Final = 512  # llama.cpp's LLAMA_MAX_EXPERTS
_MAX_CONTEXT_LENGTH: Final = 1 << 24  # 16.7M tokens; the longest real models claim 10M
_MAX_EMBEDDING_LENGTH: Final = 1 << 17  # the widest real models are under 32k
_MAX_HEADS: Final = 1 << 12
_MAX_FEED_FORWARD_LENGTH: Final = 1 << 20
_SPLIT_COUNT_KEY: Final = "split.count"
_LAYER_TENSOR: Final = re.compile(r"blk\.(\d+)\.")
_ATTENTION_TENSOR: Final = re.compile(r"blk\.\d+\.attn_(?:q|k|qkv)\.weight")
_DAMAGED_HINT: Final = "Download the model again, or choose another file."


def check_hyperparameters(
    metadata: Mapping[str, MetadataValue], tensors: tuple[GGUFTensor, ...]
) -> None:
    """Refuse architecture numbers that crash, hang or corrupt llama.cpp's loader."""
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        return  # not a model llama.cpp would run; it refuses such a file cleanly
    numbers = _ArchNumbers(metadata, arch)
    _check_layers(numbers, metadata, tensors)
    _check_count(numbers, "context_length", "context length", "tokens", _MAX_CONTEXT_LENGTH)
    _check_count(numbers, "embedding_length", "embedding width", "values", _MAX_EMBEDDING_LENGTH)
    _check_heads(numbers, tensors)
    _check_feed_forward(numbers)
    _check_experts(numbers)
    _check_floats(numbers)


class _ArchNumbers:
    """The `<arch>.` metadata of one file, read as numbers."""

    def __init__(self, metadata: Mapping[str, MetadataValue], arch: str) -> None:
        self.prefix = f"{arch}."
        self.metadata = metadata

    def integer(self, name: str) -> int | None:
        """The key's integer value, None when absent; refuses any other kind of value."""
        value = self.metadata.get(self.prefix + name)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            _refuse(f"the model's {name} is not a whole number")
        return value

    def values(self, name: str) -> tuple[int | float, ...]:
        """A scalar key as one value, a small per-layer array as its values, else nothing."""
        value = self.metadata.get(self.prefix + name)
        if isinstance(value, GGUFArraySummary):
            return tuple(v for v in value.values or () if not isinstance(v, bool))
        if isinstance(value, int | float) and not isinstance(value, bool):
            return (value,)
        return ()

    def floats(self) -> list[tuple[str, float]]:
        found = []
        for key, value in self.metadata.items():
            if not key.startswith(self.prefix):
                continue
            scalars = value.values or () if isinstance(value, GGUFArraySummary) else (value,)
            found += [(key[len(self.prefix) :], v) for v in scalars if isinstance(v, float)]
        return found


def _refuse(what: str) -> NoReturn:
    raise GGUFValidationError(
        f"This file says {what}; it is damaged or not a model.", hint=_DAMAGED_HINT
    )


def _check_layers(
    numbers: _ArchNumbers, metadata: Mapping[str, MetadataValue], tensors: tuple[GGUFTensor, ...]
) -> None:
    layers = numbers.integer("block_count")
    if layers is None:
        return
    if layers < 1:
        _refuse(f"the model has {layers:,} layers")
    if layers > _MAX_LAYERS:
        _refuse(f"the model has {layers:,} layers, more than the {_MAX_LAYERS} llama.cpp can load")
    split_count = metadata.get(_SPLIT_COUNT_KEY)
    if not tensors or (isinstance(split_count, int) and split_count > 1):
        return  # a vocabulary-only file, or one part of a split model: the weights are elsewhere
    present = 1 + max((_layer_index(tensor.name) for tensor in tensors), default=-1)
    if layers > present:
        _refuse(f"the model has {layers:,} layers, but it holds the weights of only {present:,}")


def _layer_index(tensor_name: str) -> int:
    match = _LAYER_TENSOR.match(tensor_name)
    return int(match.group(1)) if match else -1


def _check_count(numbers: _ArchNumbers, name: str, words: str, unit: str, limit: int) -> None:
    value = numbers.integer(name)
    if value is None:
        return
    if value < 1:
        _refuse(f"the model's {words} is {value:,} {unit}")
    if value > limit:
        _refuse(f"the model's {words} is {value:,} {unit}, more than any model has ({limit:,})")


def _check_heads(numbers: _ArchNumbers, tensors: tuple[GGUFTensor, ...]) -> None:
    has_attention = any(_ATTENTION_TENSOR.match(tensor.name) for tensor in tensors)
    for name in ("attention.head_count", "attention.head_count_kv"):
        values = numbers.values(name)
        if any(not 0 <= value <= _MAX_HEADS for value in values):
            shown = max(values, key=lambda value: abs(value))
            _refuse(f"the model has {shown:,} attention heads ({name})")
        if values and has_attention and not any(values):
            # Recurrent models (Mamba, RWKV) have 0 heads, but also no attention weights.
            _refuse(f"the model has 0 attention heads ({name}) though it has attention weights")


def _check_feed_forward(numbers: _ArchNumbers) -> None:
    values = numbers.values("feed_forward_length")
    if any(not 0 <= value <= _MAX_FEED_FORWARD_LENGTH for value in values):
        shown = max(values, key=lambda value: abs(value))
        _refuse(f"the model's feed-forward width is {shown:,} values")


def _check_experts(numbers: _ArchNumbers) -> None:
    experts = numbers.integer("expert_count") or 0
    used = numbers.integer("expert_used_count") or 0
    if not 0 <= experts <= _MAX_EXPERTS:
        _refuse(
            f"the model has {experts:,} experts, more than the {_MAX_EXPERTS} llama.cpp can load"
        )
    if experts and not 1 <= used <= experts:
        _refuse(f"the model uses {used:,} of its {experts:,} experts per token")
    if used and not experts:
        _refuse(f"the model uses {used:,} experts per token but has none")


def _check_floats(numbers: _ArchNumbers) -> None:
    for name, value in numbers.floats():
        if not math.isfinite(value):
            _refuse(f"the model's {name} is {value}, not a number it can compute with")
        if _is_epsilon(name) and value <= 0:
            # llama.cpp asserts on a negative one; zero divides by zero in every norm.
            _refuse(f"the model's normalisation epsilon ({name}) is {value}, not above 0")


def _is_epsilon(name: str) -> bool:
    return name.endswith(("epsilon", "_eps"))


def _json_value(value: MetadataValue) -> object:
    if isinstance(value, GGUFArraySummary):
        values = None if value.values is None else [_json_value(v) for v in value.values]
        return {"element_type": value.element_type, "length": value.length, "values": values}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
