"""The tuner: measure the most promising settings with the real engine, remember everything.

For a model file on this machine it starts from the planner's pick, varies what the planner
cannot predict well on a CPU (decode threads, flash attention, the physical batch, the KV
type), and measures each candidate llama-bench style (timed warm-up, median of repetitions).
Every result — out-of-memory and failures included — goes into the autotune DB with its
rigor; a configuration that already failed is never tried again, and one already measured at
least as rigorously is answered from the DB. Measured over predicted speed updates the
machine's efficiency factors, and the winner becomes the model's default on this machine.
Progress goes to a listener (the CLI's progress line, the GUI wizard's chart).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.capacity import CapacityAudit, audit_context
from hearthside.autotune.fingerprint import TuningKey, machine_identity, tuning_key
from hearthside.autotune.planner import Goal, Plan, plan
from hearthside.autotune.recipes import sync_recipes
from hearthside.autotune.wisdom import Rigor, RunRecord, WisdomDB, config_key
from hearthside.core.engine.bench import run_bench
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine
from hearthside.core.errors import EngineError, EngineLoadError
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile

EventKind = Literal["start", "measured", "reused", "skipped", "failed", "done"]


# A quick measurement: enough tokens to be stable on a small model, short enough for a wizard.
@dataclass(frozen=True)
class BenchSize:
    n_prompt: int
    n_gen: int
    repetitions: int
    warmup_s: float


QUICK = BenchSize(n_prompt=128, n_gen=32, repetitions=3, warmup_s=0.3)
THOROUGH = BenchSize(n_prompt=512, n_gen=128, repetitions=5, warmup_s=1.0)
TUNING_CONTEXT = 2048


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


Listener = Callable[[TuneEvent], None]


@dataclass(frozen=True)
class TuneResult:
    key: TuningKey
    goal: Goal
    best: RunRecord | None
    baseline: RunRecord | None  # llama-cpp-python's defaults, measured the same way
    runs: tuple[RunRecord, ...]
    plan: Plan
    audit: CapacityAudit | None = None  # of the winner's context

    @property
    def speedup(self) -> float | None:
        """The winner's decode speed over the defaults'."""
        if not (self.best and self.baseline and self.best.decode_tps and self.baseline.decode_tps):
            return None
        return self.best.decode_tps / self.baseline.decode_tps


def llama_cpp_python_defaults(model_path: str) -> EngineConfig:
    """What `Llama(model_path)` uses when nothing is set (FIELD_NOTES): 512 context,
    cpu_count // 2 threads for both phases, no flash attention, f16 KV."""
    threads = max(1, (os.cpu_count() or 2) // 2)
    return EngineConfig(
        model_path, n_ctx=512, n_threads=threads, n_threads_batch=threads, flash_attn=False
    )


def candidates(base: EngineConfig, profile: HardwareProfile) -> list[EngineConfig]:
    """The planner's pick first, then one change at a time, then the promising pairs."""
    cores = profile.cpu.performance_cores or profile.cpu.physical_cores or 1
    logical = profile.cpu.logical_cores or cores
    threads = sorted({cores, max(1, cores // 2), logical}, reverse=True)
    variants = [base]
    variants += [base.with_changes(n_threads=count) for count in threads]
    variants += [_with_flash(base, not base.flash_attn)]
    variants += [
        base.with_changes(n_ubatch=size, n_batch=max(size, base.n_batch)) for size in (128, 256)
    ]
    variants += [base.with_changes(flash_attn=True, type_k="f16", type_v="f16")]
    variants += [base.with_changes(flash_attn=True, type_k="q8_0", type_v="q8_0")]
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
) -> TuneResult:
    """Measure candidates until `budget_s` runs out; store runs, efficiency and the winner."""
    notify = listener or (lambda _event: None)
    stop = cancel or threading.Event()
    owned = wisdom is None
    db = wisdom or WisdomDB()
    try:
        key = tuning_key(profile, model_path)
        db.note_machine(key.machine, machine_identity(profile))
        sync_recipes(db)
        spec = spec_from_gguf(model_path)
        calibration = calibration_for(profile, db)
        planned = plan(spec, profile, goal=goal, n_ctx=TUNING_CONTEXT, calibration=calibration)
        base = replace(planned.config, model_path=str(model_path))
        baseline_config = llama_cpp_python_defaults(str(model_path))
        queue = [baseline_config, *candidates(base, profile)]
        deadline = time.monotonic() + budget_s
        runs: list[RunRecord] = []
        for index, config in enumerate(queue, start=1):
            if stop.is_set() or (runs and time.monotonic() > deadline):
                break
            run = _try(db, key, config, rigor, planned, index, len(queue), notify)
            if run is not None:
                runs.append(run)
        baseline = next((r for r in runs if _same(r.config, baseline_config)), None)
        tuned = [r for r in runs if r is not baseline and r.outcome == "ok"]
        best = max(tuned, key=lambda run: _goal_score(run, goal), default=None)
        audit = None
        if best is not None:
            db.set_default(key, best.config, goal, run_id=best.id)
            if not stop.is_set():
                audit = _audit(db, key, model_path, best)
        notify(TuneEvent("done", len(queue), len(queue), best.config if best else {}))
        return TuneResult(key, goal, best, baseline, tuple(runs), planned, audit)
    finally:
        if owned:
            db.close()


def _audit(db: WisdomDB, key: TuningKey, model_path: Path, best: RunRecord) -> CapacityAudit:
    """Check the winner's context really holds what it promises, and record it."""
    config = EngineConfig.from_dict({**best.config, "model_path": str(model_path)})
    engine = Engine(config)
    try:
        audit = audit_context(engine)
    finally:
        engine.close()
    db.record_audit(key, best.config, audit.to_dict())
    return audit


def _try(
    db: WisdomDB,
    key: TuningKey,
    config: EngineConfig,
    rigor: Rigor,
    planned: Plan,
    index: int,
    total: int,
    notify: Listener,
) -> RunRecord | None:
    settings = config.to_dict()
    predicted = planned.speed.decode_tps
    if (failure := db.known_failure(key, settings)) is not None:
        notify(
            TuneEvent(
                "skipped",
                index,
                total,
                settings,
                predicted,
                message=f"failed before ({failure.outcome}); not retried",
            )
        )
        return None
    if (known := db.lookup(key, settings, rigor)) is not None:
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
            )
        )
        return known
    notify(TuneEvent("start", index, total, settings, predicted))
    run = db.record_run(_measure(key, config, rigor, planned))
    if run.outcome == "ok":
        _learn(db, key, run, planned)
        notify(
            TuneEvent(
                "measured", index, total, settings, predicted, run.decode_tps, run.prefill_tps
            )
        )
    else:
        notify(TuneEvent("failed", index, total, settings, predicted, message=run.error or ""))
    return run


def _measure(key: TuningKey, config: EngineConfig, rigor: Rigor, planned: Plan) -> RunRecord:
    settings = config.to_dict()
    prediction = {
        "decode_tps": planned.speed.decode_tps,
        "prefill_tps": planned.speed.prefill_tps,
    }
    try:
        engine = Engine(config)
    except EngineError as exc:
        return RunRecord(
            key, settings, rigor, _failure_kind(exc), predicted=prediction, error=exc.message
        )
    try:
        size = THOROUGH if rigor == "thorough" else QUICK
        report = run_bench(
            engine,
            n_prompt=size.n_prompt,
            n_gen=size.n_gen,
            repetitions=size.repetitions,
            warmup_s=size.warmup_s,
        )
    except EngineError as exc:
        return RunRecord(key, settings, rigor, "failed", predicted=prediction, error=str(exc))
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
    )


def _failure_kind(exc: EngineError) -> Literal["oom", "failed"]:
    text = str(exc).lower()
    if isinstance(exc, EngineLoadError) and ("alloc" in text or "memory" in text):
        return "oom"
    return "failed"


def _learn(db: WisdomDB, key: TuningKey, run: RunRecord, planned: Plan) -> None:
    """Measured over predicted, per kind of work, for the tier that bounded the prediction."""
    tier = planned.speed.decode_bound_by
    if run.decode_tps and planned.speed.decode_tps:
        db.learn_efficiency(
            key.machine, key.engine, tier, "decode", run.decode_tps / planned.speed.decode_tps
        )
    if run.prefill_tps and planned.speed.prefill_tps:
        db.learn_efficiency(
            key.machine, key.engine, tier, "prefill", run.prefill_tps / planned.speed.prefill_tps
        )


def _goal_score(run: RunRecord, goal: Goal) -> tuple[float, ...]:
    decode = run.decode_tps or 0.0
    prefill = run.prefill_tps or 0.0
    if goal == "fastest":
        return (decode, prefill)
    return (decode + prefill / 20, decode)  # balanced: a slow first token costs too


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
