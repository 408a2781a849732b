"""The planner: for a model on a machine, the settings to load it with, and why.

A pure function of the model spec, the hardware profile and the goal (plus calibration
figures when there are some): it enumerates candidates — GPU layers, MoE experts kept on the
CPU, KV-cache type, context — sizes each with the memory model, drops those that do not fit,
predicts their speed, and returns the best for the goal with a reason per setting and the
runners-up. When nothing fits in memory it says what would (a shorter context, a smaller
quant, fewer parallel requests) and, if the weights can be streamed from disk, how fast that
would be.

Parallel requests (`n_parallel`, llama.cpp's sequence slots): each slot has its own `n_ctx`
tokens of KV cache, so N slots cost N times one slot's cache. Unless asked for a number, the
planner first chooses everything else for one slot, then gives that plan DEFAULT_PARALLEL
slots (this window and a few API clients at once) — or fewer, down to 1 — when they fit
beside it with the same margin. Slots never cost the user anything else: no shorter context,
no coarser KV cache, no layer moved off the GPU; when memory is tight the plan has one slot
and its reason says why. A number asked for is planned like an asked-for context (the other
settings are chosen to make room for it), and when it cannot fit the plan says so and how
many would.

Speed here is the ESTIMATE rigor of the tuning loop: decode is bounded by the bytes each token
reads from each memory tier over that tier's bandwidth (only the active experts of a MoE),
prefill by compute. Measured runs in the autotune DB outrank it (the tuner's job).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from hearthside.autotune.calibration_figures import LEARNED, logits_seconds
from hearthside.autotune.cpu_costs import (
    MEASURED,
    KernelCosts,
    bits_per_weight,
    cache_time_share,
    describe_key,
    kernel_costs,
    last_token_seconds,
    layer_seconds,
)
from hearthside.autotune.goals import KLD_BUDGET, RunQuality, kv_prior, kv_quality_text
from hearthside.autotune.memory import (
    CPU,
    LayerPlacement,
    MemoryEstimate,
    WeightPiece,
    device_of_piece,
    estimate_memory,
    pieces_from_spec,
    repacked_types,
)
from hearthside.autotune.recipes import matching
from hearthside.autotune.records import Recipe
from hearthside.core.engine.config import CHAT_CONTEXT, EngineConfig, TensorOverride
from hearthside.core.models.spec import ModelSpec, TensorGroup
from hearthside.core.probe.profile import GpuInfo, HardwareProfile
from hearthside.core.units import GIB, MIB, format_bytes
from hearthside.kernels.engine_run import base_type, experts_key, last_block_ffn
from hearthside.kernels.synthetic_model import uniform_writable

PLAN_SCHEMA = 1
Goal = Literal["fastest", "quality", "longest-context", "balanced"]
GOALS: tuple[Goal, ...] = ("fastest", "quality", "longest-context", "balanced")
Confidence = Literal["estimated", "calibrated", "measured"]
DEFAULT_CONTEXT = CHAT_CONTEXT  # what a chat runs, unless the goal asks for longer
MIN_CONTEXT = 2048
DEFAULT_FREE_MARGIN_BYTES = 2 * GIB  # "keep this much free for my other apps"
GPU_RUNTIME_BYTES = 512 * 1024 * 1024  # CUDA/ROCm context and driver allocations per GPU
# Share of peak bandwidth and compute llama.cpp reaches before calibration teaches better.
DECODE_EFFICIENCY = 0.6
PREFILL_EFFICIENCY = 0.35
CPU_FLOPS_PER_CYCLE = 32  # AVX2 FMA on fp32: 2 units x 8 lanes x 2
ASSUMED_CPU_HZ = 3.0e9
ASSUMED_CPU_BANDWIDTH = 20e9  # bytes/s, a dual-channel desktop, until calibrated
ASSUMED_DISK_BANDWIDTH = 1.0e9
# A CPU token whose weights come from RAM is bound by its bandwidth when their bytes at the
# measured read bandwidth take at least this share of the token's predicted time; below it,
# the kernels' own work (compute, per-row and per-layer costs) is what bounds it.
MEMORY_BOUND_SHARE = 0.5
# Streaming through mmap page faults reads at this share of the disk's cold sequential read
# speed where the calibration did not time faults (`kernels.disk.fault_read_s`): 0.34 measured
# on the 2-core EPYC VM's virtio disk (benchmarks/disk_streaming.py, a dense 1.6 GB model under
# a 768 MiB cgroup limit); ~1.0 on the Sapphire Rapids VM, where faults read 16 MiB each.
MMAP_STREAMING_EFFICIENCY = 0.35
# A page fault on the mapped model reads a window of the file around the page, not the page:
# the device's read-ahead, twice it once the file is fadvised sequential as llama.cpp does
# (measured: 16 MiB read per fault, centred on it, where read_ahead_kb is 8192).
FAULT_WINDOW_READ_AHEADS = 2
ASSUMED_READ_AHEAD_BYTES = 128 * 1024  # Linux's default read_ahead_kb, where none was probed
EXPERT_MATRICES = 3  # gate, up, down: a spec's experts group holds all three
PROMPT_TOKENS_FOR_TTFT = 512
KV_CHOICES = ("f16", "q8_0", "q4_0")
# Slots the planner gives a model unless asked: the window's chat and a few API clients (an
# editor, an agent) answered together rather than one after another.
DEFAULT_PARALLEL = 4


@dataclass(frozen=True)
class Reason:
    setting: str
    value: str
    why: str


@dataclass(frozen=True)
class DeviceBudget:
    """One memory tier: what the plan puts there and what is left."""

    device: str
    capacity_bytes: int  # usable: total minus the margin and runtime overhead
    weights_bytes: int
    kv_bytes: int
    compute_bytes: int
    overhead_bytes: int

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.compute_bytes + self.overhead_bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes


@dataclass(frozen=True)
class SpeedEstimate:
    prefill_tps: float
    decode_tps: float  # with the KV cache half full: a typical token of a long conversation
    ttft_s: float
    decode_bound_by: str  # the tier that takes most of each token's time
    # with an empty KV cache: what llama-bench's tgN (and the tuner's runs) measure
    decode_tps_empty_context: float = 0.0
    # the learned factors (measured over predicted) already applied to the figures above
    learned_decode: float = 1.0
    learned_prefill: float = 1.0
    # what bounds decode on that tier (see DECODE_LIMITS)
    decode_limit: str = "memory bandwidth"
    # streaming from disk: the weights that stay in RAM, and the bytes a token reads from disk
    resident_weights_bytes: int = 0
    disk_read_bytes_per_token: int = 0
    # of those in RAM, the repacked copies (anonymous memory, never paged back from the file)
    pinned_weights_bytes: int = 0
    # the share of the routed experts' bytes a token's page faults bring in (`_streaming`)
    expert_fetch_share: float = 0.0
    decode_read_bytes_per_token: int = 0  # weights a token reads on the bounding tier
    # what a prompt batch costs once, whatever its length (`prefill_tps` is at
    # PROMPT_TOKENS_FOR_TTFT tokens; `prefill_tps_at` gives other lengths)
    prefill_batch_s: float = 0.0

    def prefill_tps_at(self, n_tokens: int) -> float:
        """Prompt tok/s for a prompt of `n_tokens` (one batch)."""
        if not self.prefill_tps:
            return 0.0
        per_token = 1 / self.prefill_tps - self.prefill_batch_s / PROMPT_TOKENS_FOR_TTFT
        return 1 / (per_token + self.prefill_batch_s / max(1, n_tokens))


# "cache": the CPU's weights fit in its last-level cache (L3; Apple's SLC where the OS reports
# it), so they are read from there and its kernels bound decode, not the RAM bandwidth.
DECODE_LIMITS = ("memory bandwidth", "compute", "cache", "disk")


@dataclass(frozen=True)
class Candidate:
    config: EngineConfig
    devices: tuple[DeviceBudget, ...]
    speed: SpeedEstimate
    fits: bool
    streams_from_disk: bool
    # why a candidate that does not fit cannot stream from disk either ("" when it can)
    stream_blocked: str = ""

    def summary(self) -> dict[str, Any]:
        return {
            "n_gpu_layers": self.config.n_gpu_layers,
            "expert_layers_on_cpu": cpu_expert_layers(self.config),
            "type_k": self.config.type_k,
            "n_ctx": self.config.n_ctx,
            "n_parallel": self.config.n_parallel,
            "decode_tps": round(self.speed.decode_tps, 1),
            "prefill_tps": round(self.speed.prefill_tps, 1),
            "fits": self.fits,
            "streams_from_disk": self.streams_from_disk,
        }


@dataclass(frozen=True)
class Plan:
    model: str
    goal: Goal
    config: EngineConfig
    devices: tuple[DeviceBudget, ...]
    speed: SpeedEstimate
    fits: bool
    streams_from_disk: bool
    confidence: Confidence
    reasons: tuple[Reason, ...]
    alternatives: tuple[dict[str, Any], ...]
    advice: tuple[str, ...] = ()
    schema: int = PLAN_SCHEMA

    @property
    def kv_bytes(self) -> int:
        """The KV cache on every device together: all `n_parallel` slots."""
        return sum(device.kv_bytes for device in self.devices)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["config"] = self.config.to_dict()
        data["devices"] = [
            {**asdict(device), "used_bytes": device.used_bytes, "free_bytes": device.free_bytes}
            for device in self.devices
        ]
        data["slots"] = {
            "n_parallel": self.config.n_parallel,
            "n_ctx_per_slot": self.config.n_ctx,
            "total_context": self.config.total_context,
            "kv_bytes": self.kv_bytes,
            "text": describe_slots(self),
        }
        return data


@dataclass(frozen=True)
class Machine:
    """The planner's view of a profile: tiers with capacity, bandwidth and compute."""

    gpus: tuple[str, ...]  # engine device names, in order
    gpu_infos: tuple[GpuInfo, ...]
    ram_bytes: int
    cpu_bandwidth: float
    cpu_flops: float
    disk_bandwidth: float
    unified: bool
    repacked: frozenset[str] = field(default_factory=frozenset)
    calibrated: bool = False
    decode_efficiency: float = DECODE_EFFICIENCY
    prefill_efficiency: float = PREFILL_EFFICIENCY
    # the CPU costs the calibration fitted (autotune/calibration.py, autotune/cpu_costs.py)
    kernel_figures: dict[str, float] = field(default_factory=dict)
    # measured over predicted speed, learned from the tuner's runs: {"decode:CPU": 1.08}
    learned: dict[str, float] = field(default_factory=dict)
    cpu_cache_bytes: int | None = None  # the last-level cache, all of it (None: unknown)
    # the threads a config without n_threads (decode) / n_threads_batch (prefill) runs with
    cpu_cores: int = 1
    cpu_logical_cores: int = 1
    read_ahead_bytes: int | None = None  # the models disk's; None: unknown
    # cold page faults on a mapped file, measured (calibration); None: not measured
    disk_fault_bandwidth: float | None = None

    @property
    def streaming_bandwidth(self) -> float:
        """What mmap streams weights from disk at: page faults as the calibration timed
        them, else a share of the cold sequential read (MMAP_STREAMING_EFFICIENCY)."""
        return self.disk_fault_bandwidth or self.disk_bandwidth * MMAP_STREAMING_EFFICIENCY

    @property
    def fault_window_bytes(self) -> int:
        """What one page fault on the mapped model file reads from disk."""
        read_ahead = self.read_ahead_bytes or ASSUMED_READ_AHEAD_BYTES
        return FAULT_WINDOW_READ_AHEADS * read_ahead

    def default_threads(self, kind: str) -> int:
        return self.cpu_cores if kind == "decode" else max(self.cpu_cores, self.cpu_logical_cores)

    def thread_speedup(self, kind: str, threads: int | None) -> float:
        """`kind`'s CPU speed at `threads` (None: the default) over its speed at the threads
        the calibration ran at ("<kind>_threads"; uncalibrated, the default): measured, when
        calibration timed that count ("<kind>_thread_scale:<n>"), else in proportion to the
        physical cores used (SMT siblings add little to llama.cpp's kernels)."""
        wanted = threads or self.default_threads(kind)
        reference = int(self.kernel_figures.get(f"{kind}_threads") or self.default_threads(kind))
        if wanted == reference:
            return 1.0
        measured = self.kernel_figures.get(f"{kind}_thread_scale:{wanted}")
        if measured:
            return measured
        cores = max(1, self.cpu_cores)
        return min(wanted, cores) / min(reference, cores)

    def read_bandwidth(self, threads: int | None) -> float:
        """RAM read bytes/s for a decode with `threads`: `cpu_bandwidth` at the threads the
        calibration ran decode at (what its costs were fitted against), calibration's read
        figure for another count (fewer threads pull less), else `cpu_bandwidth`."""
        reference = self.kernel_figures.get("decode_threads") or self.default_threads("decode")
        if threads is None or threads == reference:
            return self.cpu_bandwidth
        return self.kernel_figures.get(f"cpu_read_bytes_per_s:{threads}") or self.cpu_bandwidth

    def cpu_costs(self, kind: str) -> KernelCosts:
        """Seconds per unit (byte read, weight multiplied) and per row, by calibrated weight
        type, for "decode" or "prefill" on the CPU."""
        ideal = 1 / self.cpu_bandwidth if kind == "decode" else 2 / self.cpu_flops
        return kernel_costs(self.kernel_figures, kind, ideal, self.repacked)

    def cpu_seconds(
        self,
        kind: str,
        units: dict[str, float],
        rows: dict[str, float],
        layers: int,
        arch: str,
        threads: int | None = None,
        touched_bytes: float | None = None,
    ) -> float:
        """A token's CPU time for `kind` with `threads` (None: the default): its weights at
        their types' costs (the machine's overall efficiency when no type was calibrated;
        for decode, less where a cache holds more of the `touched_bytes` than of the
        calibration's probes: `cache_time_share`), the fixed cost of its layers and, for
        decode, of the token's own llama_decode call; all over `thread_speedup`. The
        kernels' time: RAM may bound decode (`_cpu_decode`)."""
        costs = self.cpu_costs(kind)
        if costs.per_unit:
            weights = costs.seconds(units, rows)
            if kind == "decode" and touched_bytes is not None:
                weights *= cache_time_share(self.kernel_figures, touched_bytes)
        else:
            ideal = 1 / self.cpu_bandwidth if kind == "decode" else 2 / self.cpu_flops
            overall = self.decode_efficiency if kind == "decode" else self.prefill_efficiency
            weights = sum(units.values()) * ideal / overall
        per_token = self.kernel_figures.get(f"{kind}_overhead_s_per_token", 0.0)
        seconds = weights + layers * layer_seconds(self.kernel_figures, kind, arch) + per_token
        return seconds / self.thread_speedup(kind, threads)


