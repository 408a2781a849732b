"""Tensor buffer-type overrides: put tensors whose names match a pattern on a chosen device.

llama.cpp's `llama_model_params.tensor_buft_overrides` (the `-ot` flag of its tools) is how MoE
expert tensors stay in system RAM while attention and shared weights go to the GPU.
llama-cpp-python declares the field but never fills it, so this shim builds the
NULL-terminated array itself and puts it into one `Llama` instance's model params.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp
import llama_cpp.llama_cpp as bindings

from hearthside.core.engine.config import TensorOverride
from hearthside.core.errors import EngineError


class TensorOverrideError(EngineError):
    """An override names a device the engine lacks, or its pattern is not a valid regex."""


class _BufferTypeOverride(ctypes.Structure):
    # struct llama_model_tensor_buft_override { const char * pattern; buffer_type_t buft; }
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class NativeOverrides:
    """The C array and the pattern bytes it points into; alive as long as the model."""

    array: ctypes.Array[_BufferTypeOverride]
    patterns: list[bytes]

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def engine_device_names() -> list[str]:
    """The ggml device names this engine build has, e.g. ["CPU"] or ["CUDA0", "CPU"]."""
    lib = bindings._lib
    count = _native(lib, "ggml_backend_dev_count", [], ctypes.c_size_t)
    get = _native(lib, "ggml_backend_dev_get", [ctypes.c_size_t], ctypes.c_void_p)
    name = _native(lib, "ggml_backend_dev_name", [ctypes.c_void_p], ctypes.c_char_p)
    return [name(get(index)).decode() for index in range(count())]


def native_overrides(overrides: Sequence[TensorOverride]) -> NativeOverrides:
    """The NULL-terminated array llama.cpp reads; raises for unknown devices and bad regexes."""
    array = (_BufferTypeOverride * (len(overrides) + 1))()
    patterns = []
    for slot, override in zip(array, overrides, strict=False):
        _check_pattern(override.pattern)
        patterns.append(override.pattern.encode())
        slot.pattern = patterns[-1]
        slot.buft = _buffer_type(override.device)
    return NativeOverrides(array, patterns)


class LlamaWithOverrides(llama_cpp.Llama):
    """A `Llama` whose model loads with tensor buffer-type overrides.

    `Llama.__init__` builds its model params with `llama_model_default_params()`, assigns them
    to `self.model_params`, sets the fields it knows and then loads the model. Intercepting
    that one assignment puts the override array into this instance's params only; the array
    lives on the instance, as long as the model.
    """

    def __init__(self, *args: Any, tensor_overrides: NativeOverrides, **kwargs: Any):
        self._native_overrides = tensor_overrides
        super().__init__(*args, **kwargs)

    @property
    def model_params(self) -> Any:
        return self._model_params

    @model_params.setter
    def model_params(self, params: Any) -> None:
        params.tensor_buft_overrides = self._native_overrides.address
        self._model_params = params


def _check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as exc:
        raise TensorOverrideError(
            f"The tensor pattern {pattern!r} is not a valid regular expression ({exc}).",
            hint=r"Write it as llama.cpp's -ot flag expects, e.g. blk\.[0-9]+\.ffn_.*_exps\.",
        ) from None


def _buffer_type(device: str) -> int:
    lib = bindings._lib
    by_name = _native(lib, "ggml_backend_dev_by_name", [ctypes.c_char_p], ctypes.c_void_p)
    buffer_type = _native(lib, "ggml_backend_dev_buffer_type", [ctypes.c_void_p], ctypes.c_void_p)
    handle = by_name(device.encode())
    if not handle:
        known = ", ".join(engine_device_names())
        raise TensorOverrideError(
            f"The engine has no device named {device!r}.",
            hint=f"Use one of: {known}.",
        )
    return int(buffer_type(handle))


def _native(lib: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any) -> Any:
    # `lib[name]` is a fresh function object: its types never change llama_cpp's own bindings.
    function = lib[name]
    function.argtypes = argtypes
    function.restype = restype
    return function
