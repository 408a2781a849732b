"""Local re-quantization: make a smaller (or differently quantized) variant of a model.

llama.cpp's `llama_model_quantize` does the work. It is one blocking native call, so it runs in
a child process (`python -m hearthside.core.models.quantize SRC OUT FTYPE THREADS`): the child
forwards llama.cpp's log, whose per-tensor lines (`[  12/ 236] blk.1.attn_q.weight ...`) drive
the progress callback, and cancelling kills the child — the only honest way to stop a native
call. The output goes to `<id>.gguf.part`, is validated, renamed and registered last, as a
variant of its source (`variant_of`, source "quantized:<source id>").

Quantizing an already-quantized model to a type with *more* bits per weight cannot bring back
the lost precision; that is a warning, not an error.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hearthside.core.errors import HearthsideError, ModelFileError, ModelStoreError
from hearthside.core.models.gguf_validator import GGUFInfo, validate_gguf
from hearthside.core.models.store import (
    SOURCE_QUANTIZED_PREFIX,
    ModelRecord,
    ModelStore,
    ProgressCallback,
    commit_part_file,
    part_path_for,
)

__all__ = [
    "QUANT_TYPES",
    "QuantType",
    "QuantizeCancelled",
    "QuantizePlan",
    "estimate_output_bytes",
    "plan_quantize",
    "precision_warning",
    "quant_type",
    "quantize_model",
]

CHILD_MODULE = "hearthside.core.models.quantize"
EXIT_OK = 0
EXIT_USAGE = 2
EXIT_QUANTIZE_FAILED = 3
EXIT_ENGINE_MISSING = 4
_POLL_S = 0.05
_KILL_WAIT_S = 10.0
_ESTIMATE_MARGIN = 1.05
_ESTIMATE_SLACK_BYTES = 1024 * 1024
# llama.cpp keeps token embeddings and the output layer at 6-8 bits in its low-bit mixes.
_HIGH_PRECISION_TENSORS = frozenset({"token_embd.weight", "output.weight"})
_HIGH_PRECISION_BITS = 8.5
_FREE_SPACE_HINT = "Free some space, or choose a type with fewer bits per weight."
# "[  12/ 236] blk.1.attn_q.weight ...": anchored and bounded, as the line also carries tensor
# names from the file (issue 36).
_TENSOR_LINE = re.compile(
    r"[ \t]{0,16}\[[ \t]{0,16}([0-9]{1,9})[ \t]{0,16}/[ \t]{0,16}([0-9]{1,9})[ \t]{0,16}\]"
)

log = logging.getLogger(__name__)


class QuantizeCancelled(HearthsideError):
    """Re-quantization was cancelled; nothing was kept."""


@dataclass(frozen=True)
class QuantType:
    """A llama.cpp file type Hearthside can make, with its typical bits per weight."""

    name: str
    ftype: int  # llama.cpp `enum llama_ftype`
    bits_per_weight: float


# Bits per weight are llama.cpp's published figures for a 7B llama (quantize --help).
QUANT_TYPES: Mapping[str, QuantType] = {
    quant.name: quant
    for quant in (
        QuantType("F16", 1, 16.0),
        QuantType("BF16", 32, 16.0),
        QuantType("Q8_0", 7, 8.5),
        QuantType("Q6_K", 18, 6.56),
        QuantType("Q5_K_M", 17, 5.69),
        QuantType("Q5_K_S", 16, 5.54),
        QuantType("Q5_1", 9, 6.0),
        QuantType("Q5_0", 8, 5.5),
        QuantType("Q4_K_M", 15, 4.89),
        QuantType("Q4_K_S", 14, 4.58),
        QuantType("Q4_1", 3, 5.0),
        QuantType("Q4_0", 2, 4.5),
        QuantType("Q3_K_L", 13, 4.27),
        QuantType("Q3_K_M", 12, 3.91),
        QuantType("Q3_K_S", 11, 3.5),
        QuantType("Q2_K", 10, 2.96),
    )
}

# Sources may come in more types than we make (file types and, for files without one, the
# dominant tensor type).
_SOURCE_BITS_PER_WEIGHT: Mapping[str, float] = {
    **{name: quant.bits_per_weight for name, quant in QUANT_TYPES.items()},
    "F32": 32.0,
    "Q8_K": 8.5,
    "Q6_K": 6.56,
    "Q5_K": 5.5,
    "Q4_K": 4.5,
    "Q3_K": 3.44,
    "Q2_K_S": 2.6,
    "IQ4_XS": 4.25,
    "IQ4_NL": 4.5,
    "IQ3_M": 3.66,
    "IQ3_S": 3.44,
    "IQ3_XS": 3.3,
    "IQ3_XXS": 3.06,
    "IQ2_M": 2.7,
    "IQ2_S": 2.5,
    "IQ2_XS": 2.31,
    "IQ2_XXS": 2.06,
    "IQ1_M": 1.75,
    "IQ1_S": 1.56,
    "TQ2_0": 2.06,
    "TQ1_0": 1.69,
    "MXFP4_MOE": 4.25,
    "MXFP4": 4.25,
}


@dataclass(frozen=True)
class QuantizePlan:
    """What `quantize_model` would do, for showing before the work starts."""

    source: ModelRecord
    target: str
    preferred_id: str
    name: str
    estimated_bytes: int
    warnings: tuple[str, ...]


# --- planning --------------------------------------------------------------------------------


def quant_type(name: str) -> QuantType:
    """The QuantType called `name` (any case); a clear error listing the valid names."""
    found = QUANT_TYPES.get(name.strip().upper())
    if found is None:
        raise ModelStoreError(
            f"'{_shown(name)}' is not a quantization type Hearthside can make.",
            hint="Choose one of: " + ", ".join(QUANT_TYPES) + ".",
        )
    return found


def precision_warning(source_quant: str | None, target: QuantType) -> str | None:
    """A warning when the source already has fewer bits per weight than the target."""
    source_bits = _SOURCE_BITS_PER_WEIGHT.get((source_quant or "").upper())
    if source_bits is None or source_bits >= target.bits_per_weight:
        return None
    return (
        f"The source is {source_quant} (about {source_bits:g} bits per weight); "
        f"{target.name} (about {target.bits_per_weight:g}) makes a bigger file but cannot "
        "bring back the precision already lost. Quantize from an F16/BF16 original for the "
        "best quality."
    )


def estimate_output_bytes(infos: Sequence[GGUFInfo], target: QuantType) -> int:
    """A generous estimate of the quantized file's size, for the free-space check."""
    total = 0
    for info in infos:
        total += info.data_offset
        for tensor in info.tensors:
            if len(tensor.shape) < 2 or sum(dim > 1 for dim in tensor.shape) < 2:
                total += tensor.n_bytes  # norms and biases are kept as they are
                continue
            bits = target.bits_per_weight
            if tensor.name in _HIGH_PRECISION_TENSORS:
                bits = max(bits, _HIGH_PRECISION_BITS)
            total += int(tensor.n_elements * bits / 8)
    return int(total * _ESTIMATE_MARGIN) + _ESTIMATE_SLACK_BYTES


