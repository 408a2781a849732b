"""An engine micro-run: a short prefill and decode of a real model on each backend the engine
has, which ties the raw bandwidth and FLOP figures to what llama.cpp achieves on them.

It times llama_decode on random tokens as `hearthside bench` does (`Engine.time_prefill` and
`Engine.time_decode`: no tokenizing, no sampling), with a small context so it loads fast. The
engine is private to the calibration and closed before it returns; the app's EngineService
engine is not touched.

Speed probes: one model cannot tell apart the costs that make llama.cpp slower than the raw
bandwidth — a fixed cost per layer and token (graph, thread barriers), a cost per matrix row
(each row's dot product ends in a reduction and a store: narrow models pay it far more often
per byte), and kernels that do more work per byte for some quant types (K-quants dequantize
more than Q8_0; AVX2 repacks Q4_0 into a faster layout). So the CPU also runs synthetic
probes written for the occasion (`speed_probes`): a tiny model whose time is nearly all
fixed cost, and per quant type two models bigger than the CPU caches, one of narrow matrices
and one of wide ones, which read the same bytes in rows of different lengths. Each
measurement carries what one token reads, multiplies and how many rows that takes
(`per_token_work`), so the costs can be fitted after the probe files are gone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from hearthside.core.engine.config import EngineConfig, logical_core_count, physical_core_count
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
from hearthside.kernels.probe_host import ProbeEngine, ProbeHost
from hearthside.kernels.synthetic_model import SyntheticShape, write_uniform_gguf

if TYPE_CHECKING:
    from hearthside.core.engine.engine import Engine
    from hearthside.core.engine.worker_engine import WorkerEngine

N_PROMPT = 128
N_GEN = 32
QUICK_N_GEN = 16
MIN_PROMPT = 8
MIN_GEN = 2
# A prompt's tok/s depends on its batch (Q8_0 probe here: 814 at 32 tokens, 999 at 128, not
# all of it the batch's once-only work): prefill runs keep N_PROMPT tokens unless one would
# take this many times a run's share of the budget.
PREFILL_LIMIT_FACTOR = 3
SAMPLES_PER_BUDGET = 4  # the sizing runs, the minimum repetitions and room to spare
CONTEXT_TOKENS = 256
ENGINE_KINDS = ("engine_prefill", "engine_decode")
NO_MODEL_NOTE = (
    "not measured: no model is installed; install the default model with "
    "`hearthside models install-default`, then calibrate again"
)
StepCallback = Callable[[str, float], None]
MIN_ROUNDS = 3
MAX_ROUNDS = 60
LOADING_SHARE = 0.3  # of the progress: writing and loading the probes


@dataclass(frozen=True)
class EngineBackend:
    """Where a micro-run puts the model: the CPU, or all layers on one GPU."""

    device: str  # the Measurement device: "cpu", "cuda:0", "rocm:0", "mps", "vulkan:0"
    n_gpu_layers: int
    main_gpu: int = 0


CPU_BACKEND = EngineBackend("cpu", n_gpu_layers=0)


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
SHORT_OVERHEAD_PROBE = "overhead-short"
# A Q4_0 probe as narrow as the narrow ones, at half their bytes: where the cache a machine
# really has holds half but not all of a probe, decode reads it faster per byte (the 2-core
# Sapphire Rapids VM: 62 MB probes at 21 GB/s, 122 MB ones at 11; a 36 MB Q4_1 model 18 GB/s,
# 136 MB 6.5), so models smaller than the probes are predicted faster (`cache_time_share`)
CACHE_PROBE = "cache"
CACHE_PROBE_TYPE, CACHE_PROBE_SHARE = "Q4_0", 0.5
# plain 8-bit, repacked on AVX2/NEON, and the two K-quants of a Q4_K_M file
PROBE_TYPES = ("Q8_0", "Q4_0", "Q5_0", "Q4_K", "Q6_K", "Q3_K")
# matrices as narrow as a 0.5B model's and as wide as a 1.5B model's (K-quant rows: 256
# values), wide ones in a few layers still (see `per_token_work` on the last layer)
PROBE_WIDTHS = (512, 1536)
MIN_PROBE_BYTES = 48 << 20
# All probes are loaded at once: ~1.5 GB at most. Smaller ones sit in the cache a VM really
# gets, which is not the L3 it reports: on the 2-core Sapphire Rapids "480 MiB" VM numpy reads
# 25 GB/s up to 32 MiB and 16 GB/s from 64 MiB on, and a 64 MiB Q4_0 probe decoded twice as
# fast per byte as a 128 MiB one (1.6x a 0.5B model's speed predicted).
MAX_PROBE_BYTES = 128 << 20
PROBE_CACHE_MULTIPLE = 4  # weights this many times the last-level cache come from RAM


@dataclass(frozen=True)
class SpeedProbe:
    name: str  # OVERHEAD_PROBE, SHORT_OVERHEAD_PROBE, CACHE_PROBE or "<type>@<width>"
    type_name: str
    shape: SyntheticShape


def speed_probes(cache_bytes: int | None) -> list[SpeedProbe]:
    """The two tiny overhead probes, then per PROBE_TYPES type one llama-shaped probe per
    PROBE_WIDTHS width, each reading about PROBE_CACHE_MULTIPLE x the cache per token (within
    MIN/MAX_PROBE_BYTES), and last the half-size CACHE_PROBE."""
    target = min(MAX_PROBE_BYTES, max(MIN_PROBE_BYTES, PROBE_CACHE_MULTIPLE * (cache_bytes or 0)))
    # 16 and 2 layers of 64-wide blocks: almost no bytes, the costs per layer and per token
    probes = [
        SpeedProbe(name, "Q8_0", SyntheticShape("llama", layers, 64, 2, 1, 256, n_vocab=512))
        for name, layers in ((OVERHEAD_PROBE, 16), (SHORT_OVERHEAD_PROBE, 2))
    ]
    for type_name in PROBE_TYPES:
        for width in PROBE_WIDTHS:
            shape = _probe_shape(type_name, width, target)
            probes.append(SpeedProbe(f"{type_name}@{width}", type_name, shape))
    cache_shape = _probe_shape(CACHE_PROBE_TYPE, PROBE_WIDTHS[0], target * CACHE_PROBE_SHARE)
    probes.append(SpeedProbe(CACHE_PROBE, CACHE_PROBE_TYPE, cache_shape))
    return probes


def _probe_shape(type_name: str, width: int, target_bytes: float) -> SyntheticShape:
    """A dense llama shape of `width` with as many layers as make about `target_bytes` of
    `type_name` weights: per layer q and o (E x E), k and v (E x E/4) and an FFN of
    3 x E x 4E, so 14.5 E^2 weights."""
    layer_bytes = 14.5 * width**2 * type_bits(type_name) / 8
    heads = width // 64
    layers = max(1, round(target_bytes / layer_bytes))
    return SyntheticShape("llama", layers, width, heads, max(1, heads // 4), 4 * width)


def type_bits(type_name: str) -> float:
    """Bits per weight of a ggml type (Q4_0: 4.5, Q2_K: 2.625, F16: 16)."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return size * 8 / block


