"""`--api-key-file PATH`: a file the user names is read or created, never overwritten."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hearthside.core.server.keys import ApiKeyFileError, load_or_create_user_key_file

pytestmark = pytest.mark.beside

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX-only")
REFUSAL = "holds something that is not a Hearthside API key; Hearthside will not overwrite it."
HINT = "Point --api-key-file at a new path or at a key file Hearthside wrote."


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.mark.parametrize(
    "content",
    [b"my shopping list\nmilk\n", b"", b"\xff\xfe\x00binary", b"short", b"x" * 5000],
    ids=["text", "empty", "binary", "too-short", "too-long"],
)
def test_a_file_that_is_not_a_key_is_refused_and_left_alone(tmp_path: Path, content: bytes) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    folder.chmod(0o755)
    path = folder / "todo.txt"
    path.write_bytes(content)
    path.chmod(0o644)
    with pytest.raises(ApiKeyFileError) as caught:
        load_or_create_user_key_file(path)
    assert caught.value.message == f"{path} {REFUSAL}"
    assert caught.value.hint == HINT
    assert path.read_bytes() == content
    assert mode_of(path) == 0o644
    assert mode_of(folder) == 0o755
    assert sorted(p.name for p in folder.iterdir()) == ["todo.txt"]


@posix_only
def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "someone-elses-file"
    target.write_text("precious")
    link = tmp_path / "key"
    link.symlink_to(target)
    with pytest.raises(ApiKeyFileError, match="not a Hearthside API key"):
        load_or_create_user_key_file(link)
    assert link.is_symlink()
    assert target.read_text() == "precious"


@posix_only
def test_a_missing_file_in_an_existing_folder_is_created_private(tmp_path: Path) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o755)
    path = folder / "key"
    key = load_or_create_user_key_file(path)
    assert len(key) >= 43
    assert path.read_text().strip() == key
    assert mode_of(path) == 0o600
    assert mode_of(folder) == 0o755  # an existing folder keeps its mode
    assert [p.name for p in folder.iterdir()] == ["key"]


@posix_only
def test_missing_folders_are_created_private(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "key"
    load_or_create_user_key_file(path)
    assert mode_of(tmp_path / "new") == 0o700
    assert mode_of(tmp_path / "new" / "deeper") == 0o700
    assert mode_of(path) == 0o600


def test_a_key_file_hearthside_wrote_is_reused(tmp_path: Path) -> None:
    path = tmp_path / "key"
    key = load_or_create_user_key_file(path)
    assert load_or_create_user_key_file(path) == key