def plan_quantize(store: ModelStore, ref: str, target_type: str) -> QuantizePlan:
    """Check that `ref` can be quantized to `target_type` and describe the result."""
    target = quant_type(target_type)
    source = store.resolve(ref)
    files = store.files_of(source)
    if not all(path.is_file() for path in files):
        raise ModelFileError(
            f"The file for model '{source.id}' is missing ({source.path}).",
            hint=f"Put it back, or remove the entry with `hearthside models remove {source.id}`.",
        )
    _refuse_pointless(store, source, target)
    infos = [validate_gguf(path) for path in files]
    warning = precision_warning(source.quant, target)
    return QuantizePlan(
        source=source,
        target=target.name,
        preferred_id=f"{_base_id(source)}-{target.name.lower()}",
        name=f"{_base_name(source)} ({target.name})",
        estimated_bytes=estimate_output_bytes(infos, target),
        warnings=(warning,) if warning else (),
    )


def _refuse_pointless(store: ModelStore, source: ModelRecord, target: QuantType) -> None:
    if (source.quant or "").upper() == target.name:
        raise ModelStoreError(
            f"'{source.id}' is already {target.name}.",
            hint="Choose another type: " + ", ".join(QUANT_TYPES) + ".",
        )
    for variant in store.variants_of(source.id):
        if (variant.quant or "").upper() == target.name:
            raise ModelStoreError(
                f"'{source.id}' already has a {target.name} variant: '{variant.id}'.",
                hint=f"Use it, or remove it first with `hearthside models remove {variant.id}`.",
            )


def _base_id(source: ModelRecord) -> str:
    suffix = f"-{(source.quant or '').lower()}"
    if source.quant and source.id.endswith(suffix) and len(source.id) > len(suffix):
        return source.id[: -len(suffix)]
    return source.id


def _base_name(source: ModelRecord) -> str:
    suffix = f" ({source.quant})"
    if source.quant and source.name.endswith(suffix):
        return source.name[: -len(suffix)]
    return source.name


# --- quantizing ------------------------------------------------------------------------------


