"""The model hub: search for GGUF repos, list a repo's GGUF files, and build download URLs.

Everything the hub says is untrusted: repo ids, revisions and file names are checked against
strict patterns before they are used in a URL or a local file name, and entries that fail are
left out of listings. Requests go through `hub_http` (https only, hub hosts only).

Split GGUFs (`name-00001-of-00003.gguf` ...) are listed as one `HubFile` with several parts;
llama.cpp loads the later parts from the folder of the first.
"""

from __future__ import annotations

import re
import urllib.parse
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hearthside.core.models.hub_http import HubEndpoint, HubError, get_json

__all__ = [
    "HubFile",
    "HubFilePart",
    "HubRepoSummary",
    "list_repo_gguf_files",
    "parse_pull_ref",
    "parse_quant",
    "pick_by_quant",
    "resolve_url",
    "search_models",
    "split_part_info",
    "validate_repo_filename",
    "validate_repo_id",
    "validate_revision",
]

DEFAULT_REVISION = "main"
GGUF_SUFFIX = ".gguf"
MAX_SEARCH_LIMIT = 100
_MAX_NAME_PART = 96
_MAX_PATH_COMPONENT = 200
_MAX_PATH_DEPTH = 4

_NAME_PART = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9_])?")
_PATH_COMPONENT = re.compile(r"[A-Za-z0-9._-]+")
_REVISION = re.compile(r"[A-Za-z0-9._-]{1,64}")
_COMMIT_SHA = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SPLIT_SUFFIX = re.compile(r"-(\d{5})-of-(\d{5})\.gguf", re.IGNORECASE)
# llama.cpp's file type names as they appear in GGUF file names ("...-Q4_K_M.gguf",
# "...-UD-IQ2_XXS.gguf", "....BF16.gguf", "...-Q4_0_4_4.gguf").
_QUANT_TOKEN = re.compile(
    r"(?:I?Q[1-8](?:_[0-9]+)*(?:_K)?(?:_(?:XXS|XS|S|M|L|XL|NL))?(?:_[0-9]+)*"
    r"|BF16|F16|FP16|F32|FP32|MXFP4(?:_MOE)?|NVFP4|TQ[12]_0)",
    re.IGNORECASE,
)
_EMBEDDED_QUANT = re.compile(r"(?:^|_)(" + _QUANT_TOKEN.pattern + r")$", re.IGNORECASE)
_NOT_MODELS = re.compile(r"(?:mmproj|imatrix)", re.IGNORECASE)

_SPELL_REPO_HINT = "Write a repo as owner/name, for example unsloth/gemma-3-270m-it-GGUF."


# --- names -----------------------------------------------------------------------------------


def validate_repo_id(repo: str) -> str:
    """Return `repo` if it is a plain `owner/name` hub id; raise HubError otherwise."""
    owner, slash, name = repo.partition("/")
    if slash and _is_name_part(owner) and _is_name_part(name):
        return repo
    raise HubError(f"'{_shown(repo)}' is not a hub repo id.", hint=_SPELL_REPO_HINT)


def _is_name_part(text: str) -> bool:
    return (
        len(text) <= _MAX_NAME_PART and _NAME_PART.fullmatch(text) is not None and ".." not in text
    )


def validate_repo_filename(filename: str) -> str:
    """Return `filename` if it is a safe relative path of a .gguf file inside a repo.

    Every component is [A-Za-z0-9._-], none is "." or "..", and it ends in ".gguf".
    """
    components = filename.split("/")
    safe = (
        len(components) <= _MAX_PATH_DEPTH
        and all(_is_safe_component(component) for component in components)
        and filename.lower().endswith(GGUF_SUFFIX)
        and len(components[-1]) > len(GGUF_SUFFIX)
    )
    if not safe:
        raise HubError(
            f"'{_shown(filename)}' is not a file name Hearthside downloads.",
            hint="Choose a .gguf file listed by `hearthside models pull OWNER/NAME`.",
        )
    return filename


def _is_safe_component(component: str) -> bool:
    return (
        0 < len(component) <= _MAX_PATH_COMPONENT
        and _PATH_COMPONENT.fullmatch(component) is not None
        and component not in (".", "..")
        and ".." not in component
    )


def validate_revision(revision: str) -> str:
    if _REVISION.fullmatch(revision) and ".." not in revision:
        return revision
    raise HubError(
        f"'{_shown(revision)}' is not a revision Hearthside accepts.",
        hint="Use a branch name such as main, or a commit hash.",
    )


def split_part_info(filename: str) -> tuple[str, int, int] | None:
    """("path/name", 2, 3) for "path/name-00002-of-00003.gguf"; None for a single file."""
    match = _SPLIT_SUFFIX.search(filename)
    if match is None or match.end() != len(filename):
        return None
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= index <= count:
        return None
    return filename[: match.start()], index, count


