"""JSON round-trips for the frozen dataclasses that cross layers (profiles, specs, plans).

`to_jsonable` turns a dataclass tree into plain dicts/lists; `from_jsonable` rebuilds it from
the type hints, so every data contract gets a faithful round-trip without hand-written code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

T = TypeVar("T")


def to_jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [to_jsonable(item) for item in value]
    if isinstance(value, dict):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    return value


def from_jsonable(cls: type[T], data: Any) -> T:
    """Rebuild an instance of dataclass `cls` from `to_jsonable` output."""
    return typing.cast(T, _build(cls, data))


def _build(hint: Any, data: Any) -> Any:
    origin = typing.get_origin(hint)
    if data is None:
        return None
    if origin in (Union, types.UnionType):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _build(options[0], data) if len(options) == 1 else data
    if origin is tuple:
        args = typing.get_args(hint)
        item_hint = args[0] if args else Any
        return tuple(_build(item_hint, item) for item in data)
    if origin is dict:
        _key, value_hint = typing.get_args(hint)
        return {key: _build(value_hint, item) for key, item in data.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        names = {f.name for f in dataclasses.fields(hint) if f.init}
        return hint(**{name: _build(hints[name], data[name]) for name in names if name in data})
    return data