EXPERTS = "+experts"


def experts_key(type_name: str) -> str:
    """The cost key of routed experts stored as `type_name`: "Q8_0+experts". llama.cpp runs
    them through another kernel than dense matrices (mul_mat_id), at another cost."""
    return type_name + EXPERTS


def is_experts_key(key: str) -> bool:
    return key.endswith(EXPERTS)


def base_type(key: str) -> str:
    """The ggml type of a cost key: "Q8_0" for "Q8_0+experts"."""
    return key.removesuffix(EXPERTS)


def per_token_work(info: GGUFInfo) -> dict[str, int | str]:
    """What one token costs, by ggml type, as flat measurement params: "read_bytes:<type>",
    the bytes of weights decode reads (every matrix but the input embeddings, which it looks
    up a row of — unless they double as the output layer), "read_rows:<type>", the rows of
    those matrices (one dot product each), "prefill_weights:<type>" and "prefill_rows:<type>",
    the weights and rows prefill multiplies per prompt token (the blocks', but for the last
    block's FFN: like the output layer, llama.cpp runs it for the tokens whose logits are
    wanted only, the last one), "last_token_bytes:<type>" and "last_token_rows:<type>", the
    matrices a prompt batch runs for its last token only (read as decode reads them: once a
    batch, whatever its length), "n_layers", "n_vocab" and "architecture". Routed experts
    count at their used share, under their own key (`experts_key`)."""
    names = {tensor.name for tensor in info.tensors}
    tied = "output.weight" not in names
    used_share = _used_expert_share(info)
    n_layers = len({int(m.group(1)) for t in info.tensors if (m := _BLOCK.match(t.name))})
    work: dict[str, dict[str, int]] = {key: {} for key in WORK_KEYS}
    for tensor in info.tensors:
        if len(tensor.shape) < 2 or not tensor.name.endswith(".weight"):
            continue
        routed = "_exps" in tensor.name
        share = used_share if routed else 1.0
        key_type = experts_key(tensor.type_name) if routed else tensor.type_name
        if tensor.name.startswith("token_embd") and not tied:
            continue
        rows = tensor.n_elements // max(1, tensor.shape[0])
        amounts = {READ_BYTES: tensor.n_bytes, READ_ROWS: rows}
        if tensor.name.startswith("blk.") and not last_block_ffn(tensor.name, n_layers):
            amounts |= {PREFILL_WEIGHTS: tensor.n_elements, PREFILL_ROWS: rows}
        else:
            amounts |= {LAST_TOKEN_BYTES: tensor.n_bytes, LAST_TOKEN_ROWS: rows}
        for key, amount in amounts.items():
            by_type = work[key]
            by_type[key_type] = by_type.get(key_type, 0) + round(amount * share)
    return {
        "n_layers": n_layers,
        "n_vocab": _vocab_size(info),
        "architecture": info.architecture or "",
        **{
            f"{key}:{name}": amount
            for key, by_type in work.items()
            for name, amount in by_type.items()
        },
    }


