"""The engine's own view: what the installed llama.cpp was built with and which devices its
ggml backends see.

This is the source the other probes defer to for "can Hearthside use this GPU right now": a
card the vendor tools report but no engine device matches needs a rebuild
(`hearthside engine rebuild`). The native calls are isolated in `_read_*` helpers; everything
else is pure and fed recorded data in tests (tests/fixtures/probe/engine/*.json).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.profile import EngineDevice, EngineInfo, ProbeError

SOURCE = "engine"
T = TypeVar("T")

# enum ggml_backend_dev_type in ggml/include/ggml-backend.h (llama.cpp vendored by 0.3.36).
# Type 4 (META) wraps other devices for tensor parallelism; listing it would count them twice.
DEVICE_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}

# ggml registry names → the build backend that produces them ("MTL" is Metal, "ROCm" is HIP).
BACKEND_BUILDS = {
    "CUDA": "cuda",
    "ROCm": "hip",
    "HIP": "hip",
    "MTL": "metal",
    "Metal": "metal",
    "Vulkan": "vulkan",
    "CPU": "cpu",
}


class MissingSymbolError(LookupError):
    """The loaded llama.cpp lacks a function this probe calls (an older or newer build)."""


# --- pure: recorded data → EngineInfo ---------------------------------------------------------


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """Backend → features from `llama_print_system_info()`, which prints e.g.
    "CUDA : ARCHS = 860,890 | USE_GRAPHS = 1 | CPU : SSE3 = 1 | AVX2 = 1 | "."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for item in (part.strip() for part in text.split("|")):
        if " : " in item:
            backend, item = (piece.strip() for piece in item.split(" : ", 1))
            current = sections.setdefault(backend, {})
        if current is None or "=" not in item:
            continue
        key, value = (piece.strip() for piece in item.split("=", 1))
        current[key] = value
    return sections


def cuda_archs_compiled(system_info: str) -> tuple[str, ...]:
    """The `sm_XX` architectures a CUDA build carries kernels for ("860,890" → sm_86, sm_89)."""
    archs = parse_system_info(system_info).get("CUDA", {}).get("ARCHS", "")
    codes = (code.strip() for code in archs.split(","))
    return tuple(f"sm_{int(code) // 10}" for code in codes if code.isdigit())


def engine_device_from(raw: Mapping[str, Any]) -> EngineDevice | None:
    """One device from `{"name", "description", "type", "memory_free", "memory_total"}`;
    None for device types Hearthside does not list (META, or newer ones)."""
    kind = DEVICE_KINDS.get(int(raw["type"]))
    if kind is None:
        return None
    return EngineDevice(
        name=str(raw["name"]),
        description=str(raw.get("description") or ""),
        kind=kind,  # type: ignore[arg-type]
        memory_total_bytes=raw.get("memory_total") or None,
        memory_free_bytes=raw.get("memory_free") if raw.get("memory_total") else None,
    )


def engine_info_from(
    devices_raw: Sequence[Mapping[str, Any]],
    backends_raw: Sequence[str],
    system_info: str | None,
    version: str | None,
    *,
    gpu_offload: bool | None = None,
) -> EngineInfo:
    """`EngineInfo` from what the native calls returned. Without `gpu_offload` (the value of
    `llama_supports_gpu_offload()`), any GPU device the engine sees implies offload."""
    devices = tuple(d for d in (engine_device_from(raw) for raw in devices_raw) if d is not None)
    if gpu_offload is None:
        gpu_offload = any(device.kind in ("gpu", "igpu") for device in devices)
    return EngineInfo(
        package_version=version,
        backends=tuple(str(name) for name in backends_raw),
        devices=devices,
        gpu_offload=gpu_offload,
        system_info=system_info.strip() if system_info else None,
    )


def built_backend(engine: EngineInfo) -> str:
    """The build backend ("cuda", "hip", "metal", "vulkan", "cpu") this engine was built with:
    its first non-CPU ggml backend."""
    for name in engine.backends:
        build = BACKEND_BUILDS.get(name)
        if build is not None and build != "cpu":
            return build
    return "cpu"


# --- native: ctypes calls into the installed llama.cpp ----------------------------------------