def parse_quant(filename: str) -> str | None:
    """The quantization named in a GGUF file name ("Q4_K_M", "IQ4_XS", "BF16"), or None."""
    split = split_part_info(filename)
    stem = split[0] if split else filename.removesuffix(GGUF_SUFFIX).removesuffix(".GGUF")
    for component in reversed(stem.split("/")):
        for token in reversed(re.split(r"[-.]", component)):
            if _QUANT_TOKEN.fullmatch(token):
                return _normalised_quant(token)
        # Names joined with underscores ("mistral_7b_q4_k_m"): a quant-shaped tail.
        tail = _EMBEDDED_QUANT.search(component)
        if tail is not None:
            return _normalised_quant(tail.group(1))
    return None


def _normalised_quant(token: str) -> str:
    upper = token.upper()
    return {"FP16": "F16", "FP32": "F32"}.get(upper, upper)


# --- data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HubRepoSummary:
    """One search result."""

    repo: str
    downloads: int | None
    likes: int | None
    last_modified: str | None  # ISO 8601, as the hub gives it
    gated: bool


@dataclass(frozen=True)
class HubFilePart:
    """One file on the hub: its path in the repo, size and LFS sha256 when the hub gave them."""

    filename: str
    size_bytes: int | None
    sha256: str | None


@dataclass(frozen=True)
class HubFile:
    """One downloadable model: a single GGUF, or every part of a split GGUF in order."""

    repo: str
    parts: tuple[HubFilePart, ...]
    quant: str | None
    revision: str = DEFAULT_REVISION

    @property
    def filename(self) -> str:
        """The file llama.cpp opens (the first part of a split model)."""
        return self.parts[0].filename

    @property
    def filenames(self) -> tuple[str, ...]:
        return tuple(part.filename for part in self.parts)

    @property
    def size_bytes(self) -> int | None:
        sizes = [part.size_bytes for part in self.parts]
        return None if any(size is None for size in sizes) else sum(s or 0 for s in sizes)

    @property
    def sha256(self) -> str | None:
        """The first part's sha256 (the one a registered model is known by)."""
        return self.parts[0].sha256

    @property
    def is_split(self) -> bool:
        return len(self.parts) > 1

    @property
    def display_name(self) -> str:
        split = split_part_info(self.filename)
        if split is None:
            return self.filename
        return f"{split[0]}{GGUF_SUFFIX} ({len(self.parts)} parts)"

    @property
    def source(self) -> str:
        """How the model store records where this model came from."""
        return f"hub:{self.repo}/{self.filename}"


def resolve_url(endpoint: HubEndpoint, repo: str, revision: str, filename: str) -> str:
    """`{endpoint}/{repo}/resolve/{revision}/{filename}`, from validated parts only."""
    validate_repo_id(repo)
    validate_revision(revision)
    validate_repo_filename(filename)
    return f"{endpoint.url}/{repo}/resolve/{revision}/{urllib.parse.quote(filename)}"


def parse_pull_ref(ref: str) -> tuple[str, str | None]:
    """ "owner/name" or "owner/name:path/file.gguf" → (repo, filename or None), validated."""
    repo, colon, filename = ref.partition(":")
    validate_repo_id(repo)
    if not colon:
        return repo, None
    return repo, validate_repo_filename(filename)


# --- search ----------------------------------------------------------------------------------


def search_models(
    query: str, *, limit: int = 20, endpoint: HubEndpoint | None = None
) -> list[HubRepoSummary]:
    """GGUF repos whose names match `query`, most downloaded first."""
    hub = endpoint or HubEndpoint.from_settings()
    params: dict[str, str | int | Sequence[str]] = {
        "search": query,
        "filter": "gguf",
        "sort": "downloads",
        "direction": "-1",
        "limit": max(1, min(limit, MAX_SEARCH_LIMIT)),
        "expand": ["downloads", "likes", "lastModified", "gated"],
    }
    answer = get_json(hub, "/api/models", f"the search for '{_shown(query)}'", params)
    if not isinstance(answer, list):
        raise HubError("The hub's search answer has an unexpected shape.", hint=_RETRY_LATER)
    return [summary for item in answer if (summary := _summary_from(item)) is not None]


_RETRY_LATER = "Try again later."


def _summary_from(item: Any) -> HubRepoSummary | None:
    if not isinstance(item, dict):
        return None
    repo = item.get("id") or item.get("modelId")
    if not isinstance(repo, str) or not _is_valid_repo(repo):
        return None
    last_modified = item.get("lastModified") or item.get("createdAt")
    return HubRepoSummary(
        repo=repo,
        downloads=_int_or_none(item.get("downloads")),
        likes=_int_or_none(item.get("likes")),
        last_modified=last_modified if isinstance(last_modified, str) else None,
        gated=item.get("gated") not in (None, False),
    )


