"""Can one model draft for another? Compare their tokenizers from GGUF metadata alone.

Speculative decoding passes token ids from the draft to the target, so both must mean the
same text by the same id: the same tokenizer kind, the same token texts and token types, and
the same BOS/EOS/EOT ids. Like llama.cpp's own check, a vocabulary padded by at most
`MAX_VOCAB_SIZE_DIFFERENCE` tokens (same family, another size) still fits, as long as the
ids both have agree; a draft then never proposes an id the target lacks (speculative.py).

The texts are hashed straight from the file after `validate_gguf` has checked its structure:
no native load, and no `gguf.GGUFReader` (SECURITY.md).
"""

from __future__ import annotations

import functools
import hashlib
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO, Final

from gguf.constants import GGUFValueType

from hearthside.core.errors import EngineError, HearthsideError
from hearthside.core.models.gguf_validator import GGUFArraySummary, GGUFInfo, validate_gguf
from hearthside.core.models.store import ModelRecord, ModelStore

# llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE: padding rows that a same-family model may add.
MAX_VOCAB_SIZE_DIFFERENCE: Final = 128
TOKENS_KEY: Final = "tokenizer.ggml.tokens"
TOKEN_TYPES_KEY: Final = "tokenizer.ggml.token_type"
SPECIAL_TOKEN_KEYS: Final[dict[str, str]] = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}
_FLAG_KEYS: Final[dict[str, str]] = {
    "add_bos": "tokenizer.ggml.add_bos_token",
    "add_eos": "tokenizer.ggml.add_eos_token",
}
_SCALAR_SIZES: Final[dict[int, int]] = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_READ_BUFFER_BYTES: Final = 1 << 20


class VocabularyError(EngineError):
    """A draft model's vocabulary does not match the model it should draft for."""


@dataclass(frozen=True)
class VocabInfo:
    """A model's tokenizer, summarised for comparison (ids of special tokens; -1 if none)."""

    tokenizer: str | None  # tokenizer.ggml.model: "llama" (SPM), "gpt2" (BPE), ...
    pre_tokenizer: str | None
    size: int
    tokens_sha256: str  # over every token text, in id order
    token_types_sha256: str
    special: dict[str, int]
    add_bos: bool | None
    add_eos: bool | None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class VocabCheck:
    """Whether `draft` can draft for `target`, and if not, why (in words for the user)."""

    compatible: bool
    reason: str | None = None


@dataclass(frozen=True)
class DraftCandidate:
    """A registered model and whether it can draft for the model asked about."""

    record: ModelRecord
    check: VocabCheck
    relative_size: float  # draft file bytes / target file bytes: its decode cost, roughly
    variant: bool  # a re-quantization of the same model (or the model it came from)


