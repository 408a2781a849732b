"""Draft/target vocabulary checks from GGUF metadata, on real files written with `gguf`."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from hearthside.core.models.store import ModelStore
from hearthside.core.models.vocab import (
    VocabularyError,
    check_draft,
    compatible_drafts,
    draft_candidates,
    require_compatible_draft,
    vocab_info,
)
from hearthside.core.paths import data_dir

pytestmark = pytest.mark.beside

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def base_tokens(extra: int = 40) -> list[str]:
    return ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))] + [
        f"▁w{index}" for index in range(extra)
    ]


def write_vocab_gguf(
    path: Path,
    tokens: list[str],
    *,
    tokenizer: str = "llama",
    bos: int = 1,
    eos: int = 2,
    eot: int | None = None,
    padding_bytes: int = 0,
) -> Path:
    """A small GGUF with a vocabulary and one tensor (`padding_bytes` more make it bigger)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * (len(tokens) - 259)
    writer.add_token_types(types)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    if eot is not None:
        writer.add_eot_token_id(eot)
    writer.add_add_bos_token(True)
    size = 16 + padding_bytes // 4
    writer.add_tensor("output_norm.weight", np.ones(size, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_the_same_vocabulary_in_two_files_is_compatible(tmp_path: Path) -> None:
    target = write_vocab_gguf(tmp_path / "target.gguf", base_tokens(), padding_bytes=4096)
    draft = write_vocab_gguf(tmp_path / "draft.gguf", base_tokens())
    assert check_draft(target, draft).compatible
    info = vocab_info(target)
    assert info.size == 299 and info.special["bos"] == 1 and info.special["eot"] == -1
    assert info.tokens_sha256 == vocab_info(draft).tokens_sha256


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"tokens": base_tokens()[:-1] + ["▁other"]}, "different texts"),
        ({"tokenizer": "gpt2"}, "tokenizers differ"),
        ({"eos": 0}, "EOS tokens differ"),
        ({"eot": 5}, "EOT tokens differ"),
        ({"tokens": base_tokens(extra=400)}, "299 and 659 tokens"),
    ],
)
def test_a_different_vocabulary_is_refused_with_the_reason(
    tmp_path: Path, change: dict[str, object], reason: str
) -> None:
    target = write_vocab_gguf(tmp_path / "target.gguf", base_tokens())
    options = {"tokens": base_tokens(), **change}
    draft = write_vocab_gguf(tmp_path / "draft.gguf", **options)  # type: ignore[arg-type]
    check = check_draft(target, draft)
    assert not check.compatible and reason in (check.reason or ""), check
    with pytest.raises(VocabularyError) as raised:
        require_compatible_draft(target, draft)
    assert reason in raised.value.message and raised.value.hint


def test_a_padded_vocabulary_of_the_same_family_fits(tmp_path: Path) -> None:
    # Same texts for the shared ids, a few more (padding) tokens: llama.cpp's rule allows it.
    target = write_vocab_gguf(tmp_path / "target.gguf", base_tokens(extra=40))
    draft = write_vocab_gguf(tmp_path / "draft.gguf", base_tokens(extra=100))
    assert check_draft(target, draft).compatible
    changed = base_tokens(extra=100)
    changed[270] = "▁changed"
    other = write_vocab_gguf(tmp_path / "other.gguf", changed)
    assert "different texts" in (check_draft(target, other).reason or "")


def test_the_default_model_checks_against_itself_and_a_stranger(
    default_model_file: Path, tmp_path: Path
) -> None:
    assert check_draft(default_model_file, default_model_file).compatible
    info = vocab_info(default_model_file)
    assert info.size == 262_144 and info.tokenizer == "llama" and info.add_bos is True
    stranger = write_vocab_gguf(tmp_path / "stranger.gguf", base_tokens())
    assert "262,144" in (check_draft(default_model_file, stranger).reason or "")


def test_compatible_drafts_lists_smaller_same_vocabulary_models(tmp_path: Path) -> None:
    with ModelStore(data_dir()) as store:
        models = store.models_dir
        big = write_vocab_gguf(models / "big.gguf", base_tokens(), padding_bytes=64 << 10)
        store.register_installed(big, model_id="big", source="file", check_native=False)
        for model_id, options in {
            "big-q2": {},
            "small": {"padding_bytes": 1024},
            "huge": {"padding_bytes": 256 << 10},
            "alien": {"tokenizer": "gpt2"},
        }.items():
            path = write_vocab_gguf(models / f"{model_id}.gguf", base_tokens(), **options)  # type: ignore[arg-type]
            store.register_installed(
                path,
                model_id=model_id,
                source="quantized:big" if model_id == "big-q2" else "file",
                variant_of="big" if model_id == "big-q2" else None,
                check_native=False,
            )
        drafts = compatible_drafts(store, "big")
        assert [candidate.record.id for candidate in drafts] == ["big-q2", "small"]
        assert drafts[0].variant and not drafts[1].variant
        assert all(0 < candidate.relative_size < 1 for candidate in drafts)
        every = {candidate.record.id: candidate for candidate in draft_candidates(store, "big")}
        assert "tokenizers differ" in (every["alien"].check.reason or "")
        assert every["huge"].check.compatible and every["huge"].relative_size > 1
