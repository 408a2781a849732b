"""The settings a model loads with on this machine, and why.

What `hearthside tune` (or the wizard) measured and saved wins, as long as it still fits the
context asked for; otherwise the planner's estimate for this machine; llama-cpp-python's bare
defaults only when neither can be had (the hardware probe failed, or the model cannot be
sized). Those defaults keep every layer on the CPU, so on a GPU machine loading without a plan
is slow. A context longer than the model was trained on is capped; when the plan for the
context asked for does not fit the memory this process may use, the load backs off to a
shorter context, a quantized KV cache or smaller batches (autotune/backoff.py) and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from hearthside.autotune.backoff import (
    describe_backoff,
    describe_cap,
    describe_nothing_fits,
    first_fitting,
    free_margin,
    plans_backing_off,
    trained_context,
)
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.planner import evaluate_config
from hearthside.autotune.wisdom import ModelDefault, WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile

Source = Literal["tuned", "planned", "engine defaults"]
PLANNED_WHY = (
    "Planned for this machine, not measured yet (`hearthside tune` or Optimize… measures it)."
)


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
) -> LoadSettings:
    """Settings for `model_path` with an `n_ctx` context; threads the user set win."""
    chosen = _choose(model_path, profile, wisdom, n_ctx)
    threads = {"n_threads": n_threads, "n_threads_batch": n_threads_batch}
    overrides = {name: value for name, value in threads.items() if value is not None}
    if not overrides:
        return chosen
    return replace(chosen, config=chosen.config.with_changes(**overrides))


def _choose(
    model_path: Path, profile: HardwareProfile, wisdom: WisdomDB, n_ctx: int
) -> LoadSettings:
    bare = EngineConfig(model_path=str(model_path), n_ctx=n_ctx)
    if profile.memory.total_bytes is None:
        return LoadSettings(bare, "engine defaults", "The hardware probe failed, so no plan.")
    try:
        spec = spec_from_gguf(model_path)
    except (HearthsideError, OSError, ValueError) as exc:
        return LoadSettings(bare, "engine defaults", f"The model could not be sized ({exc}).")
    context = trained_context(spec, n_ctx)
    chosen = _measured_or_planned(spec, profile, wisdom, bare.with_changes(n_ctx=context))
    if context == n_ctx:
        return chosen
    return replace(chosen, why=f"{describe_cap(n_ctx, context)} {chosen.why}", backed_off=True)


def _measured_or_planned(
    spec: ModelSpec, profile: HardwareProfile, wisdom: WisdomDB, bare: EngineConfig
) -> LoadSettings:
    model_path = Path(bare.model_path)
    margin = free_margin(profile.memory)
    calibration = calibration_for(profile, wisdom)
    saved = wisdom.default_for(tuning_key(profile, model_path))
    tuned = _tuned(saved, model_path, bare.n_ctx) if saved is not None else None
    if tuned is not None and evaluate_config(spec, profile, tuned, calibration, margin).fits:
        day = saved.updated_at[:10] if saved is not None else ""
        return LoadSettings(tuned, "tuned", f"Settings measured on this machine ({day}).")
    return _planned(spec, profile, calibration, bare, margin, tuned_did_not_fit=tuned is not None)


def _tuned(saved: ModelDefault, model_path: Path, n_ctx: int) -> EngineConfig | None:
    values: dict[str, Any] = {**saved.config, "model_path": str(model_path), "n_ctx": n_ctx}
    values["speculative"] = values.get("speculative") or {}
    try:
        return EngineConfig.from_dict(values)
    except (HearthsideError, TypeError, ValueError):
        return None  # saved by another version: plan afresh rather than fail the load


def _planned(
    spec: ModelSpec,
    profile: HardwareProfile,
    calibration: dict[str, float],
    bare: EngineConfig,
    margin: int,
    *,
    tuned_did_not_fit: bool,
) -> LoadSettings:
    plans = plans_backing_off(spec, profile, calibration, bare.n_ctx, margin)
    asked = next(plans)
    if asked.fits or asked.streams_from_disk:
        why = PLANNED_WHY
        if tuned_did_not_fit:
            why = f"The measured settings do not fit a {bare.n_ctx}-token context; planned instead."
        return LoadSettings(_for_file(asked.config, bare), "planned", why)
    fitting, last = first_fitting(plans)
    if fitting is not None:
        config = _for_file(fitting.config, bare)
        why = describe_backoff(bare.n_ctx, config, profile.memory, margin)
        return LoadSettings(config, "planned", why, backed_off=True)
    closest = _for_file((last or asked).config, bare)  # better odds than the size asked for
    why = describe_nothing_fits(closest, profile.memory, margin)
    return LoadSettings(closest, "planned", why, backed_off=True)


def _for_file(planned: EngineConfig, bare: EngineConfig) -> EngineConfig:
    return planned.with_changes(model_path=bare.model_path)