def vocab_info(path: Path) -> VocabInfo:
    """The tokenizer summary of a GGUF file (validated first)."""
    path = Path(path)
    stat = path.stat()
    return _cached_vocab_info(str(path.resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _cached_vocab_info(path: str, _size: int, _mtime_ns: int) -> VocabInfo:
    info = validate_gguf(path)
    texts, types = _token_hashes(info, limit=None)
    size = _array_length(info, TOKENS_KEY)
    return VocabInfo(
        tokenizer=_text(info, "tokenizer.ggml.model"),
        pre_tokenizer=_text(info, "tokenizer.ggml.pre"),
        size=size,
        tokens_sha256=texts,
        token_types_sha256=types,
        special={name: _int(info, key) for name, key in SPECIAL_TOKEN_KEYS.items()},
        add_bos=_flag(info, _FLAG_KEYS["add_bos"]),
        add_eos=_flag(info, _FLAG_KEYS["add_eos"]),
    )


def check_draft(target_path: Path, draft_path: Path) -> VocabCheck:
    """Whether the model in `draft_path` can draft for the one in `target_path`."""
    target, draft = vocab_info(target_path), vocab_info(draft_path)
    if target.size == 0 or draft.size == 0:
        return VocabCheck(False, "one of the models has no vocabulary in its file")
    if target.tokenizer != draft.tokenizer:
        return VocabCheck(
            False, f"the tokenizers differ ({target.tokenizer} and {draft.tokenizer})"
        )
    if abs(target.size - draft.size) > MAX_VOCAB_SIZE_DIFFERENCE:
        return VocabCheck(False, f"the vocabularies have {target.size:,} and {draft.size:,} tokens")
    if (reason := _special_tokens_differ(target, draft)) is not None:
        return VocabCheck(False, reason)
    if not _same_tokens(target, draft, Path(target_path), Path(draft_path)):
        return VocabCheck(False, "the same token ids stand for different texts")
    return VocabCheck(True)


def require_compatible_draft(target_path: Path, draft_path: Path) -> None:
    """Raise `VocabularyError` (with the reason) unless the draft fits the target."""
    check = check_draft(target_path, draft_path)
    if not check.compatible:
        raise VocabularyError(
            f"{Path(draft_path).name} cannot draft for {Path(target_path).name}: {check.reason}.",
            hint="Choose a draft from the same model family (a smaller size or a lower-bit "
            "variant of this model), or use prompt lookup instead.",
        )


def draft_candidates(store: ModelStore, model_id: str) -> list[DraftCandidate]:
    """Every other registered model, checked as a draft for `model_id`; smallest first."""
    target = store.get(model_id)
    candidates = []
    for record in store.list():
        if record.id == target.id:
            continue
        check = _checked(target.path, record.path)
        related = model_id in (record.variant_of, record.id) or record.id == target.variant_of
        relative = record.size_bytes / target.size_bytes if target.size_bytes else 1.0
        candidates.append(DraftCandidate(record, check, relative, related))
    return sorted(candidates, key=lambda c: (not c.variant, c.relative_size, c.record.id))


def compatible_drafts(store: ModelStore, model_id: str) -> list[DraftCandidate]:
    """Registered models that can draft for `model_id` and are smaller than it.

    A draft at least as big as the target costs as much per token as the target itself, so
    no acceptance rate could make it pay.
    """
    return [
        candidate
        for candidate in draft_candidates(store, model_id)
        if candidate.check.compatible and candidate.relative_size < 1.0
    ]


def _checked(target_path: Path, draft_path: Path) -> VocabCheck:
    try:
        return check_draft(target_path, draft_path)
    except OSError as exc:
        return VocabCheck(False, f"its file could not be read ({exc.strerror or exc})")
    except HearthsideError as exc:  # a damaged file is a reason, never a crash of the listing
        return VocabCheck(False, exc.message)


def _special_tokens_differ(target: VocabInfo, draft: VocabInfo) -> str | None:
    for name in SPECIAL_TOKEN_KEYS:
        if target.special[name] != draft.special[name]:
            return (
                f"their {name.upper()} tokens differ "
                f"({target.special[name]} and {draft.special[name]})"
            )
    if target.add_bos != draft.add_bos:
        return "one adds a BOS token to the prompt and the other does not"
    return None


def _same_tokens(target: VocabInfo, draft: VocabInfo, target_path: Path, draft_path: Path) -> bool:
    if target.size == draft.size:
        return (target.tokens_sha256, target.token_types_sha256) == (
            draft.tokens_sha256,
            draft.token_types_sha256,
        )
    shared = min(target.size, draft.size)
    return _prefix_hashes(target_path, shared) == _prefix_hashes(draft_path, shared)


def _prefix_hashes(path: Path, limit: int) -> tuple[str, str]:
    return _token_hashes(validate_gguf(path), limit=limit)


# --- reading the two token arrays ---------------------------------------------------------


def _token_hashes(info: GGUFInfo, *, limit: int | None) -> tuple[str, str]:
    """sha256 of the first `limit` (or all) token texts and of their types."""
    texts, types = hashlib.sha256(), hashlib.sha256()
    with _open(info.path) as stream:
        reader = _Reader(stream)
        reader.skip(4 + 4 + 8)  # magic, version, tensor count
        for _ in range(reader.u64()):
            key = reader.string().decode("utf-8", "replace")
            value_type = reader.u32()
            if key == TOKENS_KEY and value_type == GGUFValueType.ARRAY:
                _hash_strings(reader, texts, limit)
            elif key == TOKEN_TYPES_KEY and value_type == GGUFValueType.ARRAY:
                _hash_scalars(reader, types, limit)
            else:
                _skip_value(reader, value_type)
    return texts.hexdigest(), types.hexdigest()


def _hash_strings(reader: _Reader, digest: hashlib._Hash, limit: int | None) -> None:
    element_type, length = reader.u32(), reader.u64()
    if element_type != GGUFValueType.STRING:
        _skip_elements(reader, element_type, length)
        return
    for index in range(length):
        text = reader.string()
        if limit is None or index < limit:
            digest.update(_U64.pack(len(text)))
            digest.update(text)


def _hash_scalars(reader: _Reader, digest: hashlib._Hash, limit: int | None) -> None:
    element_type, length = reader.u32(), reader.u64()
    size = _SCALAR_SIZES.get(element_type)
    if size is None:
        _skip_elements(reader, element_type, length)
        return
    kept = length if limit is None else min(limit, length)
    digest.update(reader.read(kept * size))
    reader.skip((length - kept) * size)


def _skip_value(reader: _Reader, value_type: int) -> None:
    if value_type == GGUFValueType.STRING:
        reader.skip(reader.u64())
    elif value_type == GGUFValueType.ARRAY:
        element_type, length = reader.u32(), reader.u64()
        _skip_elements(reader, element_type, length)
    else:
        reader.skip(_SCALAR_SIZES[value_type])


def _skip_elements(reader: _Reader, element_type: int, length: int) -> None:
    if element_type == GGUFValueType.STRING:
        for _ in range(length):
            reader.skip(reader.u64())
    else:
        reader.skip(_SCALAR_SIZES[element_type] * length)


class _Reader:
    """Sequential reads over a file `validate_gguf` has passed; short reads still raise."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream

    def read(self, n_bytes: int) -> bytes:
        data = self._stream.read(n_bytes)
        if len(data) != n_bytes:
            raise VocabularyError("The model file changed while its vocabulary was read.")
        return data

    def skip(self, n_bytes: int) -> None:
        self._stream.seek(n_bytes, os.SEEK_CUR)

    def u32(self) -> int:
        value: int = _U32.unpack(self.read(4))[0]
        return value

    def u64(self) -> int:
        value: int = _U64.unpack(self.read(8))[0]
        return value

    def string(self) -> bytes:
        return self.read(self.u64())


def _open(path: Path) -> BinaryIO:
    return open(path, "rb", buffering=_READ_BUFFER_BYTES)  # noqa: SIM115 - returned to a with


# --- metadata values -----------------------------------------------------------------------


def _text(info: GGUFInfo, key: str) -> str | None:
    value = info.metadata.get(key)
    return value if isinstance(value, str) else None


def _int(info: GGUFInfo, key: str) -> int:
    value = info.metadata.get(key)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return -1


def _flag(info: GGUFInfo, key: str) -> bool | None:
    value = info.metadata.get(key)
    return value if isinstance(value, bool) else None


def _array_length(info: GGUFInfo, key: str) -> int:
    value = info.metadata.get(key)
    return value.length if isinstance(value, GGUFArraySummary) else 0
