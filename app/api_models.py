"""The API's models loaded on demand (core/server/model_pool.py), planned the way every load
is: `choose_load_settings` — the settings tuned on this machine, else the planner's — exactly
as `hearthside chat`, `serve` and the window choose them (app/terminal_chat.py's
`load_settings_for`, given the file the store already resolved).

The hardware is probed once, in a child process. The planner sizes a model for the whole
machine (total RAM less a margin); whether it fits *now*, beside the models already loaded,
is its estimate of system RAM against the memory available at this moment, read afresh for
each check. (GPU memory is checked against the totals only: what other models hold on a GPU
is not re-read.)
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from hearthside.autotune.backoff import LIMIT_CUSHION_SHARE, free_margin
from hearthside.autotune.load_settings import choose_load_settings
from hearthside.autotune.memory import CPU
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, Candidate, evaluate_config
from hearthside.autotune.speed_limit import SpeedLimit
from hearthside.autotune.speed_meter import SpeedMeter, limit_for_config
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.spec import spec_from_gguf
from hearthside.core.paths import models_dir
from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.profile import HardwareProfile, MemoryInfo
from hearthside.core.probe.runner import probe_hardware, probe_in_subprocess
from hearthside.core.server.model_pool import InstalledModel, OnDemandModels, installed_in_store
from hearthside.core.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadKnobs:
    """What the user set for every load (`serve --ctx/--parallel`, the window's settings)."""

    n_ctx: int = 4096
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_parallel: int | None = None  # None: the planner's choice

    @classmethod
    def from_settings(cls, settings: Settings) -> LoadKnobs:
        return cls(
            settings.context_size, settings.threads, settings.batch_threads, settings.parallel
        )


def memory_now() -> MemoryInfo:
    """This machine's memory at this moment (cgroup limits included): a fast /proc read."""
    return probe_hardware(ProbeContext(), sources=("memory",)).memory


class PlannedModelLoader:
    """`ModelLoader` for the pool: the planner's settings and memory estimate for a model."""

    def __init__(
        self,
        knobs: LoadKnobs,
        hardware: Callable[[], HardwareProfile],
        memory: Callable[[], MemoryInfo] = memory_now,
    ) -> None:
        self._knobs = knobs
        self._hardware = hardware
        self._memory = memory
        self._profile: HardwareProfile | None = None
        self._lock = threading.Lock()

    def settings_for(self, model: InstalledModel) -> EngineConfig:
        profile = self._profile_now()
        with WisdomDB() as wisdom:
            chosen = choose_load_settings(
                model.path,
                profile,
                wisdom,
                n_ctx=self._knobs.n_ctx,
                n_threads=self._knobs.n_threads,
                n_threads_batch=self._knobs.n_threads_batch,
                n_parallel=self._knobs.n_parallel,
            )
        log.info("loading %s on demand: %s", model.id, chosen.why)
        return chosen.config

    def fits_now(self, config: EngineConfig) -> bool:
        profile = self._profile_now()
        sized = self._sized(config, profile)
        available = profile.memory.available_bytes
        if sized is None or available is None:
            return True  # cannot be sized: llama.cpp's allocation (retried smaller) decides
        gpus_fit = all(device.free_bytes >= 0 for device in sized.devices if device.device != CPU)
        ram = next(device for device in sized.devices if device.device == CPU)
        return gpus_fit and ram.used_bytes <= available - headroom_bytes(profile.memory)

    def _sized(self, config: EngineConfig, profile: HardwareProfile) -> Candidate | None:
        """The planner's memory estimate for `config` (None: the model cannot be sized, so it
        loads on llama.cpp's word alone)."""
        if profile.memory.total_bytes is None:
            return None
        try:
            spec = spec_from_gguf(config.model_path)
        except (HearthsideError, OSError, ValueError):
            return None
        return evaluate_config(spec, profile, config, None, free_margin(profile.memory))

    def _profile_now(self) -> HardwareProfile:
        with self._lock:
            if self._profile is None:
                self._profile = self._hardware()
            profile = self._profile
        return replace(profile, memory=self._memory())


def headroom_bytes(memory: MemoryInfo) -> int:
    """What a load on demand leaves of the memory available now: the planner's cushion
    (2 GiB, or 1/8 of a smaller cgroup limit). What other programs use is already out of
    the available figure, so it is not counted twice as `free_margin` would."""
    usable = memory.usable_bytes
    if usable is None:
        return DEFAULT_FREE_MARGIN_BYTES
    return min(DEFAULT_FREE_MARGIN_BYTES, usable // LIMIT_CUSHION_SHARE)


def probed_once(root: Path) -> Callable[[], HardwareProfile]:
    """This machine's profile, probed in a child the first time it is asked for (seconds)."""
    lock = threading.Lock()
    found: list[HardwareProfile] = []

    def profile() -> HardwareProfile:
        with lock:
            if not found:
                found.append(probe_in_subprocess(models_dir(root)))
            return found[0]

    return profile


def speed_meters(hardware: Callable[[], HardwareProfile]) -> Callable[[], SpeedMeter]:
    """/metrics' speed-of-light gauges: a `SpeedMeter` per loaded model whose limit comes
    from this machine's calibration in the wisdom DB (as the chat footer's and bench's do)."""

    def find_limit(config: EngineConfig) -> SpeedLimit | None:
        with WisdomDB() as wisdom:
            return limit_for_config(config, hardware(), wisdom)

    return lambda: SpeedMeter(find_limit)


def on_demand_models(
    root: Path, knobs: LoadKnobs, hardware: Callable[[], HardwareProfile] | None = None
) -> OnDemandModels:
    """Every model installed under `root` (the data dir), planned for this machine."""
    hardware = hardware or partial(probe_in_subprocess, models_dir(root))
    return OnDemandModels(
        installed=partial(installed_in_store, root),
        loader=PlannedModelLoader(knobs, hardware),
    )