READ_BYTES = "read_bytes"
READ_ROWS = "read_rows"
PREFILL_WEIGHTS = "prefill_weights"
PREFILL_ROWS = "prefill_rows"
LAST_TOKEN_BYTES = "last_token_bytes"
LAST_TOKEN_ROWS = "last_token_rows"
WORK_KEYS = (
    READ_BYTES,
    READ_ROWS,
    PREFILL_WEIGHTS,
    PREFILL_ROWS,
    LAST_TOKEN_BYTES,
    LAST_TOKEN_ROWS,
)


def work_by_type(params: dict[str, Any], prefix: str) -> dict[str, int]:
    """{type: amount} of one `per_token_work` quantity found in measurement params."""
    return {
        key.split(":", 1)[1]: int(value)
        for key, value in params.items()
        if key.startswith(prefix + ":")
    }


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def last_block_ffn(tensor_name: str, n_layers: int) -> bool:
    """Whether the tensor is an FFN weight of the last block."""
    return tensor_name.startswith(f"blk.{n_layers - 1}.ffn_")


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


def measure_cpu(
    model_path: Path | None,
    probes: Sequence[SpeedProbe],
    *,
    quick: bool,
    budget: Budget,
    step: StepCallback | None = None,
    thread_counts: Sequence[int] | None = None,
) -> list[Measurement]:
    """Prefill and decode tok/s on the CPU of `model_path` and of each speed probe (written
    to a temporary folder, deleted after), timed in interleaved rounds within `budget`.

    `model_path` also runs at each of `thread_counts` (default: `scanned_thread_counts`, the
    counts the tuner tries) other than its own, in the first THREAD_ROUNDS rounds only and
    with the same token counts: the planner scales its predictions by these runs (their
    measurements carry "thread_variant" and "threads").

    On a shared machine other programs come and go within seconds (measured on a 2-core VM:
    the same probe 40% apart in calibrations minutes apart, one model's rounds 1.5x apart),
    and the fit compares the probes with each other and with the shipped model. So each
    model runs once per round, one after another, and reports the median of its rounds: all
    the figures are taken under the same conditions.
    """
    if thread_counts is None:
        thread_counts = scanned_thread_counts(physical_core_count(), logical_core_count())
    with tempfile.TemporaryDirectory(prefix="hearthside-probe-") as folder, ExitStack() as stack:
        members, failed = _load_members(model_path, probes, Path(folder), stack, budget, step)
        if members and model_path is not None and "probe" not in members[0].params:
            members[1:1] = thread_variants(members[0], thread_counts)
        if members:
            _run_rounds(members, quick=quick, budget=budget, step=step)
        return failed + [m for member in members for m in member.measurements()]


