"""An engine micro-run: a short prefill and decode of a real model on each backend the engine
has, which ties the raw bandwidth and FLOP figures to what llama.cpp achieves on them.

It times llama_decode on random tokens as `hearthside bench` does (`Engine.time_prefill` and
`Engine.time_decode`: no tokenizing, no sampling), with a small context so it loads fast. The
engine is private to the calibration and closed before it returns; the app's EngineService
engine is not touched.

Speed probes: one model cannot tell apart the costs that make llama.cpp slower than the raw
bandwidth — a fixed cost per layer and token (graph, thread barriers), and kernels that do
more work per byte for some quant types (K-quants dequantize more than Q8_0; AVX2 repacks
Q4_0 into a faster layout). So the CPU also runs synthetic probes written for the occasion
(`speed_probes`): a tiny model whose time is nearly all fixed cost, and one model per quant
type, bigger than the CPU caches. Each measurement carries what one token reads and computes
(`per_token_work`), so the figures can be fitted after the probe files are gone.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.gguf_validator import GGUFInfo, validate_gguf
from hearthside.core.probe.profile import EngineDevice
from hearthside.kernels.measurement import (
    MIN_REPETITIONS,
    SKIPPED_NOTE,
    Budget,
    Measurement,
    Samples,
    measure_until_stable,
)
from hearthside.kernels.synthetic_model import SyntheticShape, write_uniform_gguf

if TYPE_CHECKING:
    from hearthside.core.engine.engine import Engine

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


def engine_weight(backends: Sequence[EngineBackend], probes: Sequence[SpeedProbe] = ()) -> int:
    """`Budget` shares the micro-runs take: one for loading (and writing a probe), one per
    measurement."""
    return 3 * len(backends) + 3 * len(probes)


# --- speed probes ------------------------------------------------------------------------------

OVERHEAD_PROBE = "overhead"
PROBE_TYPES = ("Q8_0", "Q4_0", "Q2_K")  # plain 8-bit, repacked on AVX2/NEON, a K-quant
PROBE_LAYERS = 8
MIN_PROBE_BYTES = 128 << 20
MAX_PROBE_BYTES = 384 << 20
PROBE_CACHE_MULTIPLE = 5  # weights this many times the last-level cache come from RAM


@dataclass(frozen=True)
class SpeedProbe:
    name: str  # OVERHEAD_PROBE or the quant type
    type_name: str
    shape: SyntheticShape


def speed_probes(cache_bytes: int | None) -> list[SpeedProbe]:
    """The tiny overhead probe and one llama-shaped probe per PROBE_TYPES type, each reading
    about PROBE_CACHE_MULTIPLE x the cache per token (within MIN/MAX_PROBE_BYTES)."""
    target = min(MAX_PROBE_BYTES, max(MIN_PROBE_BYTES, PROBE_CACHE_MULTIPLE * (cache_bytes or 0)))
    # 16 layers of 64-wide blocks: almost no bytes, all the per-layer graph work
    tiny = SyntheticShape("llama", 16, 64, 2, 1, 256, n_vocab=512)
    probes = [SpeedProbe(OVERHEAD_PROBE, "Q8_0", tiny)]
    probes += [SpeedProbe(name, name, _probe_shape(name, target)) for name in PROBE_TYPES]
    return probes


def _probe_shape(type_name: str, target_bytes: int) -> SyntheticShape:
    """A dense llama shape whose weights in `type_name` come to about `target_bytes`: per layer
    q and o (E x E), k and v (E x E/4) and an FFN of 3 x E x 4E, so 14.5 E^2 weights."""
    bits = type_bits(type_name)
    weights = target_bytes * 8 / bits / PROBE_LAYERS
    width = max(256, round((weights / 14.5) ** 0.5 / 256) * 256)  # K-quant rows: 256 values
    heads = width // 64
    return SyntheticShape("llama", PROBE_LAYERS, width, heads, max(1, heads // 4), 4 * width)


def type_bits(type_name: str) -> float:
    """Bits per weight of a ggml type (Q4_0: 4.5, Q2_K: 2.625, F16: 16)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return size * 8 / block


