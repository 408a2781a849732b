"""The tuner: measure the most promising settings with the real engine, remember everything.

For a model file on this machine it starts from the planner's pick, varies what the planner
cannot predict well on a CPU (decode threads, flash attention, the physical batch, the KV
type), and measures each candidate llama-bench style (timed warm-up, median of repetitions).
Each candidate loads in an engine worker process of its own (`WorkerEngine`), so a setting
that crashes llama.cpp (a signal, a GGML_ASSERT) ends only that process: it is recorded as
`crashed` and the next candidate is measured. Every result — out-of-memory, failures and
crashes included — goes into the autotune DB with its rigor; a configuration that already
failed is never tried again (one that timed out is: see below; one out of memory is, once
much more memory is free), and one already measured at least as rigorously is answered from
the DB. The comparisons are measured the same way: llama.cpp's own defaults first (the
headline's), llama-cpp-python's last. The whole run keeps one time budget
(`autotune/tune_budget.py`): weight types the calibration lacks first (`tune_types.py`),
candidates, the quality of their KV-cache types (`tune_quality.py`), the model's installed
quant variants (one run each at the best settings found for the file, f16 KV, and their quality
against it), speculation, the winner's context audit, each with a deadline; a measurement past
its deadline is stopped and recorded as `timeout`, and what was cut is in `TuneResult.notes`;
a candidate stopped so, or never started, is "not measured" (`TuneResult.not_measured`, an
`unmeasured` event), never a failure.
The goal picks the winner among all the runs, variants' too, by speed and quality (`goals.py`:
"fastest" is the fastest within a KLD budget; llama.cpp's defaults stay the pick over a lead
that is noise). Measured over predicted speed updates the
machine's efficiency factors, and the winner becomes its file's default on this machine,
unless the repetitions disagreed beyond their noise bound (`busy.py`): then other programs
were busy, `TuneResult.busy` says why, no default is saved, and a later run measures those
settings again instead of reusing them. Progress goes to a listener (the CLI's progress line,
the GUI wizard's chart).
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import psutil

from hearthside.autotune.busy import busy_from_runs, disturbed, disturbed_note
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.capacity import CapacityAudit, audit_context_within
from hearthside.autotune.family_quality import kv_priors
from hearthside.autotune.fingerprint import (
    TuningKey,
    machine_identity,
    model_fingerprint,
    tuning_key,
)
from hearthside.autotune.goals import (
    DECODE_ONLY_GOALS,
    KLD_BUDGET,
    SAME_SPEED_BAND,
    Choice,
    RunQuality,
    choose,
    prior_quality,
    unmeasured_quality,
)
from hearthside.autotune.memory import WeightPiece, pieces_from_spec
from hearthside.autotune.planner import Goal, Plan, SpeedEstimate, evaluate_config, plan
from hearthside.autotune.speculative import (
    DraftOption,
    SpeculationDecision,
    Trial,
    VerifyCost,
    Workload,
    WorkloadPrompt,
    decide_for_workload,
    describe,
    load_workloads,
    relative_draft_cost,
    speculative_key,
)
from hearthside.autotune.tune_budget import (
    ENGINE_LOAD_S,
    MIN_AUDIT_S,
    PhaseNote,
    TuneClock,
    Watchdog,
    estimated_audit_s,
)
from hearthside.autotune.tune_quality import (
    KvQuality,
    QuantVariant,
    installed_variants,
    kv_quality,
    variant_quality,
)
from hearthside.autotune.tune_types import measure_missing_types
from hearthside.autotune.tune_wait import (
    CONFIRM_RUNS,
    WORTH_MEASURING,
    TuneCosts,
    candidates_first_s,
    confirm_reserve_s,
)
from hearthside.autotune.type_costs import model_weight_types, unmeasured_types
from hearthside.autotune.wisdom import (
    Outcome,
    Rigor,
    RunRecord,
    WisdomDB,
    config_key,
    sync_recipes,
)
from hearthside.core.engine.bench import measure_verify_cost, run_bench
from hearthside.core.engine.config import (
    CHAT_CONTEXT,
    EngineConfig,
    SamplingParams,
    SpeculativeConfig,
    physical_core_count,
)
from hearthside.core.engine.engine import ChatMessage, GenerationResult
from hearthside.core.engine.speculative import SpeculationStats, merge_stats
from hearthside.core.engine.worker_engine import EngineLoader, WorkerEngine
from hearthside.core.errors import EngineCrashedError, EngineError, EngineOutOfMemoryError
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.probe.cpu_use import cpu_use_now, others_cores
from hearthside.core.probe.profile import HardwareProfile
from hearthside.kernels.engine_run import PROBE_TYPES, candidate_thread_counts
from hearthside.kernels.measurement import spread_of

# "unmeasured": a candidate the budget cut off (never started, or stopped at its deadline)
EventKind = Literal[
    "start", "measured", "reused", "skipped", "failed", "unmeasured", "quality", "confirm", "done"
]
Baseline = Literal["", "llama.cpp", "llama-cpp-python"]


# A quick measurement: enough tokens to be stable on a small model, short enough for a wizard.
@dataclass(frozen=True)
class BenchSize:
    n_prompt: int
    n_gen: int
    repetitions: int
    warmup_s: float


QUICK = BenchSize(n_prompt=128, n_gen=32, repetitions=3, warmup_s=0.3)
THOROUGH = BenchSize(n_prompt=512, n_gen=128, repetitions=5, warmup_s=1.0)
TUNING_CONTEXT = CHAT_CONTEXT  # measured at the context a chat runs, so Apply keeps it
OOM_RETRY_FREE_RATIO = 1.5  # an out-of-memory load is tried again with this much more free
# A model's load in a fresh worker beyond its start (`ENGINE_LOAD_S`): mapping the file from
# the page cache and repacking its weights for this CPU.
LOAD_BYTES_PER_S = 1.0e9


@dataclass(frozen=True)
class TuneEvent:
    kind: EventKind
    index: int  # 1-based position of this candidate
    total: int
    config: dict[str, Any]
    predicted_decode_tps: float | None = None
    decode_tps: float | None = None
    prefill_tps: float | None = None
    message: str = ""
    workload: str | None = None  # set for speculative-decoding measurements
    baseline: Baseline = ""  # whose defaults this candidate is, if anyone's
    variant: str = ""  # a quant variant's label ("Q4_0") when the run is of that file
    model: str = ""  # that file's fingerprint (its runs' `key.model`); "": the tuned file
    memory_bytes: int | None = None  # what llama.cpp allocated for a measured or reused run
    outcome: str = ""  # a failed or skipped candidate's: "oom", "failed", "crashed"


Listener = Callable[[TuneEvent], None]

# A gain below this, from one run each minutes apart (or one answered from the DB), is
# measured again back to back before it is claimed: on Llama 3.1 8B here `tune` showed 1.057x
# for settings that decode alike natively (0.986x, benchmarks/realistic_models.py).
CONFIRM_BELOW = 1.15
# Settings whose effect on decode one run of each cannot tell apart: a token at a time is one
# micro-batch whatever the batch sizes, computed with `n_threads` (llama.cpp takes
# `n_threads_batch` for batches of more than one token), so a gain between settings that differ
# only in these is never claimed. On the 8B here `tune` showed 1.16x for batch 512 over the
# defaults' 2048, from one slow measurement of the defaults (natively 6.0 vs 6.9 tok/s); on the
# MoE 1.13x even measured again back to back. Not nothing, though: natively on a Zen 4 EPYC the
# MoE decoded 0.94x at batch 512 against 2048, next to each other in both rounds (2026-12-07).
DECODE_NEUTRAL = ("n_batch", "n_ubatch", "n_threads_batch")
# Only on a sliding-window model does `swa_full` change the cache; elsewhere the planner's True
# and llama.cpp's False load the same engine (the Qwen3-30B-A3B-shaped MoE's pick differed from
# the defaults in batch sizes and this alone).
SWA_ONLY = ("swa_full",)


@dataclass(frozen=True)
class NotMeasured:
    """A candidate the budget (or a stop) cut off: never started, or stopped at its deadline
    (`started`: its run is a `timeout`). Neither measured nor failed: nothing is known of its
    speed but its prediction."""

    config: dict[str, Any]
    predicted_decode_tps: float | None
    baseline: Baseline = ""  # whose defaults it is, if anyone's
    started: bool = False


@dataclass(frozen=True)
class VariantRun:
    """An installed quant variant of the tuned file, measured at its best settings with an
    f16 KV cache: its runs are under `model` (their `key.model`), its quality against the
    tuned file."""

    label: str  # e.g. "Q4_0"
    model_id: str  # its id in the model store
    path: str
    model: str  # its fingerprint
    quality: RunQuality


@dataclass(frozen=True)
class TuneResult:
    key: TuningKey
    goal: Goal
    best: RunRecord | None
    baseline: RunRecord | None  # llama.cpp's own defaults, measured the same way
    runs: tuple[RunRecord, ...]
    plan: Plan
    audit: CapacityAudit | None = None  # of the winner's context
    speculation: tuple[SpeculationDecision, ...] = ()  # one per workload, measured on the winner
    notes: tuple[PhaseNote, ...] = ()  # phases shortened or skipped to keep the budget, and why
    python_defaults: RunRecord | None = None  # llama-cpp-python's `Llama()` defaults
    quality: KvQuality | None = None  # of each KV-cache type the runs used
    fastest: RunRecord | None = None  # the fastest run whatever its quality
    kld_budget: float = KLD_BUDGET
    variants: tuple[VariantRun, ...] = ()  # the model's quant variants tried
    file_best: RunRecord | None = None  # the pick among the tuned file's own runs
    model_path: str = ""  # the tuned file
    # why other programs seem to have been busy while measuring (`autotune/busy.py`): then no
    # default is stored from this run; None when the repeats agreed
    busy: str | None = None
    # the candidates cut off before they were measured, of `candidates` in the queue; a
    # measured one took about `candidate_s` (0: none was measured now)
    not_measured: tuple[NotMeasured, ...] = ()
    candidates: int = 0
    candidate_s: float = 0.0
    # a gain that may be noise measured again back to back: (llama.cpp's defaults, the pick)
    confirmation: tuple[RunRecord, RunRecord] | None = None
    # why a gain that may be noise needed measuring again, when there was no time to
    unconfirmed: str = ""
    # the pick differs from llama.cpp's defaults only in settings one run cannot tell apart
    # in decode (`decode_alike`): no gain is claimed, whatever one run of each read
    decode_alike: bool = False

    @property
    def chosen_variant(self) -> VariantRun | None:
        """The variant whose run won, if one did: that file is the pick."""
        return self.variant_of(self.best) if self.best is not None else None

    def variant_of(self, run: RunRecord) -> VariantRun | None:
        return next((v for v in self.variants if v.model == run.key.model), None)

    @property
    def speedup(self) -> float | None:
        """The winner's decode speed over llama.cpp's defaults'; when the gain was measured
        again back to back, the smaller of the two: a gain is claimed only as far as both
        measurements show it. 1.0 for settings that decode alike: what two runs of them
        read apart is noise (on the MoE here 1.13x twice in `tune`, 0.95x in-engine ABBA)."""
        first = _ratio(self.best, self.baseline)
        if first is not None and self.decode_alike:
            return 1.0
        if first is None or self.confirmation is None:
            return first
        baseline_again, best_again = self.confirmation
        again = _ratio(best_again, baseline_again)
        return first if again is None else min(first, again)

    @property
    def speedup_over_python_defaults(self) -> float | None:
        return _ratio(self.best, self.python_defaults)

    @property
    def budget_cost(self) -> float | None:
        """How much faster the fastest run was than the pick: what the quality budget cost."""
        return _ratio(self.fastest, self.best)

    def quality_of(self, run: RunRecord) -> RunQuality:
        variant = self.variant_of(run)
        return variant.quality if variant is not None else _run_quality(self.quality, run)


def _ratio(first: RunRecord | None, second: RunRecord | None) -> float | None:
    if not (first and second and first.decode_tps and second.decode_tps):
        return None
    return first.decode_tps / second.decode_tps


def llama_cpp_defaults(model_path: str, profile: HardwareProfile, n_ctx: int) -> EngineConfig:
    """What `llama-server -m FILE` uses (common/common.h, arg.cpp): the physical (performance)
    cores for both phases, flash attention auto (on where the backend has it: the CPU does), an
    f16 KV cache, batch 2048 / micro-batch 512, every layer on the GPU there is, and a
    sliding-window cache only as long as the window (`swa_full` off, as in common.h and
    llama-bench). The context is the tuned one, so both hold the same cache."""
    cores = profile.cpu.performance_cores or profile.cpu.physical_cores or 1
    return EngineConfig(
        model_path,
        n_ctx=n_ctx,
        n_threads=cores,
        n_threads_batch=cores,
        n_batch=2048,
        n_ubatch=512,
        flash_attn=True,
        n_gpu_layers=-1 if profile.gpus else 0,
        swa_full=False,
    )


def llama_cpp_python_defaults(model_path: str) -> EngineConfig:
    """What `Llama(model_path)` uses when nothing is set (FIELD_NOTES): 512 context,
    cpu_count // 2 decode threads and cpu_count prompt threads, no flash attention, f16 KV."""
    logical = os.cpu_count() or 2
    return EngineConfig(
        model_path,
        n_ctx=512,
        n_threads=max(1, logical // 2),
        n_threads_batch=logical,
        flash_attn=False,
    )


def candidates(base: EngineConfig, profile: HardwareProfile) -> list[EngineConfig]:
    """The planner's pick first, then one change at a time, then the promising pairs. The
    KV-cache types come before the micro-batch sizes: a short budget measures first what
    changes the memory and quality a person sees, not a few percent of prompt speed."""
    cores = profile.cpu.performance_cores or profile.cpu.physical_cores or 1
    threads = candidate_thread_counts(cores, profile.cpu.logical_cores or cores)
    variants = [base]
    variants += [base.with_changes(n_threads=count) for count in threads]
    variants += [_with_flash(base, not base.flash_attn)]
    variants += [base.with_changes(flash_attn=True, type_k="f16", type_v="f16")]
    variants += [base.with_changes(flash_attn=True, type_k="q8_0", type_v="q8_0")]
    variants += [base.with_changes(flash_attn=True, type_k="q4_0", type_v="q4_0")]
    variants += [
        base.with_changes(n_ubatch=size, n_batch=max(size, base.n_batch)) for size in (128, 256)
    ]
    variants += [
        _with_flash(base.with_changes(n_threads=count), flash)
        for count in threads
        for flash in (True, False)
    ]
    return _unique(variants)


def _with_flash(config: EngineConfig, flash_attn: bool) -> EngineConfig:
    """Flash attention on or off; off also means an f16 KV cache (llama.cpp's rule)."""
    if flash_attn:
        return config.with_changes(flash_attn=True)
    return config.with_changes(flash_attn=False, type_k="f16", type_v="f16")


def tune(
    model_path: Path,
    profile: HardwareProfile,
    *,
    goal: Goal = "fastest",
    budget_s: float = 60.0,
    rigor: Rigor = "quick",
    wisdom: WisdomDB | None = None,
    listener: Listener | None = None,
    cancel: threading.Event | None = None,
    save_default: bool = True,
    speculation: bool = True,
    drafts: Sequence[Path] = (),
    workloads: Sequence[Workload] | None = None,
    key: TuningKey | None = None,
    variants: Sequence[QuantVariant] | None = None,
    kld_budget: float = KLD_BUDGET,
    load: EngineLoader = WorkerEngine,
) -> TuneResult:
    """Measure within `budget_s` in all; store runs, efficiency and the winner.

    The budget covers the whole run (`autotune/tune_budget.py`): the model's weight types
    the calibration lacks are measured first (so the predictions are "measured"), then the
    candidates, then the quality of the KV-cache types they used (`tune_quality.py`; the goal
    chooses by speed and quality, `goals.py`), then, with `speculation`, speculative decoding
    on the winner per workload
    (prompt lookup, and each of `drafts`: smaller models with the same vocabulary; the chat
    workload's choice goes into the saved default, every workload's into its own default,
    `speculative_key`), then the winner's context audit. What did not fit is in `notes`.
    `workloads` defaults to the shipped ones (`assets/speculative_prompts.json`). With
    `save_default=False` nothing is saved as a default (the wizard saves on Apply), nor when
    other programs were busy (`TuneResult.busy`); runs are always recorded. `key` is the
    model's tuning key when the caller has computed it. `load` starts an engine for a config
    (each in a worker process of its own by default); every engine the run uses comes from it.
    `variants` are the model's quant variants to try at the best settings found for the file
    (None: those installed, `installed_variants`); when one wins, its file is the pick and the
    winner is saved as that file's default (the tuned file keeps its own pick as its default).
    """
    request = TuneRequest(
        model_path,
        profile,
        goal,
        budget_s,
        rigor,
        save_default,
        speculation,
        tuple(drafts),
        workloads,
        key,
        variants,
        kld_budget,
    )
    owned = wisdom is None
    db = wisdom or WisdomDB()
    try:
        return TuningSession(request, db, listener, cancel, load).run()
    finally:
        if owned:
            db.close()


@dataclass(frozen=True)
class TuneRequest:
    """What to tune and how (`tune`'s arguments)."""

    model_path: Path
    profile: HardwareProfile
    goal: Goal = "fastest"
    budget_s: float = 60.0
    rigor: Rigor = "quick"
    save_default: bool = True
    speculation: bool = True
    drafts: tuple[Path, ...] = ()
    workloads: Sequence[Workload] | None = None
    key: TuningKey | None = None
    variants: Sequence[QuantVariant] | None = None
    kld_budget: float = KLD_BUDGET


class TuningSession:
    """One tuning run, phase by phase, each handing the next what it found:

    1. types: the weight types the calibration lacks are measured, so predictions are;
    2. predict: every candidate predicted and put in the order of its predicted gain
       (`_prepare`), and the budget split between the phases (`TuneClock.split`);
    3. candidates: measured in that order while the budget holds (`_measure_candidates`);
       those cut off are announced as not measured, with their predictions;
    4. quality: of the KV-cache types the measured candidates used;
    5. variants: the model's installed quant variants at the best settings so far;
    6. confirm: a gain over llama.cpp's defaults that may be noise (small, or from repeats
       that varied as much) measured again; none is claimed between settings that differ
       only in batch sizes (`decode_alike`);
    7. speculation: per workload, on the winner;
    8. verdict: busy or not, the defaults saved, the winner's context audit, the result.

    Every engine comes from `load`; every event goes to the listener, carrying what it needs
    (settings, prediction, measurement, outcome), so no listener reads the DB.
    """

    def __init__(
        self,
        request: TuneRequest,
        db: WisdomDB,
        listener: Listener | None = None,
        cancel: threading.Event | None = None,
        load: EngineLoader = WorkerEngine,
    ) -> None:
        self.request, self.db, self.load = request, db, load
        self.notify: Listener = listener or (lambda _event: None)
        self.stop = cancel or threading.Event()
        self.clock = TuneClock(request.budget_s)
        self.key = request.key or tuning_key(request.profile, request.model_path)
        self.notes: list[PhaseNote] = []

    def run(self) -> TuneResult:
        request = self.request
        self.db.note_machine(self.key.machine, machine_identity(request.profile))
        sync_recipes(self.db)
        spec = spec_from_gguf(request.model_path)
        variants = self._types_and_variants()
        prepared = self._predict(spec, bool(variants))
        measured, roles = self._candidates(prepared)
        not_measured = _not_measured(prepared.queue, prepared.predictions, roles, measured)
        baseline = next((r for r in measured.runs if _same(r.config, prepared.baseline)), None)
        python_defaults = next((r for r in measured.runs if _same(r.config, prepared.python)), None)
        tuned = [
            r
            for r in measured.runs
            if r.outcome == "ok" and _choice_for_chat(r, python_defaults, prepared.uses_swa)
        ]
        quality = self._quality(tuned)
        pickable = baseline if baseline in tuned else None  # never a window-sized cache
        own = _defaults_over_batch_only(
            choose(
                tuned, partial(_run_quality, quality), request.goal, request.kld_budget, baseline
            ),
            pickable,
            request.goal,
            prepared.uses_swa,
        )
        tried = self._variants(prepared, variants, own.best, measured)
        choice = _defaults_over_batch_only(
            _choice_with_variants(
                tuned, quality, tried, request.goal, request.kld_budget, baseline
            ),
            pickable,
            request.goal,
            prepared.uses_swa,
        )
        best = choice.best
        confirmation = self._confirm(prepared, measured, best, baseline)
        alike = (
            best is not None
            and baseline is not None
            and best.key.model == self.key.model
            and decode_alike(best, baseline, prepared.uses_swa)
        )
        decisions = self._speculation(best, tried, len(prepared.queue) + len(variants) + 1)
        busy = busy_from_runs((*measured.runs, *tried.runs), best, baseline)
        audit = self._verdict(best, own.best, tried, decisions, busy)
        queued = len(prepared.queue)
        self.notify(TuneEvent("done", queued, queued, best.config if best else {}))
        return TuneResult(
            self.key,
            request.goal,
            best,
            baseline,
            (*measured.runs, *tried.runs),
            prepared.planned,
            audit,
            decisions,
            tuple(self.notes),
            python_defaults,
            quality,
            choice.fastest,
            request.kld_budget,
            tried.variants,
            own.best,
            str(request.model_path),
            busy,
            not_measured,
            queued,
            measured.typical_s,
            confirmation[0],
            confirmation[1],
            alike,
        )

    def _types_and_variants(self) -> Sequence[QuantVariant]:
        """Phase 1: the missing weight types measured; the variants to try found."""
        request = self.request
        self.notes += measure_missing_types(
            request.model_path, request.profile, self.db, self.clock
        )
        if request.variants is not None:
            return request.variants
        variants, variant_notes = installed_variants(request.model_path)
        self.notes += variant_notes
        return variants

    def _predict(self, spec: ModelSpec, has_variants: bool) -> _Prepared:
        """Phase 2: every candidate predicted and ordered; the budget split."""
        request = self.request
        prepared = _prepare(
            request.model_path, request.profile, request.goal, self.db, self.key, spec
        )
        candidate_s = _candidate_s(prepared, self.db, self.key, request.rigor)[0]
        self.clock.split(
            prepared.audit_s,
            speculation=request.speculation,
            variants=has_variants,
            candidates_first_s=candidates_first_s(candidate_s),
            confirm_s=confirm_reserve_s(candidate_s),
        )
        return prepared

    def _candidates(self, prepared: _Prepared) -> tuple[_Measured, list[Baseline]]:
        """Phase 3: the candidates measured in order while the budget holds."""
        roles = [_role(prepared.baseline, prepared.python, config) for config in prepared.queue]
        measured = _measure_candidates(
            self.db,
            self.key,
            prepared.queue,
            prepared.predictions,
            self.request.rigor,
            prepared.planned,
            self.clock,
            _with_roles(self.notify, roles),
            self.stop,
            self.load,
        )
        self.notes += measured.notes
        return measured, roles

    def _quality(self, tuned: Sequence[RunRecord]) -> KvQuality | None:
        """Phase 4: the quality of the KV-cache types the measured candidates used."""
        if not tuned or self.stop.is_set():
            return None
        request = self.request
        quality = _kv_quality(
            self.db,
            request.model_path,
            self.key.model,
            tuned,
            request.rigor,
            self.clock,
            self.notify,
            self.load,
        )
        self.notes += quality.notes
        return quality

    def _variants(
        self,
        prepared: _Prepared,
        variants: Sequence[QuantVariant],
        file_best: RunRecord | None,
        measured: _Measured,
    ) -> _Variants:
        """Phase 5: each installed quant variant at the best settings found for the file."""
        if file_best is None or not variants or self.stop.is_set():
            return _Variants()
        request = self.request
        setup = _VariantSetup(
            self.db,
            self.key,
            request.model_path,
            request.profile,
            prepared.calibration,
            request.rigor,
            self.clock,
            self.notify,
            self.stop,
            self.load,
        )
        first_index = len(prepared.queue) + 1
        tried = _try_variants(setup, variants, file_best, measured.typical_s, first_index)
        self.notes += tried.notes
        return tried

    def _confirm(
        self,
        prepared: _Prepared,
        measured: _Measured,
        best: RunRecord | None,
        baseline: RunRecord | None,
    ) -> tuple[tuple[RunRecord, RunRecord] | None, str]:
        """Phase 6: a gain over llama.cpp's defaults that may be noise measured again, both
        back to back; (the two runs or None, why the gain needed it when it stays unconfirmed)."""
        if best is None or baseline is None or self.stop.is_set():
            return None, ""
        why = confirmation_reason(best, baseline, self.key, uses_swa=prepared.uses_swa)
        if not why:
            return None, ""
        request = self.request
        cost_s = measured.typical_s or _candidate_s(prepared, self.db, self.key, request.rigor)[0]
        again = _confirm(
            self.key,
            request.model_path,
            (baseline, best),
            request.rigor,
            self.clock,
            cost_s,
            self.notify,
            self.load,
        )
        return again, why if again is None else ""

    def _speculation(
        self, best: RunRecord | None, tried: _Variants, first_index: int
    ) -> tuple[SpeculationDecision, ...]:
        """Phase 7: speculative decoding per workload on the winner, after the time for the
        winner's context audit is set aside."""
        if best is None:
            return ()
        n_ctx = int(best.config.get("n_ctx") or TUNING_CONTEXT)
        self.clock.hold_for_audit(estimated_audit_s(n_ctx, best.prefill_tps, best.decode_tps))
        request = self.request
        if not request.speculation or self.stop.is_set():
            return ()
        decisions = decide_speculation(
            self.db,
            best.key,
            _file_of(best, tried.variants, request.model_path),
            best.config,
            rigor=request.rigor,
            deadline=self.clock.speculation_end,  # no grace: the audit's time comes next
            drafts=request.drafts,
            workloads=request.workloads,
            listener=self.notify,
            cancel=self.stop,
            first_index=first_index,
            load=self.load,
        )
        self.notes += _speculation_notes(decisions, self.clock)
        return decisions

    def _verdict(
        self,
        best: RunRecord | None,
        file_best: RunRecord | None,
        tried: _Variants,
        decisions: Sequence[SpeculationDecision],
        busy: str | None,
    ) -> CapacityAudit | None:
        """Phase 8: the winner saved as the default unless other programs were busy, and its
        context audited in what is left of the budget."""
        request = self.request
        if best is None:
            if not self.stop.is_set():
                self.notes += _no_winner_notes(request.speculation)
            return None
        if request.save_default and busy is None:
            _save_all(self.db, self.key, best, file_best, request.goal, decisions)
        if self.stop.is_set():
            return None
        winner_path = _file_of(best, tried.variants, request.model_path)
        audit, note = _audit(self.db, best.key, winner_path, best, self.clock, self.load)
        self.notes += [note] if note is not None else []
        return audit


@dataclass(frozen=True)
class _Prepared:
    """What a tuning run measures, in order, and what the planner predicts for it."""

    calibration: dict[str, float]
    planned: Plan
    baseline: EngineConfig  # llama.cpp's defaults
    python: EngineConfig  # llama-cpp-python's defaults
    queue: list[EngineConfig]
    predictions: list[SpeedEstimate | None]
    audit_s: float  # the pick's context audit, from the planner's speeds
    uses_swa: bool  # the model has sliding-window layers (`swa_full` changes its cache)


def _prepare(
    model_path: Path,
    profile: HardwareProfile,
    goal: Goal,
    db: WisdomDB,
    key: TuningKey,
    spec: ModelSpec,
) -> _Prepared:
    calibration = calibration_for(profile, db)
    # one slot: a run measures one request, and loads add the slots (load_settings.py)
    # the longest-context goal plans the longest context that fits, the others chat's
    context = None if goal == "longest-context" else TUNING_CONTEXT
    planned = plan(
        spec,
        profile,
        goal=goal,
        n_ctx=context,
        calibration=calibration,
        n_parallel=1,
        kv_priors=kv_priors(db, spec.architecture, key.model),
    )
    base = replace(planned.config, model_path=str(model_path))
    baseline = llama_cpp_defaults(str(model_path), profile, base.n_ctx)
    python = llama_cpp_python_defaults(str(model_path))
    queue = _queue(baseline, base, python, profile)
    predictions = predicted_speeds(spec, profile, queue, calibration)
    fixed = len(_unique([baseline, base]))
    order = _ranked(queue, predictions, fixed, python)
    queue, predictions = [queue[i] for i in order], [predictions[i] for i in order]
    audit_s = estimated_audit_s(base.n_ctx, planned.speed.prefill_tps, planned.speed.decode_tps)
    uses_swa = bool(spec.swa_layers)
    return _Prepared(calibration, planned, baseline, python, queue, predictions, audit_s, uses_swa)


def tuning_costs(
    model_path: Path,
    profile: HardwareProfile,
    db: WisdomDB,
    *,
    goal: Goal = "fastest",
    rigor: Rigor = "quick",
    calibration_s: float = 0.0,
    speculation: bool = True,
) -> TuneCosts:
    """What tuning `model_path` here costs, before it starts (`tune_wait.py`): one
    candidate's time from this model's runs here when there are some, else from the plan's
    speeds and the model's size; a calibration first when `calibration_s`."""
    key = tuning_key(profile, model_path)
    spec = spec_from_gguf(model_path)
    prepared = _prepare(model_path, profile, goal, db, key, spec)
    candidate_s, measured = _candidate_s(prepared, db, key, rigor)
    types = model_weight_types(pieces_from_spec(spec))
    # a calibration first measures its probes' types and makes any others estimated again
    missing = (
        [name for name in types if name not in PROBE_TYPES]
        if calibration_s
        else unmeasured_types(types, prepared.calibration)
    )
    return TuneCosts(
        candidate_s=candidate_s,
        source="measured" if measured else "estimated",
        candidates=len(prepared.queue),
        audit_s=prepared.audit_s,
        missing_types=len(missing),
        calibrated=calibration_s > 0 or db.latest_calibration(key.machine) is not None,
        calibration_s=calibration_s,
        speculation=speculation,
        variants=bool(installed_variants(model_path)[0]),
    )


def _candidate_s(
    prepared: _Prepared, db: WisdomDB, key: TuningKey, rigor: Rigor
) -> tuple[float, bool]:
    """What measuring one candidate takes here, and whether that was measured: the median
    wall time of this model's runs here at `rigor`, else estimated from the plan."""
    runs = db.runs(key, outcome="ok")
    seconds = [run.seconds for run in runs if run.seconds and run.rigor == rigor]
    if seconds:
        return statistics.median(seconds), True
    size = THOROUGH if rigor == "thorough" else QUICK
    return _estimated_candidate_s(prepared, size), False


def _estimated_candidate_s(prepared: _Prepared, size: BenchSize) -> float:
    """A worker start, the model's load and `size`'s timed warm-ups and repetitions of the
    prompt and the decode test, at the planner's speeds for its pick."""
    speed = prepared.planned.speed
    weights = sum(device.weights_bytes for device in prepared.planned.devices)
    load_s = ENGINE_LOAD_S + weights / LOAD_BYTES_PER_S
    prompt_s = size.n_prompt / max(speed.prefill_tps_at(size.n_prompt), 1e-3)
    decode_s = size.n_gen / max(speed.decode_tps_empty_context or speed.decode_tps, 1e-3)
    # each test: a warm-up of at least one run and `warmup_s`, then its repetitions
    tests_s = sum(max(one, size.warmup_s) + size.repetitions * one for one in (prompt_s, decode_s))
    return load_s + tests_s


def _queue(
    baseline: EngineConfig, base: EngineConfig, python: EngineConfig, profile: HardwareProfile
) -> list[EngineConfig]:
    """llama.cpp's defaults (the headline's comparison), the planner's pick, its variations,
    then llama-cpp-python's defaults (a second comparison, when the budget reaches it)."""
    return _unique([baseline, base, *candidates(base, profile), python])


def _ranked(
    queue: Sequence[EngineConfig],
    predictions: Sequence[SpeedEstimate | None],
    fixed: int,
    python: EngineConfig,
) -> list[int]:
    """The order to measure `queue` in (indices): its first `fixed` (llama.cpp's defaults and
    the planner's pick), then the variations the cost model ranks fastest (predicted decode
    at an empty context, what a run measures), so that the shortest budget measures the
    defaults and the two settings ranked best (`tune_wait.WORTH_MEASURING`), then the rest
    in their order (the KV-cache types before the micro-batches), llama-cpp-python's
    defaults last."""
    python_key = config_key(python.to_dict())
    rest = [
        index
        for index in range(fixed, len(queue))
        if config_key(queue[index].to_dict()) != python_key
    ]
    ranked = sorted(rest, key=lambda index: -_empty_context_decode(predictions[index]))
    promoted = ranked[: max(0, WORTH_MEASURING - fixed)]
    others = [index for index in range(fixed, len(queue)) if index not in promoted]
    return [*range(fixed), *promoted, *others]


def _empty_context_decode(speed: SpeedEstimate | None) -> float:
    if speed is None:
        return 0.0
    return speed.decode_tps_empty_context or speed.decode_tps


def _choice_for_chat(run: RunRecord, python_defaults: RunRecord | None, uses_swa: bool) -> bool:
    """Whether a measured run may be the pick. Comparisons only: llama-cpp-python's defaults
    (a 512-token context) and, on a sliding-window model, a window-sized cache (llama.cpp's
    defaults): there every chat turn would read the whole conversation again, and the
    context audit finds the early positions gone."""
    if run is python_defaults:
        return False
    return not uses_swa or bool(run.config.get("swa_full", True))


def _role(baseline: EngineConfig, python: EngineConfig, config: EngineConfig) -> Baseline:
    settings = config.to_dict()
    if _same(settings, baseline):
        return "llama.cpp"
    return "llama-cpp-python" if _same(settings, python) else ""


def _with_roles(notify: Listener, roles: Sequence[Baseline]) -> Listener:
    """`notify`, each candidate's event saying whose defaults it is (by its 1-based index)."""
    return lambda event: notify(replace(event, baseline=roles[event.index - 1]))


def _kv_quality(
    db: WisdomDB,
    model_path: Path,
    fingerprint: str,
    tuned: Sequence[RunRecord],
    rigor: Rigor,
    clock: TuneClock,
    notify: Listener,
    load: EngineLoader,
) -> KvQuality:
    """The quality of each KV-cache type the measured runs used, within the quality phase."""

    def announce(kv_type: str, measured: RunQuality) -> None:
        message = f"{kv_type} KV: mean KLD {measured.mean_kld:.4f} vs f16"
        notify(TuneEvent("quality", 0, 0, {"type_k": kv_type}, message=message))

    return kv_quality(
        model_path,
        {str(run.config.get("type_k") or "f16") for run in tuned},
        db,
        rigor=rigor,
        seconds_left=lambda: clock.left_s(clock.quality_end),
        prefill_tps=max(run.prefill_tps or 0.0 for run in tuned),
        listener=announce,
        fingerprint=fingerprint,
        load=load,
    )


def _run_quality(quality: KvQuality | None, run: RunRecord) -> RunQuality:
    kv_type = str(run.config.get("type_k") or "f16")
    return quality.of(kv_type) if quality else prior_quality(kv_type)


@dataclass(frozen=True)
class _VariantSetup:
    """What trying the quant variants needs from the run so far."""

    db: WisdomDB
    key: TuningKey
    model_path: Path
    profile: HardwareProfile
    calibration: dict[str, float]
    rigor: Rigor
    clock: TuneClock
    notify: Listener
    stop: threading.Event
    load: EngineLoader


@dataclass(frozen=True)
class _Variants:
    runs: tuple[RunRecord, ...] = ()
    variants: tuple[VariantRun, ...] = ()
    notes: tuple[PhaseNote, ...] = ()


def _try_variants(
    setup: _VariantSetup,
    variants: Sequence[QuantVariant],
    best: RunRecord,
    typical_s: float,
    first_index: int,
) -> _Variants:
    """Each variant once at `best`'s settings, then its quality, until the variants' deadline;
    one that no longer fits is left out with a note."""
    runs: list[RunRecord] = []
    tried: list[VariantRun] = []
    notes: list[PhaseNote] = []
    total = first_index + len(variants) - 1
    for index, variant in enumerate(variants, start=first_index):
        if setup.stop.is_set():
            break
        if setup.clock.now() + typical_s > setup.clock.variants_end:
            notes.append(_variant_out_of_time(variant, typical_s, setup.clock))
            continue
        run, model = _variant_run(setup, variant, best, index, total)
        runs += [run] if run is not None else []
        quality, note = _variant_quality(setup, variant, run, model)
        notes += [note] if note is not None else []
        tried.append(VariantRun(variant.label, variant.model_id, str(variant.path), model, quality))
    return _Variants(tuple(runs), tuple(tried), tuple(notes))


def _variant_run(
    setup: _VariantSetup, variant: QuantVariant, best: RunRecord, index: int, total: int
) -> tuple[RunRecord | None, str]:
    """`best`'s settings on the variant's file, with an f16 KV cache: the variant's quality is
    measured with one, so the figure is this run's own. Stored under the variant's key."""
    values = {**best.config, "model_path": str(variant.path), "type_k": "f16", "type_v": "f16"}
    config = EngineConfig.from_dict(values)
    key = replace(setup.key, model=model_fingerprint(variant.path))
    spec = spec_from_gguf(variant.path)
    (predicted,) = predicted_speeds(spec, setup.profile, [config], setup.calibration)

    def notify(event: TuneEvent) -> None:
        setup.notify(replace(event, variant=variant.label, model=key.model))

    watchdog = Watchdog(setup.clock.variants_end + setup.clock.grace_s)
    run = _try(
        setup.db,
        key,
        config,
        setup.rigor,
        None,
        predicted,
        index,
        total,
        notify,
        watchdog,
        setup.load,
    )
    return run, key.model


def _variant_quality(
    setup: _VariantSetup, variant: QuantVariant, run: RunRecord | None, model: str
) -> tuple[RunQuality, PhaseNote | None]:
    if run is None or run.outcome != "ok":
        return unmeasured_quality(), None
    quality, note = variant_quality(
        setup.model_path,
        variant,
        setup.db,
        rigor=setup.rigor,
        seconds_left=lambda: setup.clock.left_s(setup.clock.variants_end),
        prefill_tps=run.prefill_tps,
        load=setup.load,
    )
    if quality.measured:
        message = f"{variant.label} (variant): mean KLD {quality.mean_kld:.4f} vs the tuned file"
        event = TuneEvent("quality", 0, 0, run.config, message=message)
        setup.notify(replace(event, variant=variant.label, model=model))
    return quality, note


def _variant_out_of_time(variant: QuantVariant, typical_s: float, clock: TuneClock) -> PhaseNote:
    left_s = max(clock.left_s(clock.variants_end), 0.0)
    why = (
        f"{variant.label} not tried: {left_s:.0f} s of the budget for variants were left, "
        f"a run takes about {typical_s:.1f} s here"
    )
    return PhaseNote("variants", why)


def _choice_with_variants(
    tuned: Sequence[RunRecord],
    quality: KvQuality | None,
    tried: _Variants,
    goal: Goal,
    kld_budget: float,
    baseline: RunRecord | None,
) -> Choice:
    """The goal's pick among the tuned file's runs and the variants', each at its quality;
    llama.cpp's defaults (`baseline`) kept when the pick's gain over them is noise."""
    by_model = {variant.model: variant.quality for variant in tried.variants}

    def run_quality(run: RunRecord) -> RunQuality:
        return by_model.get(run.key.model) or _run_quality(quality, run)

    return choose([*tuned, *tried.runs], run_quality, goal, kld_budget, baseline)


def _defaults_over_batch_only(
    choice: Choice, baseline: RunRecord | None, goal: Goal, uses_swa: bool
) -> Choice:
    """For a goal that ranks by decode alone, llama.cpp's defaults instead of a pick that
    differs from them only in what one-token steps do not use (`decode_alike`): its lead can
    only be noise, and no gain is claimed for it. On a Zen 4 EPYC the Llama-3.1-8B-shaped
    model's tune picked batch 512 over the defaults' 2048 this way, and the MoE's did too
    (natively 0.94x the defaults)."""
    best = choice.best
    if (
        best is None
        or baseline is None
        or goal not in DECODE_ONLY_GOALS
        or best.key.model != baseline.key.model
        or not decode_alike(best, baseline, uses_swa)
    ):
        return choice
    return replace(choice, best=baseline)


def _file_of(best: RunRecord | None, variants: Sequence[VariantRun], model_path: Path) -> Path:
    """The file the winning run loaded: a variant's, or the tuned one."""
    chosen = next((v for v in variants if best is not None and v.model == best.key.model), None)
    return Path(chosen.path) if chosen is not None else model_path


@dataclass(frozen=True)
class _Measured:
    runs: list[RunRecord]
    notes: list[PhaseNote]
    typical_s: float = 0.0  # how long a measured candidate took (0: all answered from the DB)
    reached: int = 0  # how many of the queue were started (or answered from the DB)


def _measure_candidates(
    db: WisdomDB,
    key: TuningKey,
    queue: Sequence[EngineConfig],
    predictions: Sequence[SpeedEstimate | None],
    rigor: Rigor,
    planned: Plan,
    clock: TuneClock,
    notify: Listener,
    stop: threading.Event,
    load: EngineLoader = WorkerEngine,
) -> _Measured:
    """The queue in order until the candidates' deadline: llama-cpp-python's defaults (with
    half the time before speculation's deadline) and the planner's pick (until the end)
    always, the others while one more as long as the typical one so far still fits. Those
    left are announced as not measured."""
    runs: list[RunRecord] = []
    durations: list[float] = []
    for index, config in enumerate(queue, start=1):
        typical_s = statistics.median(durations) if durations else 0.0
        if stop.is_set():
            _announce_unmeasured(queue, predictions, index, notify, "measuring was stopped")
            return _Measured(runs, [], typical_s, index - 1)
        always = index <= 2
        deadline = _deadline(index, clock)
        if not always and clock.now() + typical_s > deadline:
            share = clock.candidates_end - clock.started
            why = (
                f"tried {index - 1} of {len(queue)}: the {max(share, 0):.0f} s of the "
                f"budget for candidates ran out (one takes about {typical_s:.1f} s here)"
            )
            _announce_unmeasured(queue, predictions, index, notify, "the time budget ran out")
            return _Measured(runs, [PhaseNote("candidates", why)], typical_s, index - 1)
        started = clock.now()
        watchdog = Watchdog(deadline + clock.grace_s)
        predicted = predictions[index - 1]
        total = len(queue)
        run = _try(db, key, config, rigor, planned, predicted, index, total, notify, watchdog, load)
        if run is not None:
            runs.append(run)
            if clock.now() - started > 0.5:  # measured now, not answered from the DB
                durations.append(clock.now() - started)
    typical_s = statistics.median(durations) if durations else 0.0
    return _Measured(runs, [], typical_s, len(queue))


def needs_confirmation(
    best: RunRecord, baseline: RunRecord, key: TuningKey, *, uses_swa: bool = True
) -> bool:
    """Whether the pick's gain over llama.cpp's defaults must be measured again, both back to
    back, before the verdict claims it."""
    return bool(confirmation_reason(best, baseline, key, uses_swa=uses_swa))


def confirmation_reason(
    best: RunRecord, baseline: RunRecord, key: TuningKey, *, uses_swa: bool = True
) -> str:
    """Why a gain the verdict would claim may be the noise of two runs taken minutes apart,
    in words that go before ", so it may be noise"; "" when it may not. `uses_swa`: the model
    has sliding-window layers, so `swa_full` changes its cache."""
    if best.key.model != key.model or config_key(best.config) == config_key(baseline.config):
        return ""  # a quant variant's gain is its file's; the defaults are the pick
    ratio = _ratio(best, baseline)
    if ratio is None or ratio < SAME_SPEED_BAND[1]:
        return ""  # no gain is claimed
    if decode_alike(best, baseline, uses_swa):
        return ""  # they decode alike: no gain is claimed (`TuneResult.speedup`)
    spread = max(best.repeat_spread or 0.0, baseline.repeat_spread or 0.0)
    if spread >= ratio - 1:
        return f"their repetitions varied by up to {spread:.0%}, as much as the gain"
    return "the gain is small" if ratio < CONFIRM_BELOW else ""


def decode_alike(best: RunRecord, baseline: RunRecord, uses_swa: bool) -> bool:
    """Whether two different configs load the same engine for one-token steps: they differ
    only in batch settings (or, on a model without a window, `swa_full`), so a decode gain
    between them can only be noise."""
    if config_key(best.config) == config_key(baseline.config):
        return False
    return decode_settings(best.config, uses_swa) == decode_settings(baseline.config, uses_swa)


def decode_settings(config: dict[str, Any], uses_swa: bool) -> str:
    """A key for what a config decodes with: the same for two configs that load the same
    engine for one-token steps, whether threads are left to the default or named."""
    ignored = DECODE_NEUTRAL if uses_swa else DECODE_NEUTRAL + SWA_ONLY
    settings = {k: v for k, v in config.items() if k not in ignored}
    settings["n_threads"] = settings.get("n_threads") or physical_core_count()
    return config_key(settings)


def _confirm(
    key: TuningKey,
    model_path: Path,
    pair: tuple[RunRecord, RunRecord],
    rigor: Rigor,
    clock: TuneClock,
    cost_s: float,
    notify: Listener,
    load: EngineLoader = WorkerEngine,
) -> tuple[RunRecord, RunRecord] | None:
    """`pair`, llama.cpp's defaults and the pick, measured again one right after the other, from
    the time before speculation's deadline; None when that time does not hold both or a run
    did not finish. Not stored: the first runs stay the record of these settings."""
    deadline = clock.speculation_end
    if clock.now() + CONFIRM_RUNS * cost_s > deadline:
        return None
    again: list[RunRecord] = []
    for run in pair:
        settings = EngineConfig.from_dict({**run.config, "model_path": str(model_path)})
        notify(
            TuneEvent(
                "confirm",
                0,
                0,
                run.config,
                message="measured again back to back, to confirm the gain",
            )
        )
        measured = _measure(key, settings, rigor, None, Watchdog(deadline + clock.grace_s), load)
        if measured.outcome != "ok" or not measured.decode_tps:
            return None
        again.append(measured)
    return again[0], again[1]


def _announce_unmeasured(
    queue: Sequence[EngineConfig],
    predictions: Sequence[SpeedEstimate | None],
    first: int,
    notify: Listener,
    why: str,
) -> None:
    """Each candidate from the 1-based `first` on as not measured, with its prediction."""
    for index in range(first, len(queue) + 1):
        speed = predictions[index - 1]
        predicted = speed.decode_tps if speed is not None else None
        settings = queue[index - 1].to_dict()
        message = f"not measured: {why}"
        notify(TuneEvent("unmeasured", index, len(queue), settings, predicted, message=message))


def _not_measured(
    queue: Sequence[EngineConfig],
    predictions: Sequence[SpeedEstimate | None],
    roles: Sequence[Baseline],
    measured: _Measured,
) -> tuple[NotMeasured, ...]:
    """The candidates cut off: stopped at their deadline (a `timeout` run) or never started."""
    timed_out = {config_key(run.config) for run in measured.runs if run.outcome == "timeout"}
    cut = []
    for position, config in enumerate(queue):
        settings = config.to_dict()
        started = config_key(settings) in timed_out
        if started or position >= measured.reached:
            speed = predictions[position]
            predicted = speed.decode_tps if speed is not None else None
            cut.append(NotMeasured(settings, predicted, roles[position], started))
    return tuple(cut)


def _no_winner_notes(speculation: bool) -> list[PhaseNote]:
    why = "not run: no tuned setting was measured within the budget"
    notes = [PhaseNote("speculation", why)] if speculation else []
    return [*notes, PhaseNote("audit", why)]


def _deadline(index: int, clock: TuneClock) -> float:
    if index == 1:  # the defaults: the comparison, less use than the pick if time is short
        return (clock.now() + clock.speculation_end) / 2
    return clock.end if index == 2 else clock.candidates_end


def _speculation_notes(
    decisions: Sequence[SpeculationDecision], clock: TuneClock
) -> list[PhaseNote]:
    unmeasured = [d.workload for d in decisions if d.reference_decode_tps is None]
    if not unmeasured:
        return []
    share = clock.speculation_end - clock.variants_end
    return [
        PhaseNote(
            "speculation",
            f"not measured for {', '.join(unmeasured)}: the {max(share, 0):.0f} s of the "
            "budget for speculative decoding ran out, or its trials failed (see each reason)",
        )
    ]


def save_tuned_defaults(db: WisdomDB, result: TuneResult) -> bool:
    """What `tune(save_default=True)` saves, for a caller that tuned with False (the wizard,
    on Apply). False when there was no winner to save, or other programs were busy."""
    if result.best is None or result.busy is not None:
        return False
    _save_all(db, result.key, result.best, result.file_best, result.goal, result.speculation)
    return True


def _save_all(
    db: WisdomDB,
    key: TuningKey,
    best: RunRecord,
    file_best: RunRecord | None,
    goal: Goal,
    decisions: Sequence[SpeculationDecision],
) -> None:
    """The winner as its own file's default; when a variant won, the tuned file (`key`)
    keeps its own pick as its default, so loading either file gets tuned settings."""
    _save_defaults(db, best.key, best, goal, decisions)
    if file_best is not None and best.key != key:
        _save_defaults(db, key, file_best, goal, ())


def _save_defaults(
    db: WisdomDB,
    key: TuningKey,
    best: RunRecord,
    goal: Goal,
    decisions: Sequence[SpeculationDecision],
) -> None:
    """The winner as the model's default (with the chat workload's speculation), and each
    workload's speculative choice as that workload's default."""
    chat = next((d.chosen for d in decisions if d.workload == "chat"), None)
    speculative = asdict(chat) if chat is not None else best.config.get("speculative")
    db.set_default(key, {**best.config, "speculative": speculative}, goal, run_id=best.id)
    save_speculation_defaults(db, key, best.config, goal, decisions)


def save_speculation_defaults(
    db: WisdomDB,
    key: TuningKey,
    config: dict[str, Any],
    goal: Goal,
    decisions: Sequence[SpeculationDecision],
) -> None:
    """Each workload's speculative choice on `config` as that workload's default."""
    for decision in decisions:
        workload_config = {**config, "speculative": asdict(decision.chosen)}
        db.set_default(speculative_key(key, decision.workload), workload_config, goal)


def _audit(
    db: WisdomDB,
    key: TuningKey,
    model_path: Path,
    best: RunRecord,
    clock: TuneClock,
    load: EngineLoader = WorkerEngine,
) -> tuple[CapacityAudit | None, PhaseNote | None]:
    """Check the winner's context really holds what it promises, in what is left of the
    budget, and record it; a note when the check was cut short or could not run."""
    left_s = clock.left_s()
    if left_s < MIN_AUDIT_S:
        why = (
            f"not run: {max(left_s, 0):.1f} s of the budget were left, the context check "
            f"needs at least {MIN_AUDIT_S:.1f} s"
        )
        return None, PhaseNote("audit", why)
    config = EngineConfig.from_dict({**best.config, "model_path": str(model_path)})
    watchdog = Watchdog(clock.end + clock.grace_s)
    try:
        engine = load(config)
    except EngineError as exc:
        return None, PhaseNote("audit", f"not run: the winner did not load again ({exc.message})")
    try:
        with watchdog.watching(engine.pid):
            audit = engine.run(audit_context_within, max(0.0, clock.left_s()))
    except EngineError as exc:
        why = "it ran past the budget" if watchdog.fired else exc.message
        return None, PhaseNote("audit", f"not finished: {why}")
    finally:
        engine.close()
    db.record_audit(key, best.config, audit.to_dict())
    return audit, None if audit.complete else PhaseNote("audit", f"shortened: {audit.message}")


def predicted_speeds(
    spec: ModelSpec,
    profile: HardwareProfile,
    configs: Sequence[EngineConfig],
    calibration: dict[str, float],
) -> list[SpeedEstimate | None]:
    """The planner's prediction for each config as it is (its threads, context, batch), the
    figure its run is compared with: the wizard's predicted bars. None for a config the
    planner cannot size (one naming a device this machine lacks): it is measured all the
    same."""
    pieces = pieces_from_spec(spec)  # once: sizing each config from the spec is slow
    return [_predicted(spec, profile, config, calibration, pieces) for config in configs]


def _predicted(
    spec: ModelSpec,
    profile: HardwareProfile,
    config: EngineConfig,
    calibration: dict[str, float],
    pieces: Sequence[WeightPiece],
) -> SpeedEstimate | None:
    try:
        return evaluate_config(spec, profile, config, calibration, pieces=pieces).speed
    except (LookupError, ValueError, ArithmeticError):
        return None


def _try(
    db: WisdomDB,
    key: TuningKey,
    config: EngineConfig,
    rigor: Rigor,
    planned: Plan | None,  # None: not the planner's model, so nothing to learn from
    speed: SpeedEstimate | None,
    index: int,
    total: int,
    notify: Listener,
    watchdog: Watchdog,
    load: EngineLoader = WorkerEngine,
) -> RunRecord | None:
    settings = config.to_dict()
    predicted = speed.decode_tps if speed is not None else None
    if (failure := _known_failure(db, key, settings)) is not None:
        notify(
            TuneEvent(
                "skipped",
                index,
                total,
                settings,
                predicted,
                message=f"failed before ({failure.outcome}); not retried",
                outcome=failure.outcome,
            )
        )
        return None
    known = db.lookup(key, settings, rigor)
    if known is not None and not disturbed(known):  # a disturbed one is measured again
        notify(
            TuneEvent(
                "reused",
                index,
                total,
                settings,
                predicted,
                known.decode_tps,
                known.prefill_tps,
                "measured before",
                memory_bytes=known.allocated_bytes,
            )
        )
        return known
    notify(TuneEvent("start", index, total, settings, predicted))
    run = db.record_run(_measure(key, config, rigor, speed, watchdog, load))
    if run.outcome == "ok":
        # its prediction's, and only when undisturbed: a busy machine teaches a wrong factor
        if planned is not None and _same(settings, planned.config) and not disturbed(run):
            _learn(db, key, run, planned)
        notify(
            TuneEvent(
                "measured",
                index,
                total,
                settings,
                predicted,
                run.decode_tps,
                run.prefill_tps,
                disturbed_note(run),
                memory_bytes=run.allocated_bytes,
            )
        )
    else:  # a run stopped at its deadline is not measured, not failed
        kind: EventKind = "unmeasured" if run.outcome == "timeout" else "failed"
        message = f"not measured: {run.error}" if run.outcome == "timeout" else run.error
        outcome = "" if run.outcome == "timeout" else run.outcome
        notify(
            TuneEvent(
                kind, index, total, settings, predicted, message=message or "", outcome=outcome
            )
        )
    return run


def _known_failure(db: WisdomDB, key: TuningKey, settings: dict[str, Any]) -> RunRecord | None:
    """A failure not to repeat. A timeout is not one: it says the budget was short, not that
    the settings fail, so a later run (with its own budget) measures them again; nor is an
    out-of-memory load once much more memory is free than it had."""
    failure = db.known_failure(key, settings)
    if failure is None or failure.outcome == "timeout":
        return None
    had = int((failure.memory or {}).get("available_bytes") or 0)
    much_more_free = had > 0 and psutil.virtual_memory().available >= OOM_RETRY_FREE_RATIO * had
    return None if failure.outcome == "oom" and much_more_free else failure


def _measure(
    key: TuningKey,
    config: EngineConfig,
    rigor: Rigor,
    speed: SpeedEstimate | None,
    watchdog: Watchdog,
    load: EngineLoader = WorkerEngine,
) -> RunRecord:
    """llama-bench style runs of `config`; `timeout` when `watchdog` had to stop them."""
    settings = config.to_dict()
    limit_s = watchdog.limit_s()
    started = time.monotonic()
    prediction = (
        {"decode_tps": speed.decode_tps, "prefill_tps": speed.prefill_tps}
        if speed is not None
        else None
    )
    try:
        engine = load(config)
    except EngineError as exc:
        kind = _failure_kind(exc)
        # what was free then: a later run tries it again when much more is (`_known_failure`)
        free = {"available_bytes": psutil.virtual_memory().available} if kind == "oom" else None
        return RunRecord(
            key, settings, rigor, kind, memory=free, predicted=prediction, error=exc.message
        )
    try:
        size = THOROUGH if rigor == "thorough" else QUICK
        with watchdog.watching(engine.pid):
            before = cpu_use_now()
            report = run_bench(
                engine,
                n_prompt=size.n_prompt,
                n_gen=size.n_gen,
                repetitions=size.repetitions,
                warmup_s=size.warmup_s,
            )
            others = others_cores(before, cpu_use_now())  # the worker still alive: ours
    except EngineError as exc:
        if watchdog.fired:
            why = f"not finished within the {limit_s:.1f} s the tuning budget left it"
            return RunRecord(key, settings, rigor, "timeout", predicted=prediction, error=why)
        outcome: Outcome = "crashed" if isinstance(exc, EngineCrashedError) else "failed"
        return RunRecord(key, settings, rigor, outcome, predicted=prediction, error=exc.message)
    finally:
        memory = engine.load_report.to_dict()
        engine.close()
    prefill = next(stat for stat in report.results if stat.test.startswith("pp"))
    decode = next(stat for stat in report.results if stat.test.startswith("tg"))
    return RunRecord(
        key,
        settings,
        rigor,
        "ok",
        prefill_tps=prefill.median_tok_s,
        decode_tps=decode.median_tok_s,
        ttft_s=prefill.n_tokens / prefill.median_tok_s if prefill.median_tok_s else None,
        memory=memory,
        predicted=prediction,
        repeat_spread=max(spread_of(prefill.samples_tok_s), spread_of(decode.samples_tok_s)),
        seconds=time.monotonic() - started,
        others_cores=others,
    )


def _failure_kind(exc: EngineError) -> Literal["oom", "failed", "crashed"]:
    if isinstance(exc, EngineOutOfMemoryError):  # a SIGKILL at load (the OOM killer) too
        return "oom"
    return "crashed" if isinstance(exc, EngineCrashedError) else "failed"


def _learn(db: WisdomDB, key: TuningKey, run: RunRecord, planned: Plan) -> None:
    """Measured over predicted, per kind of work, for the tier that bounded the prediction:
    from the run of the planner's own pick only (the prediction is for those settings), and
    decode against the empty-context figure, which is what llama-bench's tg measures. Against
    the prediction before the factors learned so far, which it already carries; prefill at
    the run's prompt length."""
    speed = planned.speed
    tier = speed.decode_bound_by
    predicted_decode = (speed.decode_tps_empty_context or speed.decode_tps) / speed.learned_decode
    if run.decode_tps and predicted_decode:
        db.learn_efficiency(
            key.machine, key.engine, tier, "decode", run.decode_tps / predicted_decode
        )
    # the run's prompt length: a short prompt feels the batch's once-only work more
    n_prompt = (THOROUGH if run.rigor == "thorough" else QUICK).n_prompt
    predicted_prefill = speed.prefill_tps_at(n_prompt) / speed.learned_prefill
    if run.prefill_tps and predicted_prefill:
        db.learn_efficiency(
            key.machine, key.engine, tier, "prefill", run.prefill_tps / predicted_prefill
        )


def _same(first: dict[str, Any], second: EngineConfig) -> bool:
    return config_key(first) == config_key(second.to_dict())


def _unique(configs: Iterable[EngineConfig]) -> list[EngineConfig]:
    seen: set[str] = set()
    unique = []
    for config in configs:
        marker = config_key(config.to_dict())
        if marker not in seen:
            seen.add(marker)
            unique.append(config)
    return unique


# ---- speculative decoding, measured on the winner ------------------------------------------

_TRIALS_PER_WORKLOAD = 3  # reference, probe, the cost model's pick: for progress totals


def decide_speculation(
    db: WisdomDB,
    key: TuningKey,
    model_path: Path,
    config: dict[str, Any],
    *,
    rigor: Rigor = "quick",
    deadline: float | None = None,
    grace_s: float = 0.0,
    drafts: Sequence[Path] = (),
    workloads: Sequence[Workload] | None = None,
    listener: Listener | None = None,
    cancel: threading.Event | None = None,
    first_index: int = 1,
    load: EngineLoader = WorkerEngine,
) -> tuple[SpeculationDecision, ...]:
    """For each workload, measure speculative decoding on `config` and decide (see
    autotune/speculative.py); runs are recorded under `speculative_key(key, workload)`.
    `deadline` is a `time.monotonic()` value (None: no limit): a trial starts only while one
    as long as the last still ends by it, and one still running `grace_s` after it is stopped
    and recorded as a `timeout`."""
    limit = math.inf if deadline is None else deadline
    search = _SpeculationSearch(
        db,
        key,
        model_path,
        config,
        rigor,
        listener or (lambda _event: None),
        cancel or threading.Event(),
        Watchdog(limit + grace_s),
        load,
    )
    return search.run(
        limit,
        drafts,
        workloads=tuple(workloads) if workloads is not None else load_workloads(),
        first_index=first_index,
    )


@dataclass(frozen=True)
class StoredSpeculation:
    """What the tuner chose for one workload and kept as its default, with what it measured."""

    workload: str
    title: str
    chosen: SpeculativeConfig
    gain: float | None  # decode speed over plain decode, measured side by side
    acceptance_rate: float | None


def stored_speculation(
    db: WisdomDB, key: TuningKey, workloads: Sequence[Workload] | None = None
) -> tuple[StoredSpeculation, ...]:
    """The speculative choice saved for each workload of the model `key` (none before tuning)."""
    stored = []
    for workload in workloads if workloads is not None else load_workloads():
        default = db.default_for(speculative_key(key, workload.id))
        if default is None:
            continue
        chosen = SpeculativeConfig(**(default.config.get("speculative") or {}))
        if chosen.mode == "off":
            stored.append(StoredSpeculation(workload.id, workload.title, chosen, None, None))
            continue
        where = speculative_key(key, workload.id)
        run = db.lookup(where, default.config, "quick")
        plain = db.lookup(
            where, {**default.config, "speculative": asdict(SpeculativeConfig())}, "quick"
        )
        extra = (run.predicted or {}) if run is not None else {}
        gain = extra.get("paired_gain")
        if gain is None and run and plain and run.decode_tps and plain.decode_tps:
            gain = run.decode_tps / plain.decode_tps
        stats = extra.get("speculation") or {}
        acceptance = stats.get("acceptance_rate")
        stored.append(StoredSpeculation(workload.id, workload.title, chosen, gain, acceptance))
    return tuple(stored)


class _SpeculationSearch:
    """Measures speculative settings on the winning config, workload by workload.

    Runs go to the wisdom DB under the workload's own key (`speculative_key`), so they never
    mix with the llama-bench runs of the model; failures are kept and not retried, and a run
    measured before at least as rigorously answers again. The engine loads only if something
    needs measuring.
    """

    def __init__(
        self,
        db: WisdomDB,
        key: TuningKey,
        model_path: Path,
        config: dict[str, Any],
        rigor: Rigor,
        notify: Listener,
        stop: threading.Event,
        watchdog: Watchdog,
        load: EngineLoader = WorkerEngine,
    ) -> None:
        self.db, self.key, self.model_path, self.rigor = db, key, model_path, rigor
        self.load = load
        self.notify, self.stop, self.watchdog = notify, stop, watchdog
        self._trial_s = 0.0  # how long the last measured trial took, its engine's load aside
        self._load_s = 0.0
        values = {**config, "model_path": str(model_path), "speculative": {}}
        self.config = EngineConfig.from_dict(values)
        self._plain_key = config_key({**self.config.to_dict(), "speculative": {}})
        self._workloads: tuple[Workload, ...] = ()
        self._engine: WorkerEngine | None = None
        self._verify: VerifyCost | None = None
        self._index = 0
        self._total = 0

    def run(
        self,
        deadline: float,
        drafts: Sequence[Path],
        *,
        workloads: Sequence[Workload],
        first_index: int,
    ) -> tuple[SpeculationDecision, ...]:
        self._index = first_index - 1
        self._workloads = tuple(workloads)
        self._total = self._index + _TRIALS_PER_WORKLOAD * len(workloads)
        options = [self._draft_option(path) for path in drafts]

        def out_of_time() -> bool:
            return self.stop.is_set() or time.monotonic() + self._trial_s > deadline

        try:
            return tuple(
                decide_for_workload(
                    workload,
                    self._measure,
                    verify_cost=self._verify_cost,
                    drafts=options,
                    out_of_time=out_of_time,
                )
                for workload in workloads
            )
        finally:
            self.watchdog.disarm()
            if self._engine is not None:
                self._engine.close()

    def _draft_option(self, path: Path) -> DraftOption:
        cost = relative_draft_cost(path.stat().st_size, self.model_path.stat().st_size)
        return DraftOption(str(path), cost)

    def _measure(self, speculative: SpeculativeConfig, workload: Workload) -> Trial | None:
        settings = self.config.with_changes(speculative=speculative).to_dict()
        key = speculative_key(self.key, workload.id)
        self._index += 1
        self._total = max(self._total, self._index)
        event = partial(
            TuneEvent,
            index=self._index,
            total=self._total,
            config=settings,
            workload=workload.id,
        )
        what = f"{workload.title}: {describe(speculative)}"
        if (failure := _known_failure(self.db, key, settings)) is not None:
            self.notify(event("skipped", message=f"{what} failed before ({failure.outcome})"))
            return None
        if (known := self.db.lookup(key, settings, self.rigor)) is not None:
            self.notify(event("reused", decode_tps=known.decode_tps, message=what))
            return self._trial(known, speculative)
        self.notify(event("start", message=what))
        started, loads = time.monotonic(), self._engine is None
        run = self.db.record_run(self._measured_run(key, settings, speculative, workload))
        self._trial_s = time.monotonic() - started - (self._load_s if loads else 0.0)
        if run.outcome != "ok":
            self.notify(event("failed", message=f"{what}: {run.error or run.outcome}"))
            return None
        self.notify(
            event("measured", decode_tps=run.decode_tps, prefill_tps=run.prefill_tps, message=what)
        )
        return self._trial(run, speculative)

    def _measured_run(
        self,
        key: TuningKey,
        settings: dict[str, Any],
        speculative: SpeculativeConfig,
        workload: Workload,
    ) -> RunRecord:
        try:
            engine = self._loaded()
            engine.set_speculative(speculative)
            thorough = self.rigor == "thorough"
            prompts = workload.prompts if thorough else workload.prompts[:1]
            pairs = [
                _paired_runs(engine, workload, prompt)
                for _ in range(2 if thorough else 1)
                for prompt in prompts
            ]
        except EngineError as exc:
            if self.watchdog.fired:
                why = "not finished by the end of the budget for speculative decoding"
                return RunRecord(key, settings, self.rigor, "timeout", error=why)
            return RunRecord(key, settings, self.rigor, _failure_kind(exc), error=exc.message)
        metrics = [result.metrics for result, _reference in pairs]
        stats = merge_stats([m.speculative for m in metrics if m.speculative is not None])
        return RunRecord(
            key,
            settings,
            self.rigor,
            "ok",
            prefill_tps=_median([m.prompt_tok_s for m in metrics]),
            decode_tps=_median([m.decode_tok_s for m in metrics]),
            ttft_s=_median([m.ttft_s for m in metrics]),
            predicted={
                "speculation": stats.to_dict() if stats else None,
                "paired_gain": _paired_gain(pairs),
                "verify_cost": self._verify.to_dict() if self._verify else None,
            },
        )

    def _trial(self, run: RunRecord, speculative: SpeculativeConfig) -> Trial | None:
        if not run.decode_tps:
            return None
        extra = run.predicted or {}
        if self._verify is None and extra.get("verify_cost"):
            self._verify = _stored_cost(extra["verify_cost"])
        stats = extra.get("speculation")
        return Trial(
            speculative,
            run.decode_tps,
            SpeculationStats(**stats) if stats else None,
            gain=extra.get("paired_gain"),
        )

    def _stored_verify_cost(self) -> VerifyCost | None:
        """The verify cost an earlier search measured with these settings: measuring it again
        would give other figures (noise), another best k, and a needless measurement."""
        for workload in self._workloads:
            for run in self.db.runs(speculative_key(self.key, workload.id), outcome="ok"):
                stored = (run.predicted or {}).get("verify_cost")
                if stored and config_key({**run.config, "speculative": {}}) == self._plain_key:
                    return _stored_cost(stored)
        return None

    def _loaded(self) -> WorkerEngine:
        if self._engine is None:
            started = time.monotonic()
            self._engine = self.load(self.config)
            self.watchdog.arm(self._engine.pid)
            _warm_up_engine(self._engine)
            self._load_s = time.monotonic() - started
        return self._engine

    def _verify_cost(self) -> VerifyCost:
        if self._verify is None:
            self._verify = self._stored_verify_cost()
        if self._verify is None:
            try:
                engine = self._loaded()
                engine.set_speculative(SpeculativeConfig())
                timings = engine.run(measure_verify_cost)
            except EngineError:  # out of time, or the engine failed: its trials say which
                return VerifyCost()
            single = timings[0][1]
            self._verify = VerifyCost(tuple((n, seconds / single) for n, seconds in timings))
        return self._verify


def _stored_cost(stored: dict[str, Any]) -> VerifyCost:
    return VerifyCost(tuple((int(n), float(t)) for n, t in stored["points"]))


def _run_workload_prompt(
    engine: WorkerEngine, workload: Workload, prompt: WorkloadPrompt
) -> GenerationResult:
    sampling = SamplingParams(
        temperature=workload.temperature, seed=workload.seed, max_tokens=workload.max_tokens
    )
    if engine.model_info.chat_template and prompt.messages:
        messages = [ChatMessage(role, content) for role, content in prompt.messages]
        return engine.chat(messages, sampling)
    return engine.generate(engine.tokenize_prompt(prompt.completion), sampling)


def _paired_runs(
    engine: WorkerEngine, workload: Workload, prompt: WorkloadPrompt
) -> tuple[GenerationResult, GenerationResult | None]:
    """The prompt with the engine's speculation and, right before it, without (when on), so
    a shared machine's slow moments hit both alike."""
    if engine.draft is None:
        return _run_workload_prompt(engine, workload, prompt), None
    with engine.speculation_paused():
        reference = _run_workload_prompt(engine, workload, prompt)
    return _run_workload_prompt(engine, workload, prompt), reference


def _paired_gain(pairs: Sequence[tuple[GenerationResult, GenerationResult | None]]) -> float | None:
    ratios = [
        result.metrics.decode_tok_s / reference.metrics.decode_tok_s
        for result, reference in pairs
        if reference is not None and result.metrics.decode_tok_s and reference.metrics.decode_tok_s
    ]
    return statistics.median(ratios) if ratios else None


def _warm_up_engine(engine: WorkerEngine) -> None:
    """Touch every weight once, so the first measured run does not pay for page faults."""
    engine.generate(engine.tokenize_prompt("Hello"), SamplingParams(temperature=0, max_tokens=8))


def _median(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None
