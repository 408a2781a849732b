"""The per-install API key and the rule that keeps a key-less API on this computer.

The key file holds one URL-safe token and is private to this user (0600 on POSIX). It is
written to a private temporary file first and then linked into place, so no reader ever sees
a half-written key and two processes starting at once agree on one key.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import re
import secrets
import stat
from pathlib import Path

from hearthside.core.errors import HearthsideError
from hearthside.core.paths import ensure_private_dir

KEY_ENTROPY_BYTES = 32
MAX_KEY_FILE_BYTES = 4096
# RFC 6750 b64token characters; at least 32 of them so a hand-edited key is never weak.
VALID_KEY = re.compile(r"[A-Za-z0-9._~+/=-]{32,512}")
PRIVATE_FILE_MODE = 0o600


class UnsafeBindError(HearthsideError):
    """The API was asked to listen beyond this computer without an API key."""


class ApiKeyFileError(HearthsideError):
    """The API key file could not be read or written."""


def load_or_create_api_key(path: Path) -> str:
    """The key stored at `path`; a new one when the file is missing, empty or corrupt."""
    try:
        existing = _read_valid_key(path)
        if existing is not None:
            _restrict_to_owner(path)
            return existing
        return _store_new_key(path)
    except OSError as exc:
        raise ApiKeyFileError(
            "Hearthside could not read or create its API key file.",
            hint=f"Check that you can write to {path.parent} ({exc.strerror or 'I/O error'}).",
        ) from None


def load_or_create_user_key_file(path: Path) -> str:
    """The key in a file the user named (`--api-key-file`); a new key when there is no file.

    Unlike our own key file, this path may hold anything of the user's: a file that is not a
    Hearthside key is refused, never overwritten, and an existing folder keeps its mode.
    """
    try:
        if os.path.lexists(path):
            return _existing_user_key(path)
        _create_missing_folders(path.parent)
        return _publish_new_key(path)
    except OSError as exc:
        raise ApiKeyFileError(
            f"Hearthside could not read or create the API key file {path}.",
            hint=f"Check that you can write to {path.parent} ({exc.strerror or 'I/O error'}).",
        ) from None


def _existing_user_key(path: Path) -> str:
    key = _read_valid_key(path)
    if key is None:
        raise _not_a_key_file(path)
    _restrict_to_owner(path)
    return key


def _not_a_key_file(path: Path) -> ApiKeyFileError:
    return ApiKeyFileError(
        f"{path} holds something that is not a Hearthside API key; Hearthside will not "
        "overwrite it.",
        hint="Point --api-key-file at a new path or at a key file Hearthside wrote.",
    )


def _create_missing_folders(folder: Path) -> None:
    """Create the folders leading to `folder` that are missing, each private to this user."""
    missing = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    for parent in reversed(missing):
        parent.mkdir(mode=0o700, exist_ok=True)
        if os.name == "posix":
            parent.chmod(0o700)  # mkdir's mode is narrowed by the umask, not widened


def _publish_new_key(path: Path) -> str:
    key = secrets.token_urlsafe(KEY_ENTROPY_BYTES)
    draft = _write_private_draft(path, key)
    try:
        os.link(draft, path)  # fails if a file appeared meanwhile: never replace one
    except FileExistsError:
        return _existing_user_key(path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            draft.unlink()
    return key


def is_loopback_host(host: str) -> bool:
    """True for addresses reachable only from this computer: 127.0.0.0/8, ::1, localhost."""
    name = host.strip().removeprefix("[").removesuffix("]")
    if name.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def check_bind_is_safe(host: str, api_key: str | None) -> None:
    """Refuse to listen on anything but loopback ("LAN mode") unless a key is required."""
    if is_loopback_host(host) or (api_key is not None and api_key.strip()):
        return
    shown = host or "all addresses"
    raise UnsafeBindError(
        f"Hearthside will not open its API on {shown} without an API key: anyone on your "
        "network could use it.",
        hint="Turn on the API key, or listen on 127.0.0.1 to keep the API on this computer.",
    )


def _read_valid_key(path: Path) -> str | None:
    """The stored key, or None when there is no usable one (missing, empty, corrupt, a link).
    Raises ApiKeyFileError for a pipe, device or folder in the key file's place."""
    raw = _read_regular_file(path, MAX_KEY_FILE_BYTES + 1)
    if raw is None:
        return None
    try:
        key = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return key if VALID_KEY.fullmatch(key) else None


def _store_new_key(path: Path) -> str:
    ensure_private_dir(path.parent)
    key = secrets.token_urlsafe(KEY_ENTROPY_BYTES)
    draft = _write_private_draft(path, key)
    try:
        winner = _publish(draft, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            draft.unlink()
    if winner is not None:
        return winner
    _restrict_to_owner(path)
    return key


def _publish(draft: Path, path: Path) -> str | None:
    """Put `draft` at `path`; returns the key another process published first, if any."""
    try:
        os.link(draft, path)  # fails if the file exists, unlike a rename
    except FileExistsError:
        winner = _read_valid_key(path)
        if winner is not None:
            return winner
        os.replace(draft, path)  # the existing file is corrupt
    except OSError:  # a filesystem without hard links
        os.replace(draft, path)
    return None


def write_private_file(path: Path, content: bytes) -> None:
    """Replace `path` with `content` at once (no reader sees half of it), private to this user.

    For other secrets kept like our own key: a remote server's key, the list of remotes.
    """
    ensure_private_dir(path.parent)
    draft = _write_private_bytes(path, content)
    try:
        os.replace(draft, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            draft.unlink()


def read_private_text(path: Path, max_bytes: int = MAX_KEY_FILE_BYTES) -> str | None:
    """The text of a private file, or None when it is missing, a symlink, too big or not UTF-8.
    Raises ApiKeyFileError for a pipe, device or folder in its place."""
    raw = _read_regular_file(path, max_bytes + 1)
    if raw is None or len(raw) > max_bytes:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _read_regular_file(path: Path, max_bytes: int) -> bytes | None:
    """At most `max_bytes` of the regular file at `path`; None when it is missing or a symlink
    (never followed to someone else's file)."""
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever, and
    # `serve` would hang without a word before it listens.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise
    try:
        _require_regular_file(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as file:
        return file.read(max_bytes)


def _require_regular_file(path: Path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    if stat.S_ISDIR(mode):
        kind = "a folder"
    elif stat.S_ISFIFO(mode):
        kind = "a named pipe"
    else:
        kind = "a device or other special file"
    raise ApiKeyFileError(
        f"{path} is {kind}, not an ordinary file, so Hearthside cannot keep a key in it.",
        hint=f"Remove or rename {path}, then start again: Hearthside writes a new key file "
        "there (or point --api-key-file at an ordinary file).",
    )


def _write_private_draft(path: Path, key: str) -> Path:
    return _write_private_bytes(path, key.encode("ascii") + b"\n")


def _write_private_bytes(path: Path, content: bytes) -> Path:
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(draft, os.O_CREAT | os.O_EXCL | os.O_WRONLY, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    return draft


def _restrict_to_owner(path: Path) -> None:
    if os.name == "posix" and path.stat().st_mode & 0o777 != PRIVATE_FILE_MODE:
        path.chmod(PRIVATE_FILE_MODE)
