"""The speed-of-light meter: how close a reply came to what this machine allows.

The limit is a roofline, not a prediction: no engine efficiency, no learned correction. A
token that reads its weights from memory cannot come faster than the bytes it reads over the
bandwidth of the memory they sit in — RAM at the calibrated read bandwidth for the decode
threads used (`Machine.read_bandwidth`), a GPU's memory at its spec sheet's, the disk at its
measured page-fault speed when the model streams. A token whose weights sit in the CPU's
last-level cache, or whose kernels take longer than RAM needs (the planner's "cache" and
"compute" limits), is bound by the calibrated kernels' time over those weights instead —
without llama.cpp's fixed per-layer and per-token work, which is the engine's, not the
machine's. Each token already in the context adds its KV-cache bytes to what a token reads.

The share is measured tok/s over that limit. Under LOW_SHARE the meter names the likely
cause from what Hearthside can see (`MachineLoad`: other programs' CPU use, the load average,
threads against cores, NUMA nodes; the placement: a KV cache on a slower tier than the
weights; a small model's fixed costs) and the fix, in plain words.

Pure: the spec, profile, config and calibration figures come in (autotune/speed_meter.py reads
them from the model file, the wisdom DB and psutil).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from hearthside.autotune.cpu_costs import cache_time_share, layer_seconds
from hearthside.autotune.memory import CPU, WeightPiece, pieces_from_spec
from hearthside.autotune.planner import (
    DEFAULT_FREE_MARGIN_BYTES,
    Candidate,
    Machine,
    TokenWork,
    describe_machine,
    evaluate_config,
    token_work,
)
from hearthside.core.engine.config import EngineConfig
from hearthside.core.models.spec import ModelSpec
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.units import format_bytes

LimitSource = Literal["calibrated", "spec sheet"]
# Below this share of the limit a reply is "far below" it and the meter says why.
LOW_SHARE = 0.5
# Above this the limit itself is likely stale (measured on a slower day, or a new machine).
ABOVE_LIMIT_SHARE = 1.1
# Other programs using this share of all the CPUs (or a load average this far above the
# cores) take enough of the machine to explain a slow reply.
BUSY_OTHERS_SHARE = 0.25
BUSY_LOAD_OVER_CORES = 1.0
# llama.cpp's fixed work (per layer, per token) taking this share of a token: a small model.
FIXED_COST_SHARE = 0.5


@dataclass(frozen=True)
class SpeedLimit:
    """The most tok/s decode can reach for one loaded config on this machine."""

    limit_tps: float  # with an empty context (llama-bench's tgN)
    bound: str  # planner.DECODE_LIMITS: "memory bandwidth", "compute", "cache", "disk"
    tier: str  # where the bounding reads happen: "CPU", a GPU's name, "disk"
    read_bytes_per_token: int  # weights a token reads, every tier together
    bandwidth_bytes_per_s: float  # the bounding tier's (0 when compute bounds it)
    threads: int  # the decode threads the limit is for
    source: LimitSource  # calibrated here, or a spec sheet's bandwidth
    # each token already in the context adds its KV cache's read (all tiers)
    kv_seconds_per_context_token: float = 0.0
    # llama.cpp's calibrated fixed work a token (per layer and per token): not in the limit
    fixed_seconds_per_token: float = 0.0
    kv_tier: str = CPU  # where most of the KV cache sits

    def tps_at(self, context_tokens: int) -> float:
        """The limit for a token decoded after `context_tokens` tokens of context."""
        seconds = 1 / self.limit_tps + max(0, context_tokens) * self.kv_seconds_per_context_token
        return 1 / seconds

    def explanation(self) -> str:
        """The limit in plain words: what bounds it and the figures it comes from."""
        read = format_bytes(self.read_bytes_per_token)
        spec = " (the spec sheet's figure: this machine is not calibrated yet)"
        measured = "" if self.source == "calibrated" else spec
        if self.bound in ("cache", "compute"):
            where = "the CPU's cache" if self.bound == "cache" else "RAM"
            return (
                f"This machine's limit is about {self.limit_tps:.0f} tok/s: each token reads "
                f"{read} of weights from {where}, and the CPU's measured kernels need that long "
                f"to compute over them on {self.threads} threads."
            )
        if self.bound == "disk":
            return (
                f"This machine's limit is about {self.limit_tps:.0f} tok/s: the model is larger "
                f"than memory, so each token reads part of its weights from the disk at "
                f"~{self.bandwidth_bytes_per_s / 1e9:.1f} GB/s{measured}."
            )
        where = "RAM" if self.tier == CPU else f"{self.tier}'s memory"
        return (
            f"This machine's limit is about {self.limit_tps:.0f} tok/s: each token reads {read} "
            f"of weights from {where}, which delivers ~{self.bandwidth_bytes_per_s / 1e9:.1f} "
            f"GB/s with {self.threads} threads{measured}."
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MachineLoad:
    """What the rest of the machine was doing while a reply was written; None: unknown."""

    usable_cores: int  # the cores this process may run on
    load_average: float | None = None  # 1 minute
    others_cpu_share: float | None = None  # other programs' CPU use, share of all the cores
    numa_nodes: int | None = None


@dataclass(frozen=True)
class SpeedOfLight:
    """One measured speed against the machine's limit."""

    measured_tps: float
    limit_tps: float  # at the context the measured tokens were decoded at
    share: float  # measured over limit
    bound: str
    source: LimitSource
    explanation: str
    cause: str = ""  # why it ran far below the limit ("" unless share < LOW_SHARE)
    fix: str = ""

    @property
    def summary(self) -> str:
        """ "81% of this machine's limit" (of the spec sheet's, when not calibrated)."""
        whose = "this machine's limit" if self.source == "calibrated" else "the spec-sheet limit"
        return f"{self.share:.0%} of {whose}"

    @property
    def low(self) -> bool:
        return self.share < LOW_SHARE

    def tooltip(self) -> str:
        """The explanation, then why the reply was slow and what to do, when it was."""
        lines = [f"{self.measured_tps:.1f} tok/s of a possible {self.limit_tps:.1f}."]
        lines.append(self.explanation)
        if self.share > ABOVE_LIMIT_SHARE:
            lines.append(
                "This reply beat the limit, so the measurement behind it is likely out of "
                "date: measure this machine again (Hardware page, or `hearthside calibrate`)."
            )
        if self.cause:
            lines += [f"Why it is slower: {self.cause}", f"What to do: {self.fix}"]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"summary": self.summary}


