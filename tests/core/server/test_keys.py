"""The per-install API key file and the loopback-only rule for key-less binds."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hearthside.core.errors import HearthsideError
from hearthside.core.server.keys import (
    UnsafeBindError,
    check_bind_is_safe,
    is_loopback_host,
    load_or_create_api_key,
)

pytestmark = pytest.mark.beside

posix_only = pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX-only")


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_new_key_is_long_random_and_urlsafe(tmp_path: Path) -> None:
    key = load_or_create_api_key(tmp_path / "api_key")
    assert len(key) >= 43
    assert key.replace("-", "").replace("_", "").isalnum()
    assert load_or_create_api_key(tmp_path / "other_key") != key


@posix_only
def test_new_key_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    load_or_create_api_key(path)
    assert mode_of(path) == 0o600


@posix_only
def test_new_key_file_is_private_even_with_a_permissive_umask(tmp_path: Path) -> None:
    old_umask = os.umask(0)
    try:
        path = tmp_path / "api_key"
        load_or_create_api_key(path)
    finally:
        os.umask(old_umask)
    assert mode_of(path) == 0o600


def test_second_call_returns_the_same_key(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    assert load_or_create_api_key(path) == load_or_create_api_key(path)


def test_key_is_returned_stripped(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    key = "k" * 43
    path.write_text(f"  {key}\n\n")
    assert load_or_create_api_key(path) == key


def test_no_draft_files_are_left_behind(tmp_path: Path) -> None:
    load_or_create_api_key(tmp_path / "api_key")
    assert [p.name for p in tmp_path.iterdir()] == ["api_key"]


def test_missing_parent_dir_is_created_private(tmp_path: Path) -> None:
    path = tmp_path / "data" / "api_key"
    load_or_create_api_key(path)
    assert path.is_file()
    if os.name == "posix":
        assert mode_of(path.parent) == 0o700


@posix_only
def test_wider_permissions_are_tightened_and_key_kept(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    key = load_or_create_api_key(path)
    path.chmod(0o644)
    assert load_or_create_api_key(path) == key
    assert mode_of(path) == 0o600


@pytest.mark.parametrize(
    "content",
    [b"", b"   \n", b"\xff\xfe\x00garbage", b"short", b"has spaces inside the key value......"],
    ids=["empty", "blank", "binary", "too-short", "spaces"],
)
def test_empty_or_corrupt_file_is_regenerated(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "api_key"
    path.write_bytes(content)
    key = load_or_create_api_key(path)
    assert len(key) >= 43
    assert path.read_text().strip() == key
    assert load_or_create_api_key(path) == key
    if os.name == "posix":
        assert mode_of(path) == 0o600


@posix_only
def test_symlinked_key_file_is_replaced_not_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "someone-elses-file"
    elsewhere.write_text("x" * 43)
    path = tmp_path / "api_key"
    path.symlink_to(elsewhere)
    key = load_or_create_api_key(path)
    assert key != "x" * 43
    assert not path.is_symlink()
    assert elsewhere.read_text() == "x" * 43


def test_unreadable_location_raises_a_plain_error(tmp_path: Path) -> None:
    path = tmp_path / "api_key"
    path.mkdir()  # a directory where the file should be
    with pytest.raises(HearthsideError) as caught:
        load_or_create_api_key(path)
    assert "Traceback" not in caught.value.user_text()


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.1.2.3", "127.255.255.254", "::1", "[::1]", "localhost", "LOCALHOST"]
)
def test_loopback_hosts(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "192.168.1.5", "10.0.0.2", "fe80::1", "example.com", "", "128.0.0.1"]
)
def test_non_loopback_hosts(host: str) -> None:
    assert not is_loopback_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "studio.local"])
@pytest.mark.parametrize("api_key", [None, "", "   "])
def test_unsafe_bind_without_key_is_refused(host: str, api_key: str | None) -> None:
    with pytest.raises(UnsafeBindError) as caught:
        check_bind_is_safe(host, api_key)
    assert caught.value.hint
    assert isinstance(caught.value, HearthsideError)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5"])
def test_non_loopback_bind_with_key_is_allowed(host: str) -> None:
    check_bind_is_safe(host, "a-real-key-" + "x" * 32)


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
@pytest.mark.parametrize("api_key", [None, "a-real-key-" + "x" * 32])
def test_loopback_bind_is_always_allowed(host: str, api_key: str | None) -> None:
    check_bind_is_safe(host, api_key)