def per_token_work(info: GGUFInfo) -> dict[str, int]:
    """What one token costs, by ggml type, as flat measurement params: "read_bytes:<type>",
    the bytes of weights decode reads (every matrix but the input embeddings, which it looks
    up a row of — unless they double as the output layer), "prefill_weights:<type>", the
    weights prefill multiplies per prompt token (the blocks'; the output layer runs for the
    last token only), "n_layers" and "n_vocab". Routed experts count at their used share."""
    names = {tensor.name for tensor in info.tensors}
    tied = "output.weight" not in names
    used_share = _used_expert_share(info)
    read: dict[str, int] = {}
    multiplied: dict[str, int] = {}
    for tensor in info.tensors:
        if len(tensor.shape) < 2 or not tensor.name.endswith(".weight"):
            continue
        share = used_share if "_exps" in tensor.name else 1.0
        if tensor.name.startswith("token_embd") and not tied:
            continue
        read[tensor.type_name] = read.get(tensor.type_name, 0) + round(tensor.n_bytes * share)
        if tensor.name.startswith("blk."):
            params = round(tensor.n_elements * share)
            multiplied[tensor.type_name] = multiplied.get(tensor.type_name, 0) + params
    layers = {int(m.group(1)) for t in info.tensors if (m := _BLOCK.match(t.name))}
    return {
        "n_layers": len(layers),
        "n_vocab": _vocab_size(info),
        **{f"{READ_BYTES}:{name}": amount for name, amount in read.items()},
        **{f"{PREFILL_WEIGHTS}:{name}": amount for name, amount in multiplied.items()},
    }


READ_BYTES = "read_bytes"
PREFILL_WEIGHTS = "prefill_weights"


def work_by_type(params: dict[str, Any], prefix: str) -> dict[str, int]:
    """{type: amount} of one `per_token_work` quantity found in measurement params."""
    return {
        key.split(":", 1)[1]: int(value)
        for key, value in params.items()
        if key.startswith(prefix + ":")
    }


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def _used_expert_share(info: GGUFInfo) -> float:
    arch = info.architecture or ""
    total = info.metadata.get(f"{arch}.expert_count")
    used = info.metadata.get(f"{arch}.expert_used_count")
    if isinstance(total, int) and isinstance(used, int) and total > 0:
        return used / total
    return 1.0


def _vocab_size(info: GGUFInfo) -> int:
    embeddings = next((t for t in info.tensors if t.name == "token_embd.weight"), None)
    return embeddings.shape[1] if embeddings is not None and len(embeddings.shape) > 1 else 0


def measure_probes(
    probes: Sequence[SpeedProbe],
    *,
    quick: bool,
    budget: Budget,
    warmup_s: float,
    step: StepCallback | None = None,
) -> list[Measurement]:
    """Write each probe to a temporary folder, measure it on the CPU, delete it."""
    measurements: list[Measurement] = []
    cpu = EngineBackend("cpu", n_gpu_layers=0)
    with tempfile.TemporaryDirectory(prefix="hearthside-probe-") as folder:
        for done, probe in enumerate(probes):
            if budget.expired():
                measurements += _tagged(not_measured(SKIPPED_NOTE), probe, {})
                continue
            if step is not None:
                step(f"engine probe {probe.name}", done / max(1, len(probes)))
            path = Path(folder) / f"probe-{probe.name.lower()}.gguf"
            write_uniform_gguf(path, probe.shape, probe.type_name)
            work = per_token_work(validate_gguf(path))
            runs = measure_backend(path, cpu, quick=quick, budget=budget, warmup_s=warmup_s)
            measurements += _tagged(runs, probe, work)
            path.unlink(missing_ok=True)
    return measurements


def _tagged(
    measurements: list[Measurement], probe: SpeedProbe, work: dict[str, int]
) -> list[Measurement]:
    return [replace(m, params={**m.params, "probe": probe.name, **work}) for m in measurements]


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
    from hearthside.core.engine.engine import Engine  # llama.cpp loads only when a run starts

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
        **per_token_work(validate_gguf(engine.model_path)),
    }
