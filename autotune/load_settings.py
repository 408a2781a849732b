"""The settings a model loads with on this machine, and why.

What `hearthside tune` (or the wizard) measured and saved wins, as long as it still fits the
context asked for; otherwise the planner's estimate for this machine; llama-cpp-python's bare
defaults only when neither can be had (the hardware probe failed, or nothing fits). Those
defaults keep every layer on the CPU, so on a GPU machine loading without a plan is slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.fingerprint import tuning_key
from hearthside.autotune.planner import evaluate_config, plan
from hearthside.autotune.wisdom import ModelDefault, WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.spec import ModelSpec, spec_from_gguf
from hearthside.core.probe.profile import HardwareProfile

Source = Literal["tuned", "planned", "engine defaults"]


@dataclass(frozen=True)
class LoadSettings:
    config: EngineConfig
    source: Source
    why: str  # one sentence for the status line and the terminal


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
    return LoadSettings(chosen.config.with_changes(**overrides), chosen.source, chosen.why)


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
    calibration = calibration_for(profile, wisdom)
    saved = wisdom.default_for(tuning_key(profile, model_path))
    tuned = _tuned(saved, model_path, n_ctx) if saved is not None else None
    if tuned is not None and evaluate_config(spec, profile, tuned, calibration).fits:
        day = saved.updated_at[:10] if saved is not None else ""
        return LoadSettings(tuned, "tuned", f"Settings measured on this machine ({day}).")
    return _planned(spec, profile, calibration, bare, tuned_did_not_fit=tuned is not None)


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
    *,
    tuned_did_not_fit: bool,
) -> LoadSettings:
    result = plan(spec, profile, n_ctx=bare.n_ctx, calibration=calibration)
    if not (result.fits or result.streams_from_disk):
        advice = result.advice[0] if result.advice else "Nothing fits in memory."
        return LoadSettings(bare, "engine defaults", advice)
    config = result.config.with_changes(model_path=bare.model_path)
    why = "Planned for this machine, not measured yet (`hearthside tune` or Optimize… measures it)."
    if tuned_did_not_fit:
        why = f"The measured settings do not fit a {bare.n_ctx}-token context; planned instead."
    return LoadSettings(config, "planned", why)
