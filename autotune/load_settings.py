"""The settings a model loads with on this machine, and why.

What `hearthside tune` (or the wizard) measured and saved wins, as long as it still fits the
context asked for; otherwise the planner's estimate for this machine; llama-cpp-python's bare
defaults only when neither can be had (the hardware probe failed, or the model cannot be
sized). Those defaults keep every layer on the CPU, so on a GPU machine loading without a plan
is slow. A context longer than the model was trained on is capped; when the plan for the
context asked for does not fit the memory this process may use, the load backs off to fewer
parallel requests, a shorter context, a quantized KV cache or smaller batches
(autotune/backoff.py) and says so.

Parallel requests (slots): a number asked for (`hearthside serve --parallel`, the window's
setting) wins where it fits; otherwise the planner's rule decides (autotune/planner.py: up to
DEFAULT_PARALLEL where they fit beside everything else). Tuning measures one slot, so a tuned
config gets its slots here, by the same rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hearthside.autotune.backoff import (
    describe_backoff,
    describe_cap,
    describe_nothing_fits,
    first_usable,
    free_margin,
    is_backed_off,
    plans_backing_off,
    slot_steps,
    trained_context,
)
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.planner import DEFAULT_PARALLEL, evaluate_config
from hearthside.autotune.wisdom import ModelDefault, WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile

Source = Literal["tuned", "planned", "engine defaults"]
PLANNED_WHY = "Planned for this machine, not measured yet (Optimize for my hardware measures it)."


@dataclass(frozen=True)
class LoadSettings:
    config: EngineConfig
    source: Source
    why: str  # a sentence or two for the status line and the terminal
    # less than asked: a shorter context (capped, or to fit), a quantized KV cache, smaller batches
    backed_off: bool = False


def choose_load_settings(
    model_path: Path,
    profile: HardwareProfile,
    wisdom: WisdomDB,
    *,
    n_ctx: int,
    n_threads: int | None = None,
    n_threads_batch: int | None = None,
    n_parallel: int | None = None,
) -> LoadSettings:
    """Settings for `model_path` with an `n_ctx` context per request; threads the user set
    win, and so do `n_parallel` slots where they fit (None: the planner's choice)."""
    chosen = _choose(model_path, profile, wisdom, n_ctx, n_parallel)
    threads = {"n_threads": n_threads, "n_threads_batch": n_threads_batch}
    overrides = {name: value for name, value in threads.items() if value is not None}
    if not overrides:
        return chosen
    return replace(chosen, config=chosen.config.with_changes(**overrides))


def _choose(
    model_path: Path, profile: HardwareProfile, wisdom: WisdomDB, n_ctx: int, slots: int | None
) -> LoadSettings:
    bare = EngineConfig(model_path=str(model_path), n_ctx=n_ctx, n_parallel=slots or 1)
    if profile.memory.total_bytes is None:
        return LoadSettings(bare, "engine defaults", "The hardware probe failed, so no plan.")
    try:
        spec = spec_from_gguf(model_path)
    except (HearthsideError, OSError, ValueError) as exc:
        return LoadSettings(bare, "engine defaults", f"The model could not be sized ({exc}).")
    context = trained_context(spec, n_ctx)
    chosen = _measured_or_planned(spec, profile, wisdom, bare.with_changes(n_ctx=context), slots)
    if context == n_ctx:
        return chosen
    return replace(chosen, why=f"{describe_cap(n_ctx, context)} {chosen.why}", backed_off=True)


def _measured_or_planned(
    spec: ModelSpec,
    profile: HardwareProfile,
    wisdom: WisdomDB,
    bare: EngineConfig,
    slots: int | None,
) -> LoadSettings:
    model_path = Path(bare.model_path)
    margin = free_margin(profile.memory)
    calibration = calibration_for(profile, wisdom)
    saved = wisdom.default_for(tuning_key(profile, model_path))
    tuned = _tuned(saved, model_path, bare.n_ctx) if saved is not None else None
    if tuned is not None and evaluate_config(spec, profile, tuned, calibration, margin).fits:
        day = saved.updated_at[:10] if saved is not None else ""
        why = f"Settings measured on this machine ({day})."

        def fits(config: EngineConfig) -> bool:
            return evaluate_config(spec, profile, config, calibration, margin).fits

        return _tuned_with_slots(tuned, slots, fits, why, profile, margin)
    return _planned(
        spec, profile, calibration, bare, margin, slots, tuned_did_not_fit=tuned is not None
    )


def _tuned(saved: ModelDefault, model_path: Path, n_ctx: int) -> EngineConfig | None:
    """The saved config at `n_ctx` with one slot, as it was measured; tuned for the longest
    context, at the longer of the two (that is what the goal was for)."""
    if saved.goal == "longest-context":
        n_ctx = max(n_ctx, int(saved.config.get("n_ctx") or n_ctx))
    values: dict[str, Any] = {
        **saved.config,
        "model_path": str(model_path),
        "n_ctx": n_ctx,
        "n_parallel": 1,
    }
    values["speculative"] = values.get("speculative") or {}
    try:
        return EngineConfig.from_dict(values)
    except (HearthsideError, TypeError, ValueError):
        return None  # saved by another version: plan afresh rather than fail the load


def _tuned_with_slots(
    tuned: EngineConfig,
    slots: int | None,
    fits: Callable[[EngineConfig], bool],
    why: str,
    profile: HardwareProfile,
    margin: int,
) -> LoadSettings:
    """The measured settings (which fit with one slot) with the slots asked for — halved
    until they fit — or, unasked, the most up to DEFAULT_PARALLEL that fit beside them.
    Measured speculation stays on: it runs while one request is generating alone
    (core/engine/batch.py)."""
    tries = slot_steps(slots) if slots is not None else list(range(DEFAULT_PARALLEL, 1, -1))
    config = next(
        (c for n in tries if fits(c := tuned.with_changes(n_parallel=n))),
        tuned,
    )
    if slots is None or config.n_parallel == slots:
        return LoadSettings(config, "tuned", why)
    backoff = describe_backoff(tuned.n_ctx, config, profile.memory, margin, slots)
    return LoadSettings(config, "tuned", f"{why} {backoff}", backed_off=True)


def _planned(
    spec: ModelSpec,
    profile: HardwareProfile,
    calibration: dict[str, float],
    bare: EngineConfig,
    margin: int,
    slots: int | None,
    *,
    tuned_did_not_fit: bool,
) -> LoadSettings:
    plans = plans_backing_off(spec, profile, calibration, bare.n_ctx, margin, slots)
    usable, last = first_usable(plans, bare.n_ctx)
    if usable is not None and not is_backed_off(usable.config, bare.n_ctx, slots):
        why = PLANNED_WHY
        if tuned_did_not_fit:
            why = f"The measured settings do not fit a {bare.n_ctx}-token context; planned instead."
        return LoadSettings(_for_file(usable.config, bare), "planned", why)
    if usable is not None:
        config = _for_file(usable.config, bare)
        why = describe_backoff(bare.n_ctx, config, profile.memory, margin, slots or 1)
        return LoadSettings(config, "planned", why, backed_off=True)
    assert last is not None  # the back-off always plans at least once
    closest = _for_file(last.config, bare)  # better odds than the size asked for
    why = describe_nothing_fits(closest, profile.memory, margin)
    return LoadSettings(closest, "planned", why, backed_off=True)


def _for_file(planned: EngineConfig, bare: EngineConfig) -> EngineConfig:
    return planned.with_changes(model_path=bare.model_path)
