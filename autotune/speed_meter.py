"""The speed-of-light meter's edges: the limit for a loaded model (its file, this machine's
calibration), what the rest of the machine was doing (`core/probe/cpu_use.py`), and
`SpeedMeter`, which keeps the loaded model's limit and the last reply's share for whoever
shows it.

`SpeedMeter.observe` is an `EngineService` result listener: a loaded `EngineConfig` starts
working out its limit on a thread of its own (reading the model's tensors takes a moment;
the engine thread does not wait for it), and each generation's metrics become the meter's
`last` SpeedOfLight — what the API's `/metrics` and the window read.

`reading_of` is the one computation behind every figure shown: the chat footer and `/metrics`
(through `SpeedMeter.measure`), `hearthside bench` (`bench_reading`) and the wizard's result
(`tuned_reading`). A decode of N tokens after P tokens of prompt is compared with the limit at
P + N/2 tokens of context, the average its tokens saw.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hearthside.autotune.backoff import free_margin
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.memory import pieces_from_gguf
from hearthside.autotune.speed_limit import (
    MachineLoad,
    SpeedLimit,
    SpeedOfLight,
    decode_speed_limit,
    speed_of_light,
)
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.metrics import GenerationMetrics
from hearthside.core.engine.remote import RemoteConfig
from hearthside.core.errors import HearthsideError
from hearthside.core.models.gguf_validator import validate_gguf
from hearthside.core.models.spec import spec_from_gguf_info
from hearthside.core.probe.cpu_use import cpu_use_now, others_cores
from hearthside.core.probe.profile import HardwareProfile

if TYPE_CHECKING:
    from hearthside.autotune.tuner import TuneResult

log = logging.getLogger(__name__)
LimitFinder = Callable[[EngineConfig], SpeedLimit | None]


def limit_for_config(
    config: EngineConfig, profile: HardwareProfile, wisdom: WisdomDB
) -> SpeedLimit | None:
    """The limit for `config` as loaded on `profile`'s machine, from its calibration in
    `wisdom` (or the spec sheet's bandwidth); None when neither says, or the model file
    cannot be read."""
    try:
        info = validate_gguf(Path(config.model_path))
        spec = spec_from_gguf_info(info)
    except (HearthsideError, OSError, ValueError):
        return None
    return decode_speed_limit(
        spec,
        profile,
        config,
        calibration_for(profile, wisdom),
        pieces=pieces_from_gguf(info),
        free_margin_bytes=free_margin(profile.memory),
    )


def reading_of(
    limit: SpeedLimit,
    decode_tok_s: float,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    load: MachineLoad | None = None,
) -> SpeedOfLight:
    """`decode_tok_s`, measured over `completion_tokens` decoded after `prompt_tokens`, against
    `limit`: the share every view shows (footer, bench, /metrics, wizard)."""
    context = prompt_tokens + completion_tokens // 2
    return speed_of_light(decode_tok_s, limit, context_tokens=context, load=load)


def bench_reading(
    limit: SpeedLimit, tg_tok_s: float, n_gen: int, load: MachineLoad | None = None
) -> SpeedOfLight:
    """A tgN measurement (llama-bench's: N tokens from an empty context) against `limit`."""
    return reading_of(limit, tg_tok_s, prompt_tokens=0, completion_tokens=n_gen, load=load)


def speed_of_light_for(
    config: EngineConfig,
    measured_tps: float,
    profile: HardwareProfile,
    wisdom: WisdomDB,
    *,
    n_gen: int,
    load: MachineLoad | None = None,
) -> SpeedOfLight | None:
    """One tgN decode speed of `config` (a tuner's run, the wizard's pick) against this
    machine's limit; None when no limit is known. Reads the model file: not on a GUI thread."""
    limit = limit_for_config(config, profile, wisdom)
    if limit is None:
        return None
    return bench_reading(limit, measured_tps, n_gen, load)


def tuned_reading(
    result: TuneResult, profile: HardwareProfile, wisdom: WisdomDB
) -> SpeedOfLight | None:
    """The wizard's pick (`result.best`, measured by the tuner as a tgN bench) against this
    machine's limit for its file and settings; None without a pick or a limit."""
    from hearthside.autotune.tuner import QUICK, THOROUGH

    best = result.best
    if best is None or not best.decode_tps:
        return None
    variant = result.chosen_variant
    path = variant.path if variant is not None else result.model_path
    if not path:
        return None
    config = EngineConfig.from_dict({**best.config, "model_path": path})
    n_gen = (THOROUGH if best.rigor == "thorough" else QUICK).n_gen
    return speed_of_light_for(config, best.decode_tps, profile, wisdom, n_gen=n_gen)


class LoadSampler:
    """Other programs' share of the CPU between two samples (`core/probe/cpu_use.py`: all the
    CPU time spent minus this process tree's, the engine worker being a child), over the time
    passed and the cores."""

    def __init__(self, numa_nodes: int | None = None) -> None:
        self._numa_nodes = numa_nodes
        self._last = cpu_use_now()

    def sample(self) -> MachineLoad:
        now = cpu_use_now()
        before, self._last = self._last, now
        others: float | None = None
        if now.at_s > before.at_s:
            others = min(1.0, others_cores(before, now) / max(1, now.cores))
        return MachineLoad(
            usable_cores=_usable_cores(),
            load_average=os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            others_cpu_share=others,
            numa_nodes=self._numa_nodes,
        )


def _usable_cores() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class SpeedMeter:
    """The loaded model's limit and the last generation's share of it; thread-safe."""

    def __init__(
        self, find_limit: LimitFinder | None = None, sampler: LoadSampler | None = None
    ) -> None:
        self._find_limit = find_limit
        self._sampler = sampler or LoadSampler()
        self._lock = threading.Lock()
        self._limit: SpeedLimit | None = None
        self._last: SpeedOfLight | None = None
        self._loads = 0  # which load a finished limit belongs to
        self._found = threading.Event()  # the last load's limit is worked out (or None)

    @property
    def limit(self) -> SpeedLimit | None:
        return self._limit

    @property
    def last(self) -> SpeedOfLight | None:
        """The last generation against the limit (None: none yet, or no limit known)."""
        return self._last

    def last_share(self) -> float | None:
        """The last generation's tok/s over the limit, for `/metrics`."""
        last = self._last
        return last.share if last is not None else None

    def set_limit(self, limit: SpeedLimit | None) -> None:
        with self._lock:
            self._loads += 1
            self._limit, self._last = limit, None
        self._found.set()

    def wait_for_limit(self, timeout_s: float | None = None) -> SpeedLimit | None:
        """The loaded model's limit once it is worked out (None: none, or not in time)."""
        self._found.wait(timeout_s)
        return self._limit

    def measure(self, metrics: GenerationMetrics) -> SpeedOfLight | None:
        """`metrics` against the limit; None without a limit or a decode speed."""
        limit = self._limit
        if limit is None or not metrics.decode_tok_s:
            return None
        result = reading_of(
            limit,
            metrics.decode_tok_s,
            prompt_tokens=metrics.prompt_tokens,
            completion_tokens=metrics.completion_tokens,
            load=self._sampler.sample(),
        )
        self._last = result
        return result

    def observe(self, result: Any) -> None:
        """An `EngineService` result listener: a loaded config, or a generation's result."""
        if isinstance(result, EngineConfig):
            self._start_finding(result)
            return
        if isinstance(result, RemoteConfig):  # another machine's speed: no limit here
            self.set_limit(None)
            return
        metrics = getattr(result, "metrics", None)
        if isinstance(metrics, GenerationMetrics):
            self.measure(metrics)

    def _start_finding(self, config: EngineConfig) -> None:
        with self._lock:
            self._loads += 1
            self._limit, self._last, load = None, None, self._loads
            self._found.clear()
        if self._find_limit is None:
            self._found.set()
            return
        find = self._find_limit

        def work() -> None:
            try:
                limit = find(config)
            except Exception:  # a meter that cannot say is no reason to fail a load
                log.exception("could not work out the speed limit of %s", config.model_path)
                limit = None
            with self._lock:
                if load == self._loads:  # no other model was loaded meanwhile
                    self._limit = limit
                    self._found.set()

        threading.Thread(target=work, name="hearthside-speed-limit", daemon=True).start()