def plan(
    spec: ModelSpec,
    profile: HardwareProfile,
    *,
    goal: Goal = "balanced",
    n_ctx: int | None = None,
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES,
    calibration: dict[str, float] | None = None,
    expert_placement: bool = True,
    pieces: Sequence[WeightPiece] | None = None,
    n_ubatch: int | None = None,
    n_parallel: int | None = None,
    kv_types: Sequence[str] = KV_CHOICES,
    kv_priors: Mapping[str, RunQuality] | None = None,
) -> Plan:
    """The settings for `spec` on `profile`. `calibration` may give measured
    "cpu_read_bytes_per_s", "cpu_flops", "disk_read_bytes_per_s", and the engine's costs
    against them (`autotune.calibration.engine_efficiency`); `expert_placement=False`
    limits a MoE to whole-layer offload (what tools without `-ot` can do); `pieces`, the
    model file's tensors (`pieces_from_gguf`), size it tensor by tensor rather than by the
    spec's groups; `n_ubatch` plans with smaller micro-batches than the engine's default
    (smaller compute buffers); `n_parallel` asks for that many slots (None: the planner
    chooses, see the module docstring); `kv_types` limits the KV-cache types tried (the
    back-off keeps the KV of one slot while it drops slots); `kv_priors`, the KV types'
    quality measured on this model or its family (`family_quality.kv_priors`; the rest count
    at the global priors), decide which KV types "fastest" keeps within the KLD budget."""
    machine = describe_machine(profile, calibration or {})
    contexts = _contexts(spec, goal, n_ctx)
    recipes = matching(spec, profile)
    allowed_kv = tuple(kv for kv in KV_CHOICES if kv in kv_types) or KV_CHOICES
    recipe_kv = _recipe_setting(recipes, "kv_types", KV_CHOICES)
    preferred_kv = tuple(kv for kv in recipe_kv if kv in allowed_kv) or allowed_kv
    numa = _recipe_setting(recipes, "numa", "off")
    if pieces is None:
        pieces = pieces_from_spec(spec)  # once: sizing each candidate from the spec is slow

    def evaluated(kv_choices: Sequence[str], slots: int) -> list[Candidate]:
        configs = _configs(spec, machine, contexts, profile, expert_placement, kv_choices)
        changes: dict[str, Any] = {"n_parallel": slots, "numa": numa}
        if n_ubatch is not None:
            changes["n_ubatch"] = n_ubatch
        configs = [config.with_changes(**changes) for config in configs]
        return [_evaluate(spec, machine, config, free_margin_bytes, pieces) for config in configs]

    def sized(slots: int) -> list[Candidate]:
        candidates = evaluated(preferred_kv, slots)
        if not any(c.fits for c in candidates) and preferred_kv != allowed_kv:
            return evaluated(allowed_kv, slots)  # a recipe's preference yields when nothing fits
        return candidates

    candidates = sized(n_parallel or 1)
    fitting = [candidate for candidate in candidates if candidate.fits]
    pool = fitting or [c for c in candidates if c.streams_from_disk]
    if not pool:
        fewer = None
        if n_parallel is not None and n_parallel > 1:
            fewer = _most_slots_that_fit(n_parallel, lambda n: any(c.fits for c in sized(n)))
        return _nothing_fits(spec, goal, candidates, machine, fewer)
    ranked = sorted(pool, key=lambda candidate: _score(candidate, goal, kv_priors), reverse=True)
    best, slots_reason = ranked[0], None
    if n_parallel is None:
        best, slots_reason = _add_slots(spec, machine, ranked[0], free_margin_bytes, pieces)
    return Plan(
        model=spec.name,
        goal=goal,
        config=best.config,
        devices=best.devices,
        speed=best.speed,
        fits=best.fits,
        streams_from_disk=best.streams_from_disk,
        confidence=_confidence(machine, best.speed),
        reasons=tuple(
            _reasons(spec, machine, best, goal, kv_priors)
            + [slots_reason or _asked_slots_reason(best.config)]
            + _recipe_reasons(recipes)
            + weight_cost_reasons(machine, token_work(spec, best.config, machine.gpus, pieces))
        ),
        alternatives=tuple(candidate.summary() for candidate in ranked[1:4]),
        advice=tuple(_advice(spec, best)),
    )