def decode_speed_limit(
    spec: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    calibration: Mapping[str, float],
    *,
    pieces: Sequence[WeightPiece] | None = None,
    free_margin_bytes: int = DEFAULT_FREE_MARGIN_BYTES,
) -> SpeedLimit | None:
    """The limit for `config` of `spec` on `profile`, from the calibration's figures; None
    when neither a calibration nor a spec sheet gives the RAM's bandwidth (no guessing)."""
    source = _bandwidth_source(profile, calibration)
    if source is None:
        return None
    figures = dict(calibration)
    machine = describe_machine(profile, figures)
    pieces = pieces_from_spec(spec) if pieces is None else pieces
    candidate = evaluate_config(spec, profile, config, figures, free_margin_bytes, pieces)
    work = token_work(spec, config, machine.gpus, pieces)
    seconds = _tier_seconds(spec, machine, candidate, work)
    if seconds is None or not sum(seconds.values()):
        return None  # compute-bound with no calibrated kernels: nothing measured to go by
    speed = candidate.speed
    tier = speed.decode_bound_by
    threads = config.n_threads or machine.default_threads("decode")
    return SpeedLimit(
        limit_tps=1 / sum(seconds.values()),
        bound=speed.decode_limit,
        tier=tier,
        read_bytes_per_token=round(sum(sum(row.values()) for row in work.read_bytes.values())),
        bandwidth_bytes_per_s=_tier_bandwidth(machine, tier, threads, speed.decode_limit),
        threads=threads,
        source=source if not machine.gpus or tier == CPU else "spec sheet",
        kv_seconds_per_context_token=_kv_seconds_per_token(machine, candidate, threads),
        fixed_seconds_per_token=_fixed_seconds(spec, machine, work, threads),
        kv_tier=max(candidate.devices, key=lambda device: device.kv_bytes).device,
    )


