"""The speed probes of a calibration, loaded side by side in one engine worker process.

A probe is timed in rounds interleaved with every other model's, so all of them are loaded
together; one worker process each held 16 processes (about 3.8 GB) alive at once on a 2-core
machine (issue 32). Here the first probe starts a worker and the others load into that same
process beside it (`load_guest`), so a calibration holds two engine processes: this host and
the shipped model's own worker. A probe that crashes llama.cpp ends the host, not the app: the
probes it held are then reported as not measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from hearthside.core.engine.config import EngineConfig

if TYPE_CHECKING:
    from hearthside.core.engine.engine import Engine
    from hearthside.core.engine.worker_engine import WorkerEngine

T = TypeVar("T")

# In the host process: the probes loaded beside its own model, by path.
_GUESTS: dict[str, Engine] = {}


def load_guest(host: Engine, config: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Run in the host: load another probe beside `host`'s model; returns its vocabulary
    and its settings as loaded."""
    from hearthside.core.engine.engine import Engine

    del host
    engine = Engine(EngineConfig.from_dict(config))
    _GUESTS[config["model_path"]] = engine
    return engine.n_vocab, engine.config.to_dict()


def on_guest(host: Engine, model_path: str, function: Callable[..., T], args: tuple[Any, ...]) -> T:
    """Run in the host: `function(engine, *args)` on the probe loaded from `model_path`."""
    del host
    return function(_GUESTS[model_path], *args)


def _time_prefill(engine: Engine, tokens: list[int]) -> float:
    return engine.time_prefill(tokens)


def _time_decode(engine: Engine, tokens: list[int]) -> float:
    return engine.time_decode(tokens)


class ProbeEngine:
    """One probe in the host: what a calibration round uses of an engine."""

    def __init__(self, worker: WorkerEngine, config: EngineConfig, n_vocab: int, guest: bool):
        self.worker = worker
        self.config = config
        self.model_path = Path(config.model_path)
        self.n_vocab = n_vocab
        self._guest = guest

    @property
    def alive(self) -> bool:
        return self.worker.alive

    def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(engine, *args)` in the host, on this probe's engine."""
        if not self._guest:
            return self.worker.run(function, *args)
        return self.worker.run(on_guest, str(self.config.model_path), function, args)

    def time_prefill(self, tokens: Sequence[int]) -> float:
        return self.run(_time_prefill, list(tokens))

    def time_decode(self, tokens: Sequence[int]) -> float:
        return self.run(_time_decode, list(tokens))


class ProbeHost:
    """Loads probes one at a time into one worker; a new worker after one crashed."""

    def __init__(self) -> None:
        self._workers: list[WorkerEngine] = []

    def load(self, config: EngineConfig) -> ProbeEngine:
        """`config`'s model in the host; raises what loading an engine raises."""
        from hearthside.core.engine.worker_engine import WorkerEngine

        worker = self._workers[-1] if self._workers else None
        if worker is None or not worker.alive:
            worker = WorkerEngine(config)
            self._workers.append(worker)
            return ProbeEngine(worker, worker.config, worker.n_vocab, guest=False)
        n_vocab, loaded = worker.run(load_guest, config.to_dict())
        return ProbeEngine(worker, EngineConfig.from_dict(loaded), n_vocab, guest=True)

    @property
    def processes(self) -> int:
        """Host processes alive now (one, unless a crash left a dead one behind)."""
        return sum(worker.alive for worker in self._workers)

    def close(self) -> None:
        for worker in self._workers:
            worker.close()