def _add_slots(
    spec: ModelSpec,
    machine: Machine,
    best: Candidate,
    margin: int,
    pieces: Sequence[WeightPiece],
) -> tuple[Candidate, Reason]:
    """`best` (planned for one slot) with the most slots up to DEFAULT_PARALLEL that fit
    beside it, everything else unchanged; with the reason for the number."""
    config = best.config
    if not best.fits:
        why = (
            "One request at a time: the weights already stream from disk, so there is no "
            "memory for the KV cache of more."
        )
        return best, Reason("n_parallel", "1", why)
    tried = None
    for slots in range(DEFAULT_PARALLEL, 1, -1):
        tried = _evaluate(spec, machine, config.with_changes(n_parallel=slots), margin, pieces)
        if tried.fits:
            kv = sum(device.kv_bytes for device in tried.devices)
            why = (
                f"{slots} requests at once — this window and API clients — each with its own "
                f"{config.n_ctx}-token context: the KV cache holds {slots} × {config.n_ctx} "
                f"tokens ({format_bytes(kv)}), which fits beside the rest with the margin. "
                "Further requests wait their turn."
            )
            return tried, Reason("n_parallel", str(slots), why)
    assert tried is not None  # DEFAULT_PARALLEL > 1: two slots were tried last
    worst = min(tried.devices, key=lambda device: device.free_bytes)
    why = (
        f"One request at a time: a second slot's KV cache would need "
        f"{format_bytes(-worst.free_bytes)} more on {worst.device} than the margin leaves, and "
        "the planner does not shorten the context, quantize the KV cache or move layers off "
        "the GPU to make room for slots. Other requests wait their turn (--parallel asks for "
        "more)."
    )
    return best, Reason("n_parallel", "1", why)


def _asked_slots_reason(config: EngineConfig) -> Reason:
    slots = config.n_parallel
    if slots == 1:
        return Reason("n_parallel", "1", "As asked: one request at a time; others wait.")
    why = (
        f"As asked: {slots} requests at once, each with its own {config.n_ctx}-token context "
        f"(the KV cache holds {slots} × {config.n_ctx} tokens)."
    )
    return Reason("n_parallel", str(slots), why)


def _most_slots_that_fit(asked: int, fits: Callable[[int], bool]) -> int | None:
    """The most slots below `asked` with which `fits` holds (None: not even one); a binary
    search, since more slots never take less memory."""
    low, high, found = 1, asked - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(middle):
            found, low = middle, middle + 1
        else:
            high = middle - 1
    return found


def describe_slots(result: Plan) -> str:
    """The plan's slots and what their KV cache costs, one line for the CLI and the window:
    "4 parallel requests × 8192 tokens: KV cache for 32768 tokens, 4.0 GiB"."""
    config = result.config
    slots = config.n_parallel
    requests = "1 request" if slots == 1 else f"{slots} parallel requests"
    return (
        f"{requests} × {config.n_ctx} tokens: KV cache for {config.total_context} tokens, "
        f"{format_bytes(result.kv_bytes)}"
    )