def _is_valid_repo(repo: str) -> bool:
    try:
        validate_repo_id(repo)
    except HubError:
        return False
    return True


# --- listing a repo --------------------------------------------------------------------------


def list_repo_gguf_files(
    repo: str, *, revision: str = DEFAULT_REVISION, endpoint: HubEndpoint | None = None
) -> list[HubFile]:
    """The repo's GGUF models, smallest first, split parts grouped; pinned to the commit the
    hub reports so that a resumed download fetches the same bytes."""
    hub = endpoint or HubEndpoint.from_settings()
    validate_repo_id(repo)
    validate_revision(revision)
    path = f"/api/models/{repo}/revision/{urllib.parse.quote(revision, safe='')}"
    answer = get_json(hub, path, f"the repo {repo}", {"blobs": "true"})
    if not isinstance(answer, dict) or not isinstance(answer.get("siblings"), list):
        raise HubError(f"The hub's listing of {repo} has an unexpected shape.", hint=_RETRY_LATER)
    commit = answer.get("sha")
    pinned = commit if isinstance(commit, str) and _COMMIT_SHA.fullmatch(commit) else revision
    parts = [part for item in answer["siblings"] if (part := _part_from(item)) is not None]
    files = group_parts(repo, parts, pinned)
    return sorted(files, key=lambda f: (f.size_bytes is None, f.size_bytes or 0, f.filename))


def _part_from(item: Any) -> HubFilePart | None:
    if not isinstance(item, dict):
        return None
    filename = item.get("rfilename") or item.get("path")
    if not isinstance(filename, str) or not _is_offered_file(filename):
        return None
    raw_lfs = item.get("lfs")
    lfs: dict[str, Any] = raw_lfs if isinstance(raw_lfs, dict) else {}
    size = _int_or_none(item.get("size"))
    if size is None:
        size = _int_or_none(lfs.get("size"))
    # The model API calls it lfs.sha256; the tree API calls the same value lfs.oid.
    sha256 = lfs.get("sha256") or lfs.get("oid")
    checked = sha256.lower() if isinstance(sha256, str) else None
    if checked is not None and not _SHA256.fullmatch(checked):
        checked = None
    return HubFilePart(filename=filename, size_bytes=size, sha256=checked)


def _is_offered_file(filename: str) -> bool:
    try:
        validate_repo_filename(filename)
    except HubError:
        return False
    return _NOT_MODELS.search(filename.rsplit("/", 1)[-1]) is None


def group_parts(repo: str, parts: Iterable[HubFilePart], revision: str) -> list[HubFile]:
    """One HubFile per single GGUF and per complete set of split parts (incomplete sets are
    left out: they cannot be loaded)."""
    singles: list[HubFile] = []
    groups: dict[tuple[str, int], dict[int, HubFilePart]] = defaultdict(dict)
    for part in parts:
        split = split_part_info(part.filename)
        if split is None:
            quant = parse_quant(part.filename)
            singles.append(HubFile(repo, (part,), quant, revision))
            continue
        prefix, index, count = split
        groups[(prefix, count)][index] = part
    return singles + _complete_groups(repo, groups, revision)


def _complete_groups(
    repo: str, groups: Mapping[tuple[str, int], Mapping[int, HubFilePart]], revision: str
) -> list[HubFile]:
    complete = []
    for (_prefix, count), by_index in groups.items():
        if sorted(by_index) != list(range(1, count + 1)):
            continue
        ordered = tuple(by_index[index] for index in range(1, count + 1))
        complete.append(HubFile(repo, ordered, parse_quant(ordered[0].filename), revision))
    return complete


def pick_by_quant(files: Sequence[HubFile], quant: str) -> HubFile:
    """The file of the given quant type (case-insensitive); a clear error naming the choices."""
    wanted = quant.upper()
    matches = [hub_file for hub_file in files if hub_file.quant == wanted]
    if len(matches) == 1:
        return matches[0]
    available = sorted({hub_file.quant for hub_file in files if hub_file.quant})
    if not matches:
        raise HubError(
            f"This repo has no {_shown(wanted)} file.",
            hint="Available: " + (", ".join(available) or "none with a recognisable type") + ".",
        )
    raise HubError(
        f"This repo has {len(matches)} files of type {wanted}.",
        hint="Name one: " + ", ".join(f"REPO:{m.filename}" for m in matches) + ".",
    )


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def _shown(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable if len(printable) <= 80 else printable[:77] + "..."
