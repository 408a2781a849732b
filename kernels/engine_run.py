"""An engine micro-run: a short prefill and decode of a real model on each backend the engine
has, which ties the raw bandwidth and FLOP figures to what llama.cpp achieves on them.

It times llama_decode on random tokens as `hearthside bench` does (`Engine.time_prefill` and
`Engine.time_decode`: no tokenizing, no sampling), with a small context so it loads fast. The
engine is private to the calibration and closed before it returns; the app's EngineService
engine is not touched.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.errors import HearthsideError
from hearthside.core.probe.profile import EngineDevice
from hearthside.kernels.measurement import (
    MIN_REPETITIONS,
    SKIPPED_NOTE,
    Budget,
    Measurement,
    Samples,
    measure_until_stable,
)

N_PROMPT = 128
N_GEN = 32
QUICK_N_GEN = 16
MIN_PROMPT = 8
MIN_GEN = 2
SAMPLES_PER_BUDGET = 4  # the sizing runs, the minimum repetitions and room to spare
CONTEXT_TOKENS = 256
ENGINE_KINDS = ("engine_prefill", "engine_decode")
NO_MODEL_NOTE = (
    "not measured: no model is installed; install the default model with "
    "`hearthside models install-default`, then calibrate again"
)
StepCallback = Callable[[str, float], None]


@dataclass(frozen=True)
class EngineBackend:
    """Where a micro-run puts the model: the CPU, or all layers on one GPU."""

    device: str  # the Measurement device: "cpu", "cuda:0", "rocm:0", "mps", "vulkan:0"
    n_gpu_layers: int
    main_gpu: int = 0


def backend_label(ggml_name: str) -> str:
    """ggml's device name as a Measurement device: "CUDA0" → "cuda:0", "MTL0" → "mps"."""
    match = re.fullmatch(r"([A-Za-z]+?)(\d*)", ggml_name)
    if match is None:
        return ggml_name.lower()
    family, index = match.group(1).lower(), match.group(2) or "0"
    if family in ("mtl", "metal"):
        return "mps"  # the same Apple GPU torch calls "mps"
    if family == "hip":
        family = "rocm"
    return f"{family}:{index}"


def backends_for(devices: Sequence[EngineDevice]) -> list[EngineBackend]:
    """The CPU, then each GPU the engine can offload to (all layers on it, alone)."""
    backends = [EngineBackend("cpu", n_gpu_layers=0)]
    gpus = [device for device in devices if device.kind in ("gpu", "igpu")]
    for position, device in enumerate(gpus):
        backends.append(EngineBackend(backend_label(device.name), -1, main_gpu=position))
    return backends


def engine_weight(backends: Sequence[EngineBackend]) -> int:
    """`Budget` shares the micro-runs take: one for loading, one per measurement."""
    return 3 * len(backends)


def not_measured(note: str, device: str = "cpu") -> list[Measurement]:
    return [Measurement.failed(kind, device, "tok/s", note) for kind in ENGINE_KINDS]


def measure_engine(
    model_path: Path | None,
    backends: Sequence[EngineBackend],
    *,
    quick: bool,
    budget: Budget,
    warmup_s: float,
    step: StepCallback | None = None,
) -> list[Measurement]:
    """Prefill and decode tok/s of `model_path` on every backend, within `budget`."""
    if model_path is None:
        return not_measured(NO_MODEL_NOTE)
    measurements: list[Measurement] = []
    for done, backend in enumerate(backends):
        if budget.expired():
            measurements += not_measured(SKIPPED_NOTE, backend.device)
            continue
        if step is not None:
            step(f"engine on {backend.device}", done / len(backends))
        measurements += measure_backend(
            model_path, backend, quick=quick, budget=budget, warmup_s=warmup_s
        )
    return measurements