def describe_machine(profile: HardwareProfile, calibration: dict[str, float]) -> Machine:
    engine_devices = profile.engine.devices if profile.engine else ()
    gpu_devices = [device.name for device in engine_devices if device.kind == "gpu"]
    gpu_infos = tuple(gpu for gpu in profile.gpus if not gpu.integrated or gpu.unified_memory)
    gpus = tuple(gpu_devices[: len(gpu_infos)])
    cpu = profile.cpu
    cores = cpu.performance_cores or cpu.physical_cores or 1
    ram = profile.memory.cgroup_limit_bytes or profile.memory.total_bytes or 8 * GIB
    disk = next((d.read_bytes_per_s for d in profile.disks if d.read_bytes_per_s), None)
    measured = {k: v for k, v in calibration.items() if not k.startswith(LEARNED)}
    return Machine(
        gpus=gpus,
        gpu_infos=gpu_infos[: len(gpus)],
        ram_bytes=ram,
        cpu_bandwidth=calibration.get("cpu_read_bytes_per_s")
        or profile.memory.bandwidth_bytes_per_s
        or ASSUMED_CPU_BANDWIDTH,
        cpu_flops=calibration.get("cpu_flops")
        or cores * (cpu.max_frequency_hz or ASSUMED_CPU_HZ) * CPU_FLOPS_PER_CYCLE,
        disk_bandwidth=calibration.get("disk_read_bytes_per_s") or disk or ASSUMED_DISK_BANDWIDTH,
        disk_fault_bandwidth=calibration.get("disk_fault_read_bytes_per_s"),
        unified=any(gpu.unified_memory for gpu in gpu_infos),
        repacked=repacked_types(cpu.flags, cpu.arch),
        calibrated=bool(measured),
        decode_efficiency=calibration.get("decode_efficiency", DECODE_EFFICIENCY),
        prefill_efficiency=calibration.get("prefill_efficiency", PREFILL_EFFICIENCY),
        kernel_figures=measured,
        learned={k.removeprefix(LEARNED): v for k, v in calibration.items() if k not in measured},
        cpu_cache_bytes=cpu.l3_cache_bytes,
        cpu_cores=cores,
        cpu_logical_cores=cpu.logical_cores or cores,
        read_ahead_bytes=_models_disk_read_ahead(profile),
    )


def _models_disk_read_ahead(profile: HardwareProfile) -> int | None:
    return next((d.read_ahead_bytes for d in profile.disks if d.read_ahead_bytes), None)


def _contexts(spec: ModelSpec, goal: Goal, n_ctx: int | None) -> list[int]:
    trained = spec.context_length or DEFAULT_CONTEXT
    if n_ctx is not None:
        return [n_ctx]
    if goal == "longest-context":
        sizes, size = [], trained
        while size >= MIN_CONTEXT:
            sizes.append(size)
            size //= 2
        return sizes or [trained]
    return sorted({min(trained, DEFAULT_CONTEXT), min(trained, MIN_CONTEXT)}, reverse=True)


def _configs(
    spec: ModelSpec,
    machine: Machine,
    contexts: Sequence[int],
    profile: HardwareProfile,
    expert_placement: bool,
    kv_types: Sequence[str],
) -> list[EngineConfig]:
    n_layers = spec.n_layers or len(spec.layers)
    placements: list[tuple[int, tuple[TensorOverride, ...]]] = [
        (layers, ()) for layers in (_layer_counts(n_layers) if machine.gpus else [0])
    ]
    if (
        spec.n_expert and machine.gpus and expert_placement
    ):  # every layer on the GPU but the first N's experts
        placements += [(-1, experts_on_cpu(n)) for n in _layer_counts(n_layers)[1:-1]]
    configs = []
    for n_ctx in contexts:
        for kv in kv_types:
            for layers, overrides in placements:
                configs.append(
                    EngineConfig(
                        model_path=spec.ref or spec.name,
                        n_ctx=n_ctx,
                        n_gpu_layers=layers,
                        type_k=kv,
                        type_v=kv,
                        flash_attn=True,
                        tensor_overrides=overrides,
                        n_threads=profile.cpu.performance_cores or profile.cpu.physical_cores,
                    )
                )
    return configs  # KV is f16/q8_0/q4_0 only: never bf16, which V100 (sm_70) lacks


_EXPERT_LAYERS = re.compile(r"blk\\\.\(([0-9|]+)\)\\\.ffn_")


def _recipe_setting(recipes: Sequence[Recipe], name: str, default: Any) -> Any:
    for recipe in recipes:
        if name in recipe.settings:
            value = recipe.settings[name]
            return tuple(value) if isinstance(value, list) else value
    return default


MEASURE_TYPES_HINT = "`hearthside plan MODEL --measure-types` measures it"


def weight_cost_sources(machine: Machine, work: TokenWork) -> dict[str, str]:
    """{type: "measured" | "estimated from <type>"} for each weight type the CPU runs, by
    the decode costs (prefill's when they differ: a probe may pass one fit and not the
    other); {} when the calibration costed no type (the machine's overall figures apply)."""
    sources: dict[str, str] = {}
    for kind in ("decode", "prefill"):
        costs = machine.cpu_costs(kind)
        units = work.read_bytes if kind == "decode" else work.prefill_weights
        for type_name in sorted(units.get(CPU, {})):
            source = costs.source(type_name)
            if source is not None and sources.get(type_name, MEASURED) == MEASURED:
                sources[type_name] = source
    return sources


def weight_cost_reasons(machine: Machine, work: TokenWork) -> list[Reason]:
    """Which weight types' CPU costs were measured here and which borrow another's."""
    sources = weight_cost_sources(machine, work)
    if not sources:
        return []
    measured = [t for t, source in sources.items() if source == MEASURED]
    estimated = [t for t, source in sources.items() if source != MEASURED]
    if not estimated:
        why = f"{', '.join(map(describe_key, measured))}: measured on this machine."
        return [Reason("weight costs", "measured", why)]
    writable = [t for t in estimated if uniform_writable(base_type(t))]
    probed = ", ".join(f"{describe_key(t)} {sources[t]}" for t in writable)
    unprobed = ", ".join(f"{describe_key(t)} {sources[t]}" for t in estimated if t not in writable)
    parts = [f"{probed} (not measured on this machine; {MEASURE_TYPES_HINT})"] if probed else []
    parts += [f"{unprobed} (no probe of it can be written here)"] if unprobed else []
    why = "; ".join(parts) + "."
    if measured:
        why += f" {', '.join(map(describe_key, measured))}: measured."
    return [Reason("weight costs", "estimated", why)]


def _recipe_reasons(recipes: Sequence[Recipe]) -> list[Reason]:
    return [Reason("recipe", recipe.id, recipe.rationale) for recipe in recipes]


def experts_on_cpu(n_layers: int) -> tuple[TensorOverride, ...]:
    """llama.cpp's `--n-cpu-moe N`: the routed experts of the first N layers stay in RAM."""
    layers = "|".join(str(index) for index in range(n_layers))
    return (TensorOverride(rf"blk\.({layers})\.ffn_(up|down|gate)_exps", "CPU"),)


def cpu_expert_layers(config: EngineConfig) -> int:
    """N of `experts_on_cpu(N)` in a config (0 when experts follow their layers)."""
    for override in config.tensor_overrides:
        if match := _EXPERT_LAYERS.match(override.pattern):
            return len(match.group(1).split("|"))
    return 0