def candidate_thread_counts(cores: int, logical: int) -> tuple[int, ...]:
    """The decode thread counts the tuner tries (`tuner.candidates`), largest first: the
    cores, half of them, every logical core."""
    return tuple(sorted({cores, max(1, cores // 2), logical}, reverse=True))


def scanned_thread_counts(cores: int, logical: int) -> tuple[int, ...]:
    """The thread counts calibration times the shipped model at: the tuner's, and
    llama-cpp-python's default (half the logical cores), which the wizard's baseline uses."""
    counts = {*candidate_thread_counts(cores, logical), max(1, logical // 2)}
    return tuple(sorted(counts, reverse=True))


THREAD_ROUNDS = MIN_ROUNDS  # rounds of each thread variant: few, to keep calibration short


def thread_variants(shipped: _Member, thread_counts: Sequence[int]) -> list[_Member]:
    """`shipped` again at each of `thread_counts` for both phases, on the same engine (the
    threads are switched before each run); none at the counts its own run already uses."""
    config = shipped.engine.config
    own = (config.decode_threads, config.batch_threads)
    wanted = [n for n in dict.fromkeys(thread_counts) if n > 0 and (n, n) != own]
    if wanted:
        shipped.threads = own
    return [
        _Member(shipped.engine, shipped.params, threads=(count, count), source=shipped)
        for count in wanted
    ]


def set_engine_threads(engine: Engine, decode_threads: int, batch_threads: int) -> tuple[int, int]:
    """Run in the engine worker: the threads llama_decode uses from now on, without a reload
    (llama.cpp's `llama_set_n_threads`; the weights do not depend on them). Returns the
    (decode, batch) threads the context then reports."""
    import llama_cpp

    ctx = engine.llama.ctx
    llama_cpp.llama_set_n_threads(ctx, decode_threads, batch_threads)
    return llama_cpp.llama_n_threads(ctx), llama_cpp.llama_n_threads_batch(ctx)


@dataclass
class _Member:
    """One model in the rounds: its engine, its measurement params and its rounds' tok/s.
    A thread variant (`source` set) shares its source's engine and token counts and sets
    `threads` (decode, batch) before each run; so does a source that has variants."""

    engine: WorkerEngine | ProbeEngine
    params: dict[str, Any]
    n_prompt: int = N_PROMPT
    n_gen: int = N_GEN
    prefill: list[float] = field(default_factory=list)
    decode: list[float] = field(default_factory=list)
    threads: tuple[int, int] | None = None
    source: _Member | None = None
    engine_threads: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        rng = np.random.default_rng(0)
        size = max(N_PROMPT, N_GEN) + 1
        self.tokens = [int(t) for t in rng.integers(0, self.engine.n_vocab, size=size)]

    @property
    def rounds(self) -> int:
        return THREAD_ROUNDS if self.source is not None else MAX_ROUNDS

    def size_runs(self, limit_s: float, wanted_gen: int) -> None:
        """Run prefill and decode once at full length, the warm-up; shorten a decode that took
        longer than `limit_s`, a prefill that took PREFILL_LIMIT_FACTOR times that. A thread
        variant takes its source's counts (its speed is compared with the source's) after a
        short warm-up at its threads."""
        self._use_threads()
        if self.source is not None:
            self._prefill_s(MIN_PROMPT)
            self._decode_s(MIN_GEN)
            self.n_prompt, self.n_gen = self.source.n_prompt, self.source.n_gen
            return
        prefill_limit_s = PREFILL_LIMIT_FACTOR * limit_s
        self.n_prompt = _shortened(self._prefill_s, N_PROMPT, MIN_PROMPT, prefill_limit_s)
        self.n_gen = _shortened(self._decode_s, wanted_gen, MIN_GEN, limit_s)

    def run_round(self) -> None:
        self._use_threads()
        self.prefill.append(self.n_prompt / self._prefill_s(self.n_prompt))
        self.decode.append(self.n_gen / self._decode_s(self.n_gen))

    def _use_threads(self) -> None:
        if self.threads is not None:
            self.engine_threads = self.engine.run(set_engine_threads, *self.threads)

    def _phase_threads(self) -> tuple[int, int]:
        """(decode, batch) threads of the runs: as llama.cpp reported them after the switch."""
        config = self.engine.config
        return self.engine_threads or (config.decode_threads, config.batch_threads)

    def _prefill_s(self, count: int) -> float:
        return self.engine.time_prefill(self.tokens[:count])

    def _decode_s(self, count: int) -> float:
        return self.engine.time_decode(self.tokens[: count + 1])

    def measurements(self) -> list[Measurement]:
        if not self.decode:
            return not_measured(SKIPPED_NOTE)
        method = f"llama.cpp llama_decode on random tokens, {self.engine.model_path.name}"
        rounds = f"the median of {len(self.decode)} interleaved rounds"
        decode_threads, batch_threads = self._phase_threads()
        params = {**self.params, "thread_variant": True} if self.source else self.params
        if self.source is not None:
            method += f" at {decode_threads} thread(s)"
        return [
            _over_rounds(
                "engine_prefill",
                self.prefill,
                f"{method}, one batch of {self.n_prompt}, {rounds}",
                {**params, "n_prompt": self.n_prompt, "threads": batch_threads},
            ),
            _over_rounds(
                "engine_decode",
                self.decode,
                f"{method}, {self.n_gen} tokens one at a time, {rounds}",
                {**params, "n_gen": self.n_gen, "threads": decode_threads},
            ),
        ]


def _shortened(seconds_for: Callable[[int], float], wanted: int, least: int, limit_s: float) -> int:
    seconds = seconds_for(wanted)
    return wanted if seconds <= limit_s else max(least, int(wanted * limit_s / seconds))


def _over_rounds(
    kind: str, values: list[float], method: str, params: dict[str, Any]
) -> Measurement:
    samples = Samples(values=tuple(values), runs=len(values))
    return Measurement.from_samples(kind, "cpu", "tok/s", samples, method=method, params=params)


def _load_members(
    model_path: Path | None,
    probes: Sequence[SpeedProbe],
    folder: Path,
    stack: ExitStack,
    budget: Budget,
    step: StepCallback | None,
) -> tuple[list[_Member], list[Measurement]]:
    """Load the model in its own worker, and write the probes and load them into one host
    worker (`ProbeHost`): two engine processes in all, however many probes. The model and
    the probes load in two threads beside the writing (a load is mostly a child's CPU); on
    2 cores this phase went from 38 to 34 s."""
    failed: list[Measurement] = []
    host = ProbeHost()
    stack.callback(host.close)
    shipped: Future[WorkerEngine | str] | None = None
    probe_loads: list[tuple[SpeedProbe, Future[ProbeEngine | str]]] = []
    try:
        with (
            ThreadPoolExecutor(1, thread_name_prefix="model-load") as model_pool,
            ThreadPoolExecutor(1, thread_name_prefix="probe-load") as probe_pool,
        ):
            if model_path is None:
                failed += not_measured(NO_MODEL_NOTE)
            else:
                shipped = model_pool.submit(_load, model_path)
            for done, probe in enumerate(probes):
                if budget.expired():
                    failed += _tagged(not_measured(SKIPPED_NOTE), probe, {})
                    continue
                if step is not None:
                    step(f"writing engine probe {probe.name}", LOADING_SHARE * done / len(probes))
                path = folder / f"probe-{probe.name.lower()}.gguf"
                if (unwritten := _write_probe(path, probe)) is not None:
                    failed += _tagged(not_measured(unwritten), probe, {})
                    continue
                probe_loads.append((probe, probe_pool.submit(_load_probe, host, path)))
    except BaseException:  # an interrupt, say: close what loaded
        if shipped is not None and not isinstance(loaded := shipped.result(), str):
            loaded.close()
        raise
    members: list[_Member] = []
    if shipped is not None:
        if isinstance(engine := shipped.result(), str):
            failed += not_measured(engine)
        else:
            stack.callback(engine.close)
            members.append(_Member(engine, _params(engine, CPU_BACKEND)))
    for probe, load in probe_loads:
        if isinstance(probed := load.result(), str):
            failed += _tagged(not_measured(probed), probe, {})
        elif not probed.alive:
            crash = probed.worker.crash
            why = f"not measured: a later probe ended the engine that held this one ({crash})"
            failed += _tagged(not_measured(why), probe, {})
        else:
            members.append(_Member(probed, {**_params(probed, CPU_BACKEND), "probe": probe.name}))
    return members, failed


def _write_probe(path: Path, probe: SpeedProbe) -> str | None:
    """Write a probe's model; None, or why it could not be (a full disk, most often), with
    the partial file removed."""
    try:
        write_uniform_gguf(path, probe.shape, probe.type_name)
        _flush_to_disk(path)
    except OSError as error:
        path.unlink(missing_ok=True)
        free_mib = shutil.disk_usage(path.parent).free // (1024 * 1024)
        return (
            f"its probe model could not be written in {path.parent} ({error}; {free_mib} MiB "
            "free): free some disk space and calibrate again"
        )
    return None


def _load_probe(host: ProbeHost, path: Path) -> ProbeEngine | str:
    """The probe at `path` in `host`, or why it could not load."""
    try:
        return host.load(_engine_config(path, CPU_BACKEND))
    except HearthsideError as error:
        return f"not measured: {error.message}"


def _load(path: Path) -> WorkerEngine | str:
    """The engine for `path` on the CPU (in a worker process: a probe that crashes llama.cpp
    must not end the app), or why it could not load."""
    from hearthside.core.engine.worker_engine import WorkerEngine

    try:
        return WorkerEngine(_engine_config(path, CPU_BACKEND))
    except HearthsideError as error:
        return f"not measured: {error.message}"


def _run_rounds(
    members: list[_Member], *, quick: bool, budget: Budget, step: StepCallback | None
) -> None:
    """A sizing round, then rounds until the budget is spent (at least MIN_ROUNDS)."""
    started, total_s = time.perf_counter(), budget.remaining_s()
    sized = [member for member in members if member.source is None]
    limit_s = total_s / (len(sized) * 2 * (MIN_ROUNDS + 1))
    for member in members:
        member.size_runs(limit_s, QUICK_N_GEN if quick else N_GEN)
    for done in range(MAX_ROUNDS):
        if done and budget.expired():  # one round at least: the shipped model's figures
            return
        round_started = time.perf_counter()
        for member in members:
            if done < member.rounds:
                member.run_round()
        if step is not None:
            spent = (time.perf_counter() - started) / max(total_s, 1e-9)
            step(f"engine round {done + 1}", LOADING_SHARE + (1 - LOADING_SHARE) * min(1, spent))
        if done + 1 >= MIN_ROUNDS and budget.remaining_s() < time.perf_counter() - round_started:
            return


def _flush_to_disk(path: Path) -> None:
    """Write the new file out now: the kernel's background writeback of it would otherwise
    take CPU time from the run that follows (measured: probes ~25% slower)."""
    with path.open("rb") as written:
        os.fsync(written.fileno())


def _tagged(
    measurements: list[Measurement], probe: SpeedProbe, work: dict[str, int | str]
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
    from hearthside.core.engine.worker_engine import WorkerEngine

    budget.take()  # the load's share
    try:
        engine = WorkerEngine(_engine_config(model_path, backend))
    except HearthsideError as error:
        return not_measured(f"not measured: {error.message}", backend.device)
    try:
        return _time_engine(engine, backend, quick=quick, budget=budget, warmup_s=warmup_s)
    finally:
        engine.close()


def _engine_config(model_path: Path, backend: EngineBackend) -> EngineConfig:
    # flash attention as the planner always configures it: it changes prefill speed by ~10%
    return EngineConfig(
        model_path=str(model_path),
        n_ctx=CONTEXT_TOKENS,
        n_gpu_layers=backend.n_gpu_layers,
        main_gpu=backend.main_gpu,
        split_mode="none" if backend.n_gpu_layers else "layer",
        flash_attn=True,
    )


def _time_engine(
    engine: WorkerEngine, backend: EngineBackend, *, quick: bool, budget: Budget, warmup_s: float
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


def _params(engine: WorkerEngine | ProbeEngine, backend: EngineBackend) -> dict[str, Any]:
    return {
        "model": engine.model_path.stem,
        "model_path": str(engine.model_path),
        "model_bytes": engine.model_path.stat().st_size,
        "n_gpu_layers": backend.n_gpu_layers,
        **per_token_work(validate_gguf(engine.model_path)),
    }