def measure_backend(
    model_path: Path,
    backend: EngineBackend,
    *,
    quick: bool,
    budget: Budget,
    warmup_s: float,
) -> list[Measurement]:
    budget.take()  # the load's share
    config = EngineConfig(
        model_path=str(model_path),
        n_ctx=CONTEXT_TOKENS,
        n_gpu_layers=backend.n_gpu_layers,
        main_gpu=backend.main_gpu,
        split_mode="none" if backend.n_gpu_layers else "layer",
    )
    try:
        engine = Engine(config)
    except HearthsideError as error:
        return not_measured(f"not measured: {error.message}", backend.device)
    try:
        return _time_engine(engine, backend, quick=quick, budget=budget, warmup_s=warmup_s)
    finally:
        engine.close()


def _time_engine(
    engine: Engine, backend: EngineBackend, *, quick: bool, budget: Budget, warmup_s: float
) -> list[Measurement]:
    rng = np.random.default_rng(0)
    tokens = [int(t) for t in rng.integers(0, engine.n_vocab, size=max(N_PROMPT, N_GEN) + 1)]
    base = _params(engine, backend)
    n_prompt, prefill = _measure_tokens_per_s(
        lambda count: engine.time_prefill(tokens[:count]),
        wanted=N_PROMPT,
        least=MIN_PROMPT,
        budget_s=budget.take(),
        warmup_s=warmup_s,
    )
    n_gen, decode = _measure_tokens_per_s(
        lambda count: engine.time_decode(tokens[: count + 1]),
        wanted=QUICK_N_GEN if quick else N_GEN,
        least=MIN_GEN,
        budget_s=budget.take(),
        warmup_s=warmup_s,
    )
    method = f"llama.cpp llama_decode on random tokens, {engine.model_path.name}"
    return [
        Measurement.from_samples(
            "engine_prefill",
            backend.device,
            "tok/s",
            prefill,
            method=f"{method}, one batch of {n_prompt}",
            params={**base, "n_prompt": n_prompt, "threads": engine.config.batch_threads},
        ),
        Measurement.from_samples(
            "engine_decode",
            backend.device,
            "tok/s",
            decode,
            method=f"{method}, {n_gen} tokens one at a time",
            params={**base, "n_gen": n_gen, "threads": engine.config.decode_threads},
        ),
    ]


def _measure_tokens_per_s(
    seconds_for: Callable[[int], float],
    *,
    wanted: int,
    least: int,
    budget_s: float,
    warmup_s: float,
) -> tuple[int, Samples]:
    """tok/s over repetitions of `count` tokens: `wanted` on a machine at its usual speed,
    fewer (down to `least`) on a slow or busy one, so the micro-run stays a micro-run. The
    runs that size it are the warm-up; when even the chosen size is slow, two repetitions
    suffice."""
    started = time.perf_counter()
    count, count_s = _affordable_count(seconds_for, wanted, least, budget_s / SAMPLES_PER_BUDGET)
    probing_s = time.perf_counter() - started
    slow = count_s * (MIN_REPETITIONS + 1) > budget_s
    samples = measure_until_stable(
        lambda: count / seconds_for(count),
        budget_s=max(0.0, budget_s - probing_s),
        warmup_s=max(0.0, warmup_s - probing_s),
        min_repetitions=2 if slow else MIN_REPETITIONS,
    )
    return count, samples


def _affordable_count(
    seconds_for: Callable[[int], float], wanted: int, least: int, limit_s: float
) -> tuple[int, float]:
    """The largest of least, 2·least, … wanted whose run should take at most `limit_s`, each
    size predicted from the one before it (per-token cost falls as batches grow, so the
    prediction errs towards the smaller size); with the seconds the chosen size took."""
    count = least
    seconds = seconds_for(count)
    while count < wanted:
        larger = min(wanted, count * 2)
        if seconds * larger / count > limit_s:
            break
        count = larger
        seconds = seconds_for(count)
    return count, seconds


def _params(engine: Engine, backend: EngineBackend) -> dict[str, Any]:
    return {
        "model": engine.model_path.stem,
        "model_path": str(engine.model_path),
        "model_bytes": engine.model_path.stat().st_size,
        "n_gpu_layers": backend.n_gpu_layers,
    }