def _layer_counts(n_layers: int) -> list[int]:
    """All (-1), then fewer and fewer: every layer count would be slow to size for 126 layers."""
    step = max(1, n_layers // 16)
    return [-1, *range(n_layers, 0, -step), 0]


def _evaluate(
    spec: ModelSpec,
    machine: Machine,
    config: EngineConfig,
    margin: int,
    pieces: Sequence[WeightPiece],
) -> Candidate:
    estimate = estimate_memory(
        spec, config, gpus=machine.gpus, repacked=machine.repacked, pieces=pieces
    )
    devices = _budgets(estimate, machine, margin)
    gpus_fit = all(d.free_bytes >= 0 for d in devices if d.device != CPU)
    cpu = next(d for d in devices if d.device == CPU)
    fits = gpus_fit and cpu.free_bytes >= 0
    # mmap can page weights in from disk when RAM is short, if everything else fits, the
    # repacked copies too: they are anonymous memory, not pages of the file
    pinned = estimate.devices[CPU].repacked_bytes
    all_but_weights_fit = cpu.free_bytes + cpu.weights_bytes >= 0
    rest_fits = gpus_fit and not fits and config.use_mmap and all_but_weights_fit
    streams = rest_fits and cpu.free_bytes + cpu.weights_bytes - pinned >= 0
    blocked = _repacked_block(machine, pieces, cpu, pinned) if rest_fits and not streams else ""
    work = token_work(spec, config, machine.gpus, pieces)
    speed = _speed(
        spec,
        machine,
        estimate,
        work,
        streams_from_disk=streams,
        ram=cpu.capacity_bytes,
        n_parallel=config.n_parallel,
        expert_fetch_share=(
            expert_fetch_share(spec, pieces, machine.fault_window_bytes) if streams else 0.0
        ),
    )
    return Candidate(config, devices, speed, fits, streams, blocked)


def _repacked_block(
    machine: Machine, pieces: Sequence[WeightPiece], cpu: DeviceBudget, pinned_bytes: int
) -> str:
    """Why weights that would stream cannot: the repacked ones do not fit in RAM."""
    held = {t for piece in pieces for t in piece.type_names} & machine.repacked
    types = "/".join(sorted(held or machine.repacked))
    room = max(0, cpu.free_bytes + cpu.weights_bytes)
    return (
        f"This CPU's llama.cpp repacks {types} weights into a faster layout at load: "
        f"{format_bytes(pinned_bytes)} of them, in anonymous memory that cannot be streamed from "
        f"the file, more than the {format_bytes(room)} of RAM left beside the KV cache and "
        "compute buffers, so the model cannot stream from disk either."
    )


def _budgets(estimate: MemoryEstimate, machine: Machine, margin: int) -> tuple[DeviceBudget, ...]:
    budgets = []
    for name, memory in estimate.devices.items():
        if name == CPU:
            capacity = machine.ram_bytes - margin
            overhead = 0
        else:
            gpu = machine.gpu_infos[machine.gpus.index(name)]
            total = gpu.recommended_working_set_bytes or gpu.vram_total_bytes or 0
            capacity = total - (0 if gpu.unified_memory else margin // 2)
            overhead = 0 if gpu.unified_memory else GPU_RUNTIME_BYTES
        budgets.append(
            DeviceBudget(
                device=name,
                capacity_bytes=capacity,
                weights_bytes=memory.weights_bytes,
                kv_bytes=memory.kv_bytes,
                compute_bytes=memory.compute_bytes + memory.output_bytes,
                overhead_bytes=overhead,
            )
        )
    if machine.unified:  # one pool: the GPU's share comes out of the same RAM
        gpu_use = sum(b.used_bytes for b in budgets if b.device != CPU)
        budgets = [
            replace(b, capacity_bytes=b.capacity_bytes - gpu_use) if b.device == CPU else b
            for b in budgets
        ]
    return tuple(budgets)


@dataclass(frozen=True)
class TokenWork:
    """Per device and weight type: bytes a decoded token reads and the matrix rows they form,
    weights and rows a prompt token multiplies; and the blocks each device runs."""

    read_bytes: dict[str, dict[str, float]]
    prefill_weights: dict[str, dict[str, float]]
    layers: dict[str, int]
    read_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    prefill_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    # the matrices a prompt batch runs for its last token only: bytes and rows, once a batch
    last_token_bytes: dict[str, dict[str, float]] = field(default_factory=dict)
    last_token_rows: dict[str, dict[str, float]] = field(default_factory=dict)
    # the config's n_threads and n_threads_batch (None: the engine's default)
    decode_threads: int | None = None
    prefill_threads: int | None = None
    # per device, the bytes of weights decode reads over many tokens: routed experts whole
    # (each token reads other ones), which a cache holds or not (`cache_time_share`)
    touched_bytes: dict[str, float] = field(default_factory=dict)


def token_work(
    spec: ModelSpec, config: EngineConfig, gpus: Sequence[str], pieces: Sequence[WeightPiece]
) -> TokenWork:
    """Decode reads every weight matrix once per token — only the used share of routed
    experts (costed under their own key, `experts_key`), and of the input embeddings one
    row, unless they double as the output layer;
    prefill multiplies the blocks' matrices for every prompt token (the output layer and the
    last block's FFN run for the last one only, once a batch: `last_token_bytes`). The same
    rule as `kernels.engine_run.per_token_work`, placed."""
    n_layers = spec.n_layers or len(spec.layers)
    placement = LayerPlacement(n_layers, config, gpus)
    used_share = spec.n_expert_used / spec.n_expert if spec.n_expert else 1.0
    read: dict[str, dict[str, float]] = {}
    multiplied: dict[str, dict[str, float]] = {}
    read_rows: dict[str, dict[str, float]] = {}
    prefill_rows: dict[str, dict[str, float]] = {}
    last_bytes: dict[str, dict[str, float]] = {}
    last_rows: dict[str, dict[str, float]] = {}
    touched: dict[str, float] = {}
    for piece in pieces:
        embeddings = piece.name.startswith("token_embd")
        if (embeddings and not spec.tied_embeddings) or (not embeddings and not piece.matmul):
            continue
        device = (
            placement.device_of(n_layers)
            if embeddings
            else device_of_piece(piece, placement, config)
        )
        routed = "_exps" in piece.name
        share = used_share if routed else 1.0
        in_block = piece.layer is not None and piece.layer < n_layers
        in_block = in_block and not last_block_ffn(piece.name, n_layers)
        weights = piece.bytes * 8 / _piece_bits(piece, spec)
        split = share / max(1, len(piece.type_names))  # a group of no type adds nothing
        if piece.type_names:
            touched[device] = touched.get(device, 0.0) + piece.bytes
        for type_name in piece.type_names:
            key = experts_key(type_name) if routed else type_name
            _add(read, device, key, piece.bytes * split)
            _add(read_rows, device, key, piece.rows * split)
            if in_block and not embeddings:
                _add(multiplied, device, key, weights * split)
                _add(prefill_rows, device, key, piece.rows * split)
            else:
                _add(last_bytes, device, key, piece.bytes * split)
                _add(last_rows, device, key, piece.rows * split)
    layers: dict[str, int] = {}
    for index in range(n_layers):
        device = placement.device_of(index)
        layers[device] = layers.get(device, 0) + 1
    return TokenWork(
        read,
        multiplied,
        layers,
        read_rows,
        prefill_rows,
        last_bytes,
        last_rows,
        decode_threads=config.n_threads,
        prefill_threads=config.n_threads_batch,
        touched_bytes=touched,
    )


def _piece_bits(piece: WeightPiece, spec: ModelSpec) -> float:
    """A tensor's bits per weight; for a spec's group of several types, its group's average
    (`pieces_from_spec` names each group after one of its tensors)."""
    if len(piece.type_names) == 1:
        return bits_per_weight(piece.type_names[0])
    group = _spec_group(spec, piece)
    if group is not None and group.params:
        return group.bytes * 8 / group.params
    return spec.bits_per_weight or 8.0


_GROUP_OF_TENSOR = {
    "attn_q": "attention",
    "ffn_up": "ffn",
    "ffn_up_exps": "experts",
    "ffn_up_shexp": "shared_experts",
}


def _spec_group(spec: ModelSpec, piece: WeightPiece) -> TensorGroup | None:
    if piece.name.startswith("token_embd"):
        return spec.embeddings
    if piece.name.startswith("output."):
        return spec.output
    kind = piece.name.split(".")[-2] if piece.name.count(".") >= 2 else ""
    if piece.layer is None or kind not in _GROUP_OF_TENSOR:
        return None
    layer = next((layer for layer in spec.layers if layer.index == piece.layer), None)
    return getattr(layer, _GROUP_OF_TENSOR[kind]) if layer is not None else None


def _add(table: dict[str, dict[str, float]], device: str, type_name: str, amount: float) -> None:
    row = table.setdefault(device, {})
    row[type_name] = row.get(type_name, 0.0) + amount


def _speed(
    spec: ModelSpec,
    machine: Machine,
    estimate: MemoryEstimate,
    work: TokenWork,
    *,
    streams_from_disk: bool,
    ram: int,
    n_parallel: int = 1,
    expert_fetch_share: float = 1.0,
) -> SpeedEstimate:
    """Decode: per tier, each weight type's bytes over the bandwidth its kernels reach (on the
    CPU, `_cpu_decode`), half of one slot's KV cache on average (a request reads its own),
    and on the CPU the logits; when streaming, what a token reads from disk (`_streaming`);
    then both speeds scaled by what measured runs taught about the tier that bounds decode.
    One request's speed: slots decoding together share the weight reads, which this does not
    model."""
    seconds_by_tier: dict[str, float] = {}
    kv_seconds = 0.0
    cpu_limit = "memory bandwidth"
    for name, memory in estimate.devices.items():
        bandwidth = _bandwidth(machine, name)
        kv_read = memory.kv_bytes / n_parallel / 2
        kv = kv_read / (bandwidth * machine.decode_efficiency)
        if name == CPU:
            weights, cpu_limit = _cpu_decode(spec, machine, work, kv_read)
        else:
            weights = sum(work.read_bytes.get(name, {}).values()) / (
                bandwidth * machine.decode_efficiency
            )
        kv_seconds += kv
        seconds_by_tier[name] = weights + kv
    seconds_by_tier[CPU] = seconds_by_tier.get(CPU, 0.0) + logits_seconds(
        spec.vocab_size or 0, machine.cpu_bandwidth
    )
    resident, from_disk = (
        _streaming(estimate, ram, expert_fetch_share) if streams_from_disk else (0, 0)
    )
    if streams_from_disk:
        seconds_by_tier["disk"] = from_disk / machine.streaming_bandwidth
    per_token = sum(seconds_by_tier.values())
    bound_by = max(seconds_by_tier, key=lambda tier: seconds_by_tier[tier])
    limit = {CPU: cpu_limit, "disk": "disk"}.get(bound_by, "memory bandwidth")
    learned_decode = machine.learned.get(f"decode:{bound_by}", 1.0)
    learned_prefill = machine.learned.get(f"prefill:{bound_by}", 1.0)
    per_prompt_token, per_batch = _prefill_seconds(spec, machine, work)
    prefill = learned_prefill / (per_prompt_token + per_batch / PROMPT_TOKENS_FOR_TTFT)
    empty = per_token - kv_seconds
    return SpeedEstimate(
        prefill_tps=prefill,
        prefill_batch_s=per_batch / learned_prefill,
        decode_tps=learned_decode / per_token if per_token else 0.0,
        ttft_s=PROMPT_TOKENS_FOR_TTFT / prefill if prefill else float("inf"),
        decode_bound_by=bound_by,
        decode_tps_empty_context=learned_decode / empty if empty > 0 else 0.0,
        learned_decode=learned_decode,
        learned_prefill=learned_prefill,
        decode_limit=limit,
        resident_weights_bytes=resident,
        disk_read_bytes_per_token=from_disk,
        pinned_weights_bytes=estimate.devices[CPU].repacked_bytes if streams_from_disk else 0,
        expert_fetch_share=expert_fetch_share if streams_from_disk and spec.n_expert else 0.0,
        decode_read_bytes_per_token=round(
            from_disk if bound_by == "disk" else sum(work.read_bytes.get(bound_by, {}).values())
        ),
    )


def _cpu_decode(
    spec: ModelSpec, machine: Machine, work: TokenWork, kv_read_bytes: float
) -> tuple[float, str]:
    """A decoded token's weight time on the CPU, and what bounds it. The calibrated kernel
    costs are the compute side. A token whose weights (and the KV it reads) fit in the
    last-level cache reads them from there, not from RAM — a 250 MB model in a 480 MiB L3 —
    so those costs alone bound it ("cache"). Otherwise the bytes also come from RAM, no
    faster than its measured read bandwidth (calibration probes that ran from the cache are
    faster than that); RAM bounds the token where that takes MEMORY_BOUND_SHARE of it."""
    compute = _cpu_seconds("decode", spec, machine, work)
    read_bytes = sum(work.read_bytes.get(CPU, {}).values())
    cache = machine.cpu_cache_bytes
    if cache and read_bytes + kv_read_bytes <= cache:
        return compute, "cache"
    ram = read_bytes / machine.read_bandwidth(work.decode_threads)
    limit = "memory bandwidth" if ram >= MEMORY_BOUND_SHARE * compute else "compute"
    return max(compute, ram), limit


def _streaming(estimate: MemoryEstimate, ram: int, expert_fetch_share: float) -> tuple[int, int]:
    """Weights that stay in RAM from one token to the next while mmap streams the rest, and
    the bytes a token reads from disk. The page cache evicts what was used least recently;
    repacked copies are anonymous memory and never leave. When what a token reads fits in the
    RAM left beside them, the KV cache and compute buffers, the always-used tensors
    (attention, dense FFNs, shared experts, the output layer) stay, and so does a share of the
    routed experts, of which a token's page faults bring in `expert_fetch_share`. When it does
    not fit — a dense model larger than RAM, or a MoE whose disk's read-ahead brings in whole
    expert tensors — every page is evicted before the next token reaches it again, so a token
    reads all of it from disk (measured: 1.44 of 1.50 GB a token for a dense model under a
    768 MiB limit, where keeping the share that fits would read 0.86). Neither the input
    embeddings (one row a token) nor the mapped originals of repacked weights are read."""
    cpu = estimate.devices[CPU]
    pinned = cpu.repacked_bytes
    room = max(0, ram - (cpu.total_bytes - cpu.weights_bytes) - pinned)
    touched = max(0, cpu.weights_bytes - pinned - cpu.unread_bytes - cpu.lookup_bytes)
    routed = min(cpu.expert_bytes, touched)
    always = touched - routed
    per_token = always + routed * expert_fetch_share
    if room < per_token:
        return pinned, round(per_token)
    kept_routed = min(routed, room - always)
    return pinned + always + kept_routed, round((routed - kept_routed) * expert_fetch_share)


def expert_fetch_share(spec: ModelSpec, pieces: Sequence[WeightPiece], window_bytes: int) -> float:
    """The share of the routed experts' bytes a token's page faults read when none of them
    are cached. An active expert's slice of a tensor (1/n_expert of it) is read with the
    fault window around it: `window_bytes` centred on its first fault, or its slice and half
    a window more where the slice is longer (read-ahead runs on past its end), at most the
    tensor. With n_expert_used experts active, a slice is read when any of them lies within
    that reach of it (a hypergeometric chance); a large read-ahead brings in whole tensors."""
    if not spec.n_expert:
        return 1.0
    used = min(spec.n_expert_used or 1, spec.n_expert)
    total = fetched = 0.0
    for piece in pieces:
        if "_exps" not in piece.name or not piece.bytes:
            continue
        matrices = 1 if piece.offset is not None else EXPERT_MATRICES  # a tensor or a group
        slice_bytes = piece.bytes / matrices / spec.n_expert
        read = max(window_bytes, slice_bytes + window_bytes / 2)
        reach = min(float(spec.n_expert), read / slice_bytes)
        fetched += piece.bytes * _share_within_reach(spec.n_expert, used, reach)
        total += piece.bytes
    return fetched / total if total else used / spec.n_expert


def _share_within_reach(n_expert: int, used: int, reach: float) -> float:
    """The chance a slice is read: that some of `used` distinct experts among `n_expert` lie
    within `reach` slices of it (1 - C(n - reach, used) / C(n, used))."""
    missed = math.prod(max(0.0, (n_expert - reach - i) / (n_expert - i)) for i in range(used))
    return 1.0 - missed


def _bandwidth(machine: Machine, device: str) -> float:
    if device == CPU:
        return machine.cpu_bandwidth
    gpu = machine.gpu_infos[machine.gpus.index(device)]
    return float(gpu.memory_bandwidth_bytes_per_s or machine.cpu_bandwidth)


def _cpu_seconds(kind: str, spec: ModelSpec, machine: Machine, work: TokenWork) -> float:
    """A token's time on the CPU: decode's reads, or one prompt token's multiplications, at
    the config's threads for that phase."""
    units, rows, threads = (
        (work.read_bytes, work.read_rows, work.decode_threads)
        if kind == "decode"
        else (work.prefill_weights, work.prefill_rows, work.prefill_threads)
    )
    return machine.cpu_seconds(
        kind,
        units.get(CPU, {}),
        rows.get(CPU, {}),
        work.layers.get(CPU, 0),
        spec.architecture,
        threads=threads,
        touched_bytes=work.touched_bytes.get(CPU),
    )


def _prefill_seconds(spec: ModelSpec, machine: Machine, work: TokenWork) -> tuple[float, float]:
    """Prefill: seconds per prompt token — on the CPU, the calibrated costs of the weights
    and rows multiplied and of the layers; on a GPU, 2 FLOPs per multiplied weight at a share
    of its peak — and seconds once a batch: on the CPU, what it runs for the last token only
    (`last_token_seconds`), which short prompts feel most."""
    seconds = 0.0
    for device, weights in work.prefill_weights.items():
        if device == CPU:
            seconds += _cpu_seconds("prefill", spec, machine, work)
        else:
            peak = _peak_flops(machine, device)
            seconds += 2 * sum(weights.values()) / (peak * PREFILL_EFFICIENCY)
    if not seconds:  # a spec without block tensors: all its parameters, on the CPU
        params = spec.active_params or spec.total_params or 1
        seconds = 2 * params / (machine.cpu_flops * machine.prefill_efficiency)
    once = 0.0
    decode = machine.cpu_costs("decode")
    if CPU in work.last_token_bytes and decode.per_unit:
        once = last_token_seconds(
            decode,
            machine.kernel_figures,
            work.last_token_bytes[CPU],
            work.last_token_rows.get(CPU, {}),
        ) / machine.thread_speedup("decode", work.prefill_threads)
    return seconds, once


def _peak_flops(machine: Machine, device: str) -> float:
    if device == CPU:
        return machine.cpu_flops
    gpu = machine.gpu_infos[machine.gpus.index(device)]
    from hearthside.core.probe.spec import load_catalog

    entry = next((e for e in load_catalog().values() if e.name == gpu.name), None)
    tflops = (entry.fp16_tflops or entry.bf16_tflops) if entry else None
    return (tflops or 20.0) * 1e12


def _score(
    candidate: Candidate, goal: Goal, kv_priors: Mapping[str, RunQuality] | None = None
) -> tuple[float, ...]:
    """Higher is better. A quantized KV cache ranks below a finer one that fits the same
    context: its predicted speed gain is a prediction until the tuner measures it, and its cost
    to the answers is real. Beyond the quality budget only when nothing within it fits."""
    config = candidate.config
    kv_quality = {"f16": 2, "q8_0": 1, "q4_0": 0}[config.type_k]
    fits = 1.0 if candidate.fits else 0.0
    within = 1.0 if kv_prior(config.type_k, kv_priors).mean_kld <= KLD_BUDGET else 0.0
    decode = candidate.speed.decode_tps
    if goal == "longest-context":
        return (fits, config.n_ctx, kv_quality, decode)
    if goal == "quality":
        return (fits, kv_quality, config.n_ctx, decode)
    # fastest and balanced: the chat's context, within the quality budget; a shorter context
    # only where it does not fit (the context is the user's, not a speed lever)
    return (fits, within, config.n_ctx, kv_quality, decode)


def _reasons(
    spec: ModelSpec,
    machine: Machine,
    best: Candidate,
    goal: Goal,
    kv_priors: Mapping[str, RunQuality] | None,
) -> list[Reason]:
    config = best.config
    reasons = []
    if not machine.gpus:
        reasons.append(Reason("n_gpu_layers", "0", "No GPU the engine can drive: the CPU runs it."))
    elif config.n_gpu_layers == -1:
        reasons.append(
            Reason("n_gpu_layers", "all", "Every layer fits in GPU memory, the fastest tier.")
        )
    else:
        reasons.append(
            Reason(
                "n_gpu_layers",
                str(config.n_gpu_layers),
                "The most layers that fit in GPU memory with the KV cache and compute buffers; "
                "the rest run from system RAM.",
            )
        )
    if config.tensor_overrides:
        reasons.append(
            Reason(
                "experts",
                f"first {cpu_expert_layers(config)} layers' experts on the CPU",
                f"Not all {spec.n_expert} experts of every layer fit on the GPU. Keeping some "
                "layers' experts in RAM, with all attention on the GPU, means a token reads "
                f"only its {spec.n_expert_used} active experts from the slower tier.",
            )
        )
    reasons.append(_kv_reason(config.type_k, kv_priors))
    reasons.append(
        Reason(
            "flash_attn",
            "on",
            "Smaller compute buffers at long context; needed for a quantized V cache.",
        )
    )
    reasons.append(
        Reason(
            "n_ctx",
            str(config.n_ctx),
            f"Goal {goal}: "
            + (
                "the longest context that fits."
                if goal == "longest-context"
                else f"{config.n_ctx} tokens of the model's {spec.context_length or '?'}."
            ),
        )
    )
    if best.streams_from_disk:
        reasons.append(_streaming_reason(spec, machine, best))
    reasons.append(_decode_bound_reason(machine, best.speed))
    return reasons


def _kv_reason(kv_type: str, kv_priors: Mapping[str, RunQuality] | None) -> Reason:
    if kv_type == "f16":
        return Reason("type_k/type_v", kv_type, "Full-precision KV cache: it fits.")
    quality = kv_prior(kv_type, kv_priors)
    until = "" if quality.measured else "; measuring this model (Optimize) replaces the prior"
    beyond = (
        " Nothing within the quality budget fits this context."
        if quality.mean_kld > KLD_BUDGET
        else ""
    )
    return Reason(
        "type_k/type_v",
        kv_type,
        f"A finer KV cache does not fit this context in memory; a {kv_type} one does.{beyond} "
        f"What it does to the answers: {kv_quality_text(kv_type, quality)} (budget "
        f"{KLD_BUDGET}){until}.",
    )


def _streaming_reason(spec: ModelSpec, machine: Machine, best: Candidate) -> Reason:
    """What stays in RAM and what each token reads from disk (see `_streaming`)."""
    speed = best.speed
    cpu = next(d for d in best.devices if d.device == CPU)
    kept = (
        f"About {format_bytes(speed.resident_weights_bytes)} of the "
        f"{format_bytes(cpu.weights_bytes)} of weights stay in RAM"
    )
    from_disk = format_bytes(speed.disk_read_bytes_per_token)
    if speed.resident_weights_bytes <= speed.pinned_weights_bytes:
        room = cpu.capacity_bytes - (cpu.used_bytes - cpu.weights_bytes)
        room = max(0, room - speed.pinned_weights_bytes)
        kept = (
            f"A token reads {from_disk} of weights, more than the {format_bytes(room)} of RAM "
            "left for them, so the page cache evicts each page before the next token needs it "
            "again and none stay: all of it is read from disk each token"
        )
    elif spec.n_expert:
        kept += (
            " — first what every token uses (attention, shared experts, dense layers), then "
            f"some of the routed experts; the experts' pages a token finds not in RAM, about "
            f"{from_disk}, are read from disk each token"
        )
    else:
        kept += f"; the other {from_disk} are read from disk each token"
    why = (
        "The weights exceed RAM: llama.cpp maps them and reads what is not in RAM from disk. "
        f"{_read_around_text(spec, machine, speed)}{kept}{_pinned_text(speed)}, so decode is "
        f"bound by the disk (~{speed.decode_tps:.2f} tok/s)."
    )
    return Reason("use_mmap", "on (streaming)", why)


def _read_around_text(spec: ModelSpec, machine: Machine, speed: SpeedEstimate) -> str:
    """For a MoE: how much of its routed experts a token's page faults bring in, and why."""
    if not spec.n_expert:
        return ""
    read_ahead = machine.read_ahead_bytes or ASSUMED_READ_AHEAD_BYTES
    where = "this disk's" if machine.read_ahead_bytes else "an assumed"
    window = (
        f"Each page fault reads {_small_bytes(machine.fault_window_bytes)} of the file around "
        f"it ({where} read-ahead of {_small_bytes(read_ahead)}, doubled by llama.cpp's "
        "sequential hint)"
    )
    active = f"a token's {spec.n_expert_used} active experts of {spec.n_expert}"
    share = f"about {speed.expert_fetch_share:.0%} of the routed experts' tensors"
    used = f"not {spec.n_expert_used / spec.n_expert:.0%}"
    if speed.expert_fetch_share >= 0.9:
        return (
            f"{window}, wider than an expert's slice of a tensor, so it brings in whole expert "
            f"tensors: {active} read {share}, {used}. "
        )
    return f"{window}, so {active} read {share}, {used}. "


def _small_bytes(size_bytes: int) -> str:
    return f"{size_bytes // 1024} KiB" if size_bytes < MIB else format_bytes(size_bytes)


def _pinned_text(speed: SpeedEstimate) -> str:
    if not speed.pinned_weights_bytes:
        return ""
    return (
        f" (the {format_bytes(speed.pinned_weights_bytes)} of repacked weights stay in any case: "
        "they live in anonymous memory, not in the file)"
    )


def _decode_bound_reason(machine: Machine, speed: SpeedEstimate) -> Reason:
    """What bounds generation, in words: the plan page's and `hearthside plan`'s line."""
    tier, read = speed.decode_bound_by, format_bytes(int(speed.decode_read_bytes_per_token))
    if speed.decode_limit == "cache":
        cache = format_bytes(machine.cpu_cache_bytes or 0)
        why = (
            f"Generation is limited by the CPU's compute, not its memory bandwidth: the {read} "
            f"of weights each token reads fit in its {cache} L3 cache, so they are read from "
            "there, not from RAM."
        )
        return Reason("decode", "compute-bound (weights in L3 cache)", why)
    if speed.decode_limit == "compute":
        why = (
            f"Generation is limited by the CPU's compute: its kernels take longer over the "
            f"{read} each token reads than RAM at {machine.cpu_bandwidth / 1e9:.0f} GB/s "
            "needs to deliver them."
        )
        return Reason("decode", "compute-bound", why)
    if speed.decode_limit == "disk":
        faults = (
            f"page faults read ~{machine.disk_fault_bandwidth / 1e9:.1f} GB/s, measured"
            if machine.disk_fault_bandwidth
            else f"page faults reach about {MMAP_STREAMING_EFFICIENCY:.0%} of that"
        )
        why = (
            f"Generation is limited by the disk: each token reads {read} of weights from it "
            f"(~{machine.disk_bandwidth / 1e9:.1f} GB/s read cold; {faults})."
        )
        return Reason("decode", "disk-bound", why)
    where = "RAM" if tier == CPU else f"{tier}'s memory"
    bandwidth = _bandwidth(machine, tier) / 1e9
    why = (
        f"Generation is limited by memory bandwidth: each token reads {read} of weights from "
        f"{where} (~{bandwidth:.0f} GB/s)."
    )
    return Reason("decode", "memory-bandwidth-bound", why)


# Below this a reply comes slower than people read (~5 words a second); a first answer after
# this long feels broken. Either makes a plan that fits "slow here".
SLOW_DECODE_TPS = 5.0
SLOW_FIRST_ANSWER_S = 20.0


def usability_verdict(result: Plan) -> str:
    """The plan's verdict in words a person acts on: whether it fits, and whether it is usable
    ("fits, but slow here (~2.4 tok/s; first answer after ~104 s)")."""
    if not result.fits:
        return "streams from disk" if result.streams_from_disk else "does not fit"
    speed = result.speed
    if speed.decode_tps >= SLOW_DECODE_TPS and speed.ttft_s <= SLOW_FIRST_ANSWER_S:
        return "fits"
    return (
        f"fits, but slow here (~{speed.decode_tps:.1f} tok/s; first answer after "
        f"~{speed.ttft_s:.0f} s)"
    )


def is_slow(result: Plan) -> bool:
    return usability_verdict(result).startswith("fits, but slow")


def decode_limit_words(speed: SpeedEstimate) -> str:
    """What bounds generation, in the same words as the plan's "decode" reason."""
    words = {
        "cache": "compute (weights in the CPU cache)",
        "compute": "compute",
        "disk": "the disk",
    }
    return words.get(speed.decode_limit, "memory bandwidth")


def decode_bound_text(result: Plan) -> str:
    """The plan's sentence on what bounds generation ("" for a plan where nothing fits)."""
    return next((r.why for r in result.reasons if r.setting == "decode"), "")


def _advice(spec: ModelSpec, best: Candidate) -> list[str]:
    advice = []
    if best.streams_from_disk:
        advice.append(
            "This model is larger than memory and will stream from disk. A smaller quant "
            "(e.g. Q3_K_M or Q2_K) or a machine with more RAM would make it fit."
        )
    return advice


def _confidence(machine: Machine, speed: SpeedEstimate) -> Confidence:
    if f"decode:{speed.decode_bound_by}" in machine.learned:
        return "measured"  # corrected by what runs on this machine measured
    return "calibrated" if machine.calibrated else "estimated"


def _nothing_fits(
    spec: ModelSpec,
    goal: Goal,
    candidates: Sequence[Candidate],
    machine: Machine,
    fewer_slots: int | None = None,
) -> Plan:
    closest = min(candidates, key=lambda c: -min(d.free_bytes for d in c.devices))
    short = -min(d.free_bytes for d in closest.devices)
    advice = (
        f"Nothing fits: the closest settings are {short / GIB:.1f} GiB short. Try a shorter "
        "context (--ctx), a smaller quant, or free GPU memory."
    )
    slots = closest.config.n_parallel
    if slots > 1:
        would = (
            f"{fewer_slots} would (--parallel {fewer_slots})"
            if fewer_slots is not None
            else "not even one would at this context"
        )
        advice = (
            f"{slots} parallel requests of {closest.config.n_ctx} tokens each do not fit: the "
            f"closest settings are {short / GIB:.1f} GiB short, and {would}. Fewer parallel "
            "requests, a shorter context (--ctx) or a smaller quant make room."
        )
    blocked = next((c.stream_blocked for c in candidates if c.stream_blocked), "")
    if blocked:
        advice += " " + blocked
    return Plan(
        model=spec.name,
        goal=goal,
        config=closest.config,
        devices=closest.devices,
        speed=closest.speed,
        fits=False,
        streams_from_disk=False,
        confidence=_confidence(machine, closest.speed),
        reasons=(),
        alternatives=(),
        advice=(advice,),
    )


def evaluate_config(
    spec: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    calibration: dict[str, float] | None = None,
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES,
    pieces: Sequence[WeightPiece] | None = None,
) -> Candidate:
    """One given config, sized and timed exactly as `plan` sizes its own candidates: what a
    power user's manual override would do (fits or not, memory per device, predicted speed)."""
    machine = describe_machine(profile, calibration or {})
    pieces = pieces_from_spec(spec) if pieces is None else pieces
    return _evaluate(spec, machine, config, free_margin_bytes, pieces)