def quantize_model(
    store: ModelStore,
    ref: str,
    target_type: str,
    progress: ProgressCallback | None = None,
    cancel: threading.Event | None = None,
    *,
    nthread: int | None = None,
    on_warning: Callable[[str], None] | None = None,
    check_native: bool = True,
) -> ModelRecord:
    """Quantize model `ref` to `target_type` and register the result as its variant.

    `progress(tensors_done, tensors_total)` follows llama.cpp's per-tensor log; setting
    `cancel` kills the work and raises QuantizeCancelled, leaving no file behind. Warnings
    (see `plan_quantize`) go to `on_warning` before the work starts, else to the log.
    """
    plan = plan_quantize(store, ref, target_type)
    for warning in plan.warnings:
        if on_warning is not None:
            on_warning(warning)
        else:
            log.warning("%s", warning)
    store.check_free_space(plan.estimated_bytes, hint=_FREE_SPACE_HINT)
    model_id = store.unused_model_id(plan.preferred_id)
    target = store.models_dir / f"{model_id}.gguf"
    part = part_path_for(target)
    try:
        _run_child(plan.source.path, part, quant_type(plan.target), nthread, progress, cancel)
        validate_gguf(part)
        part.chmod(0o600)  # the child made it with the umask's looser mode
        commit_part_file(part, target)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    try:
        return store.register_installed(
            target,
            model_id=model_id,
            source=f"{SOURCE_QUANTIZED_PREFIX}{plan.source.id}",
            name=plan.name,
            licence=plan.source.licence,
            variant_of=plan.source.id,
            check_native=check_native,
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _run_child(
    source: Path,
    output: Path,
    target: QuantType,
    nthread: int | None,
    progress: ProgressCallback | None,
    cancel: threading.Event | None,
) -> None:
    threads = nthread or os.cpu_count() or 1
    argv = [sys.executable, "-m", CHILD_MODULE, str(source), str(output), str(target.ftype)]
    argv.append(str(threads))
    started_s = time.monotonic()
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    tail: deque[str] = deque(maxlen=40)
    reader = threading.Thread(
        target=_follow_log, args=(child, tail, progress), name="quantize-log", daemon=True
    )
    reader.start()
    try:
        returncode = _wait(child, cancel)
    finally:
        if child.poll() is None:  # interrupted (Ctrl-C) or cancelled: the native call stops
            child.kill()
            child.wait(_KILL_WAIT_S)
        reader.join(_KILL_WAIT_S)
    if returncode is None:
        raise QuantizeCancelled(
            f"Quantizing to {target.name} was cancelled; nothing was kept.",
            hint="Run it again when you are ready.",
        )
    if returncode != EXIT_OK:
        raise _failure(returncode, target, list(tail))
    log.info("quantized %s to %s in %.1f s", source.name, target.name, time.monotonic() - started_s)


def _wait(child: subprocess.Popen[str], cancel: threading.Event | None) -> int | None:
    """The child's exit code, or None once `cancel` is set (the caller kills it)."""
    while True:
        try:
            return child.wait(_POLL_S)
        except subprocess.TimeoutExpired:
            if cancel is not None and cancel.is_set():
                return None


def _follow_log(
    child: subprocess.Popen[str], tail: deque[str], progress: ProgressCallback | None
) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        tail.append(line.rstrip())
        match = _TENSOR_LINE.match(line)
        if match and progress is not None:
            progress(int(match.group(1)), int(match.group(2)))


def _failure(returncode: int, target: QuantType, tail: list[str]) -> HearthsideError:
    if returncode == EXIT_ENGINE_MISSING:
        return HearthsideError(
            "Hearthside could not quantize: llama-cpp-python failed to load.",
            hint="Reinstall Hearthside, or run `hearthside probe` to see what the engine reports.",
        )
    reason = next(
        (line for line in reversed(tail) if "error" in line.lower() or "fail" in line.lower()),
        None,
    )
    said = f" llama.cpp said: {reason.strip()[:200]}" if reason else ""
    if returncode < 0:
        said = f" The helper process ended with signal {-returncode}.{said}"
    return ModelFileError(
        f"llama.cpp could not quantize this model to {target.name}.{said}",
        hint="Some architectures or tensor shapes do not support every type; try Q8_0 or "
        "another type.",
    )


def _shown(text: str) -> str:
    printable = "".join(ch if ch.isprintable() else "?" for ch in text)
    return printable if len(printable) <= 40 else printable[:37] + "..."


# --- the child -------------------------------------------------------------------------------


def _quantize_in_this_process(source: str, output: str, ftype: int, nthread: int) -> int:
    try:
        import ctypes

        import llama_cpp
    except Exception:  # any import failure means the engine, not the file, is broken
        return EXIT_ENGINE_MISSING

    @llama_cpp.llama_log_callback
    def forward(_level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
        sys.stdout.write(text.decode("utf-8", errors="replace"))
        sys.stdout.flush()

    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = nthread
    params.allow_requantize = True
    returned = llama_cpp.llama_model_quantize(
        source.encode(), output.encode(), ctypes.byref(params)
    )
    return EXIT_OK if returned == 0 else EXIT_QUANTIZE_FAILED


def main(argv: Sequence[str]) -> int:
    if len(argv) != 4 or not argv[2].isdigit() or not argv[3].isdigit():
        sys.stderr.write(f"usage: python -m {CHILD_MODULE} SOURCE.gguf OUTPUT FTYPE THREADS\n")
        return EXIT_USAGE
    return _quantize_in_this_process(argv[0], argv[1], int(argv[2]), int(argv[3]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