def _function(lib: ctypes.CDLL, name: str, argtypes: list[Any], restype: Any) -> Any:
    # `lib[name]` makes a fresh function object, so setting its types never changes the ones
    # llama_cpp itself bound on the same library.
    try:
        function = lib[name]
    except AttributeError as exc:
        raise MissingSymbolError(name) from exc
    function.argtypes = argtypes
    function.restype = restype
    return function


def _ggml_library() -> ctypes.CDLL:
    """The libggml llama_cpp already loaded (its private `_ggml` module), else libllama, whose
    handle also resolves the ggml symbols it links against."""
    try:
        from llama_cpp._ggml import libggml

        return libggml
    except (ImportError, OSError, RuntimeError):
        from llama_cpp import llama_cpp as bindings

        return bindings._lib


def _text(pointer: bytes | None) -> str:
    return pointer.decode("utf-8", errors="replace") if pointer else ""


def _read_devices(lib: ctypes.CDLL) -> list[dict[str, Any]]:
    size = ctypes.c_size_t
    handle = ctypes.c_void_p
    count = _function(lib, "ggml_backend_dev_count", [], size)
    get = _function(lib, "ggml_backend_dev_get", [size], handle)
    name = _function(lib, "ggml_backend_dev_name", [handle], ctypes.c_char_p)
    description = _function(lib, "ggml_backend_dev_description", [handle], ctypes.c_char_p)
    kind = _function(lib, "ggml_backend_dev_type", [handle], ctypes.c_int)
    memory = _function(
        lib, "ggml_backend_dev_memory", [handle, ctypes.POINTER(size), ctypes.POINTER(size)], None
    )
    devices = []
    for index in range(count()):
        device = get(index)
        free, total = size(0), size(0)
        memory(device, ctypes.byref(free), ctypes.byref(total))
        devices.append(
            {
                "name": _text(name(device)),
                "description": _text(description(device)),
                "type": kind(device),
                "memory_free": free.value,
                "memory_total": total.value,
            }
        )
    return devices


def _read_backends(lib: ctypes.CDLL) -> list[str]:
    count = _function(lib, "ggml_backend_reg_count", [], ctypes.c_size_t)
    get = _function(lib, "ggml_backend_reg_get", [ctypes.c_size_t], ctypes.c_void_p)
    name = _function(lib, "ggml_backend_reg_name", [ctypes.c_void_p], ctypes.c_char_p)
    return [_text(name(get(index))) for index in range(count())]


def _call(module: Any, name: str) -> Any:
    function = getattr(module, name, None)
    if function is None:
        raise MissingSymbolError(name)
    return function()


def probe(ctx: ProbeContext) -> ProbeResult:
    """What the installed llama-cpp-python can drive. Never raises: a missing package or
    symbol becomes a `ProbeError`, with whatever could be read still reported."""
    del ctx  # the engine answers for the running process, not for a recorded root
    try:
        import llama_cpp
    except (ImportError, OSError, RuntimeError) as exc:
        return _failure(f"llama-cpp-python cannot be loaded: {exc}")
    version = getattr(llama_cpp, "__version__", None)
    errors: list[ProbeError] = []
    system_info = _guarded(errors, lambda: _text(_call(llama_cpp, "llama_print_system_info")))
    offload = _guarded(errors, lambda: bool(_call(llama_cpp, "llama_supports_gpu_offload")))
    devices: list[dict[str, Any]] = []
    backends: list[str] = []
    try:
        lib = _ggml_library()
        devices = _guarded(errors, lambda: _read_devices(lib)) or []
        backends = _guarded(errors, lambda: _read_backends(lib)) or []
    except (ImportError, OSError, RuntimeError, AttributeError) as exc:
        errors.append(ProbeError(SOURCE, f"ggml library not reachable: {exc}"))
    engine = engine_info_from(devices, backends, system_info, version, gpu_offload=offload)
    return ProbeResult(engine=engine, errors=tuple(errors))


def _guarded(errors: list[ProbeError], read: Callable[[], T]) -> T | None:
    try:
        return read()
    except MissingSymbolError as exc:
        errors.append(
            ProbeError(SOURCE, f"this llama.cpp build has no {exc.args[0]}(); skipped that part")
        )
    except (OSError, ValueError, RuntimeError) as exc:
        errors.append(ProbeError(SOURCE, f"engine query failed: {exc}"))
    return None


def _failure(message: str) -> ProbeResult:
    return ProbeResult(errors=(ProbeError(SOURCE, message),))