def speed_of_light(
    measured_tps: float,
    limit: SpeedLimit,
    *,
    context_tokens: int = 0,
    load: MachineLoad | None = None,
) -> SpeedOfLight:
    """`measured_tps`, decoded after `context_tokens` tokens of context on average, against
    `limit`; under LOW_SHARE, the likely cause seen in `load` and the placement, and the fix."""
    ceiling = limit.tps_at(context_tokens)
    share = measured_tps / ceiling if ceiling else 0.0
    cause, fix = ("", "")
    if share < LOW_SHARE:
        cause, fix = likely_cause(limit, load)
    return SpeedOfLight(
        measured_tps=measured_tps,
        limit_tps=ceiling,
        share=share,
        bound=limit.bound,
        source=limit.source,
        explanation=limit.explanation(),
        cause=cause,
        fix=fix,
    )


def likely_cause(limit: SpeedLimit, load: MachineLoad | None) -> tuple[str, str]:
    """The most likely reason a reply ran far below `limit`, and what to do, from what can be
    seen: other programs, threads against cores, NUMA, the KV cache's tier, fixed costs."""
    for check in (_others_busy, _too_many_threads, _numa_split):
        found = check(limit, load) if load is not None else None
        if found is not None:
            return found
    for placement_check in (_kv_elsewhere, _small_model):
        found = placement_check(limit)
        if found is not None:
            return found
    return (
        "nothing else looked busy, so the CPU may have slowed itself down (heat, a battery "
        "saver, a power limit) or the measurement of this machine is out of date.",
        "Plug the computer in and let it cool; if replies stay slow, measure this machine "
        "again (Hardware page, or `hearthside calibrate`).",
    )


def _others_busy(limit: SpeedLimit, load: MachineLoad | None) -> tuple[str, str] | None:
    assert load is not None
    fix = (
        "Close or pause what is busy (a build, a video call, another model, many browser "
        "tabs) and ask again; the reply will come faster."
    )
    if load.others_cpu_share is not None and load.others_cpu_share >= BUSY_OTHERS_SHARE:
        return (
            f"other programs were using about {load.others_cpu_share:.0%} of the CPU while "
            "this reply was written, so Hearthside's threads had to wait their turn.",
            fix,
        )
    if (
        load.others_cpu_share is None
        and load.load_average is not None
        and load.load_average > load.usable_cores + BUSY_LOAD_OVER_CORES
    ):
        return (
            f"the computer was busy: about {load.load_average:.0f} programs' worth of work "
            f"were waiting for its {load.usable_cores} cores (the load average).",
            fix,
        )
    return None


def _too_many_threads(limit: SpeedLimit, load: MachineLoad | None) -> tuple[str, str] | None:
    assert load is not None
    if limit.threads <= load.usable_cores:
        return None
    return (
        f"Hearthside ran {limit.threads} threads on {load.usable_cores} cores, so they took "
        "turns and each waited for the slowest.",
        f"Set Threads to {load.usable_cores} (Settings, or `--threads {load.usable_cores}`).",
    )


def _numa_split(limit: SpeedLimit, load: MachineLoad | None) -> tuple[str, str] | None:
    assert load is not None
    if limit.tier != CPU or (load.numa_nodes or 1) < 2:
        return None
    return (
        f"this machine's memory is split into {load.numa_nodes} NUMA nodes, and threads on one "
        "read weights that sit in another node's memory, which is slower.",
        "Load the model with NUMA set to distribute (the plan's NUMA setting), or run it on "
        "the cores of one node.",
    )


def _kv_elsewhere(limit: SpeedLimit) -> tuple[str, str] | None:
    if limit.kv_tier == limit.tier or limit.tier == "disk":
        return None
    return (
        f"the KV cache (the conversation so far) sits in {limit.kv_tier} memory while the "
        f"weights are on {limit.tier}, so every token waits for the slower one.",
        "A shorter context or a quantized KV cache (q8_0) makes room for it beside the "
        "weights; the Plan page shows settings that fit.",
    )


