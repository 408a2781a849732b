"""The catalog of well-known architectures, and `resolve_spec`: any way of naming a model -> spec.

`assets/model_catalog.json` holds one descriptor per model (see `descriptor.py`) with an `id`
("llama-3.1-70b"), a licence note and, where there is one, the hub repo of a popular GGUF
conversion. `resolve_spec` accepts a GGUF path, a registered model id (or "default"), a
catalog id, or a descriptor .json path, in that order of precedence.
"""

from __future__ import annotations

import difflib
import functools
import json
from collections.abc import Mapping
from dataclasses import replace
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from hearthside.core.errors import ModelFileError
from hearthside.core.models.descriptor import (
    Descriptor,
    DescriptorError,
    parse_descriptor,
    spec_from_descriptor,
)
from hearthside.core.models.spec import SOURCE_CATALOG, ModelSpec, spec_from_gguf
from hearthside.core.paths import data_dir

if TYPE_CHECKING:  # the registry (SQLite) is opened only to resolve a registered id
    from hearthside.core.models.store import ModelStore

__all__ = [
    "CATALOG_FILE",
    "catalog_entry",
    "catalog_ids",
    "catalog_spec",
    "resolve_spec",
]

CATALOG_FILE: Final = "model_catalog.json"
CATALOG_SCHEMA: Final = 1
_GGUF_SUFFIX = ".gguf"
_DESCRIPTOR_SUFFIX = ".json"


@functools.cache
def _catalog() -> Mapping[str, Descriptor]:
    text = resources.files("hearthside.assets").joinpath(CATALOG_FILE).read_text("utf-8")
    return MappingProxyType(parse_catalog(json.loads(text)))


def parse_catalog(data: Mapping[str, Any]) -> dict[str, Descriptor]:
    """Catalog JSON -> descriptors by id; every entry must be a valid descriptor with an id."""
    if data.get("schema") != CATALOG_SCHEMA or not isinstance(data.get("models"), list):
        raise DescriptorError(
            f"The model catalog is not a schema-{CATALOG_SCHEMA} catalog.",
            hint="Reinstall Hearthside; its assets are damaged.",
        )
    entries: dict[str, Descriptor] = {}
    for raw in data["models"]:
        descriptor = parse_descriptor(raw)
        if descriptor.id is None:
            raise DescriptorError(
                f"The catalog entry '{descriptor.name}' has no id.", hint="Give it an id."
            )
        if descriptor.id in entries:
            raise DescriptorError(
                f"The catalog has two entries with id '{descriptor.id}'.", hint="Rename one."
            )
        entries[descriptor.id] = descriptor
    return entries


def catalog_ids() -> list[str]:
    return list(_catalog())


def catalog_entry(model_id: str) -> Descriptor:
    entry = _catalog().get(model_id)
    if entry is None:
        close = difflib.get_close_matches(model_id, list(_catalog()), n=3)
        suggestion = f"Did you mean {', '.join(close)}? " if close else ""
        raise ModelFileError(
            f"'{_shown(model_id)}' is not in the model catalog.",
            hint=f"{suggestion}Known ids: {', '.join(_catalog())}.",
        )
    return entry


@functools.cache
def catalog_spec(model_id: str) -> ModelSpec:
    return spec_from_descriptor(catalog_entry(model_id), source=SOURCE_CATALOG)


def resolve_spec(ref: str, store: ModelStore | None = None) -> ModelSpec:
    """The spec of whatever `ref` names: a GGUF path, a registered model id or "default", a
    catalog id, or a descriptor .json path. Registered models win over catalog ids."""
    path = Path(ref)
    if ref.lower().endswith(_DESCRIPTOR_SUFFIX) and path.is_file():
        return spec_from_descriptor(path)
    if path.is_file():
        return spec_from_gguf(path)
    registered = _registered_spec(ref, store)
    if registered is not None:
        return registered
    if ref in _catalog():
        return catalog_spec(ref)
    raise _unknown_ref(ref)


def _registered_spec(ref: str, store: ModelStore | None) -> ModelSpec | None:
    # Imported here: the catalog alone (what-if plans, autotune's plan part) needs no SQLite.
    from hearthside.core.models.store import DEFAULT_REF, ModelStore

    if _looks_like_path(ref):
        return None
    if store is None:
        with ModelStore(data_dir()) as own_store:
            return _registered_spec(ref, own_store)
    if ref != DEFAULT_REF and store.find(ref) is None:
        return None
    record = store.resolve(ref)
    if not record.path.is_file():
        raise ModelFileError(
            f"The file for model '{record.id}' is missing ({record.path}).",
            hint=f"Put it back, or remove the entry with `hearthside models remove {record.id}`.",
        )
    spec = spec_from_gguf(record.path)
    return replace(spec, name=record.name, licence=record.licence or spec.licence, ref=record.id)


def _looks_like_path(ref: str) -> bool:
    lowered = ref.lower()
    return (
        "/" in ref
        or "\\" in ref
        or ref.startswith(".")
        or lowered.endswith(_GGUF_SUFFIX)
        or lowered.endswith(_DESCRIPTOR_SUFFIX)
    )


def _unknown_ref(ref: str) -> ModelFileError:
    ways = (
        "Name a model by the path of a .gguf file, an installed model's id (`hearthside models "
        "list`), `default`, a catalog id (e.g. llama-3.1-70b, qwen3-30b-a3b), or the path of a "
        "descriptor .json file."
    )
    if _looks_like_path(ref):
        return ModelFileError(f"There is no file at {_shown(ref)}.", hint=ways)
    close = difflib.get_close_matches(ref, list(_catalog()), n=3)
    suggestion = f" Did you mean {', '.join(close)}?" if close else ""
    return ModelFileError(f"No model called '{_shown(ref)}'.{suggestion}", hint=ways)


def _shown(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable if len(printable) <= 80 else printable[:77] + "..."