def _small_model(limit: SpeedLimit) -> tuple[str, str] | None:
    per_token = 1 / limit.limit_tps + limit.fixed_seconds_per_token
    if limit.fixed_seconds_per_token < FIXED_COST_SHARE * per_token:
        return None
    return (
        "this model is small, so llama.cpp's fixed work for each layer and token takes more "
        "time than reading its weights; the machine itself is not the limit.",
        "Nothing needs fixing: a larger model would use more of this machine for the same "
        "fixed cost.",
    )


def _bandwidth_source(
    profile: HardwareProfile, calibration: Mapping[str, float]
) -> LimitSource | None:
    if calibration.get("cpu_read_bytes_per_s"):
        return "calibrated"
    if profile.memory.bandwidth_bytes_per_s:
        return "spec sheet"
    return None


def _tier_seconds(
    spec: ModelSpec, machine: Machine, candidate: Candidate, work: TokenWork
) -> dict[str, float] | None:
    """Each tier's least time a token: its bytes over its bandwidth, or on a CPU whose
    kernels bound it, their calibrated time over the weights (None: not calibrated)."""
    speed, threads = candidate.speed, work.decode_threads
    seconds: dict[str, float] = {}
    for device, row in work.read_bytes.items():
        read = sum(row.values())
        if device != CPU:
            seconds[device] = read / _gpu_bandwidth(machine, device)
        elif speed.decode_limit in ("cache", "compute"):
            kernels = _kernel_seconds(machine, work, threads)
            if kernels is None:
                return None
            seconds[CPU] = kernels
        else:
            resident = (
                read - speed.disk_read_bytes_per_token if candidate.streams_from_disk else read
            )
            seconds[CPU] = max(0.0, resident) / machine.read_bandwidth(threads)
    if candidate.streams_from_disk:
        seconds["disk"] = speed.disk_read_bytes_per_token / machine.streaming_bandwidth
    return seconds


def _kernel_seconds(machine: Machine, work: TokenWork, threads: int | None) -> float | None:
    costs = machine.cpu_costs("decode")
    if not costs.per_unit:
        return None
    weights = costs.seconds(work.read_bytes.get(CPU, {}), work.read_rows.get(CPU, {}))
    weights *= cache_time_share(machine.kernel_figures, work.touched_bytes.get(CPU, 0.0))
    return weights / machine.thread_speedup("decode", threads)


def _fixed_seconds(spec: ModelSpec, machine: Machine, work: TokenWork, threads: int) -> float:
    figures = machine.kernel_figures
    per_layer = layer_seconds(figures, "decode", spec.architecture)
    fixed = work.layers.get(CPU, 0) * per_layer + figures.get("decode_overhead_s_per_token", 0.0)
    return fixed / machine.thread_speedup("decode", threads)


def _kv_seconds_per_token(machine: Machine, candidate: Candidate, threads: int) -> float:
    """A slot's KV bytes for one token of context, on each tier, over its bandwidth."""
    tokens = max(1, candidate.config.total_context)
    seconds = 0.0
    for device in candidate.devices:
        bandwidth = (
            machine.read_bandwidth(threads)
            if device.device == CPU
            else _gpu_bandwidth(machine, device.device)
        )
        seconds += device.kv_bytes / tokens / bandwidth
    return seconds


def _tier_bandwidth(machine: Machine, tier: str, threads: int, bound: str) -> float:
    if bound in ("cache", "compute"):
        return 0.0
    if tier == "disk":
        return machine.streaming_bandwidth
    return machine.read_bandwidth(threads) if tier == CPU else _gpu_bandwidth(machine, tier)


def _gpu_bandwidth(machine: Machine, device: str) -> float:
    gpu = machine.gpu_infos[machine.gpus.index(device)]
    return float(gpu.memory_bandwidth_bytes_per_s or machine.cpu_bandwidth)
