"""What the autotune database keeps, as plain data: the keys, the runs, the qualities, the
recipes, the defaults and the efficiency factors.

These records cross all three parts of `autotune/` (see `autotune/parts.py`): the plan reads
them (a measured run outranks a prediction, a measured quality a prior), the measure part makes
them, and the store (`wisdom.py`) keeps them in `wisdom.db`. Nothing here opens a file or a
database; `wisdom.py` and `fingerprint.py` still export these names for their callers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

Rigor = Literal["estimate", "quick", "thorough"]
# "crashed": the engine worker died measuring it (a signal, an abort) — never tried again.
Outcome = Literal["ok", "oom", "failed", "timeout", "crashed"]
RIGOR_RANK: dict[str, int] = {rigor: rank for rank, rigor in enumerate(get_args(Rigor))}


@dataclass(frozen=True)
class TuningKey:
    """The three fingerprints a measurement belongs to."""

    machine: str
    engine: str
    model: str

    def to_dict(self) -> dict[str, str]:
        return {"machine": self.machine, "engine": self.engine, "model": self.model}


@dataclass(frozen=True)
class RunRecord:
    """One configuration tried on one machine, engine build and model."""

    key: TuningKey
    config: dict[str, Any]  # EngineConfig.to_dict(), without the model's path
    rigor: Rigor
    outcome: Outcome
    prefill_tps: float | None = None
    decode_tps: float | None = None
    ttft_s: float | None = None
    memory: dict[str, Any] | None = None  # what llama.cpp allocated (LoadReport.to_dict())
    predicted: dict[str, Any] | None = None  # the cost model's figures at the time
    error: str | None = None
    created_at: str = ""
    id: int | None = None
    # (max - min) / median of its repetitions, the worse of prefill's and decode's: how far
    # they disagreed (`autotune/busy.py`); None for a run measured otherwise or before it
    repeat_spread: float | None = None
    # how long measuring it took here, a worker start and the model's load included: what the
    # next tuning of this model expects one candidate to cost (`tune_wait.py`)
    seconds: float | None = None
    # cores other programs kept busy on average while it was measured (`core/probe/cpu_use.py`):
    # a burst beside one run disturbs it though the whole tuning's average stays low; None for
    # a run measured otherwise or before it was counted
    others_cores: float | None = None

    @property
    def allocated_bytes(self) -> int | None:
        """All buffers llama.cpp allocated for it, on every device; None when not known."""
        memory = self.memory
        if not memory or not memory.get("devices"):
            return None
        return sum(int(value) for device in memory["devices"].values() for value in device.values())

    @property
    def config_key(self) -> str:
        return config_key(self.config)

    @property
    def failed(self) -> bool:
        return self.outcome != "ok"


@dataclass(frozen=True)
class Efficiency:
    """Measured over predicted speed on one device for one kind of work ("decode"/"prefill")."""

    machine: str
    engine: str
    device: str
    kind: str
    factor: float = 1.0
    samples: int = 0


@dataclass(frozen=True)
class Recipe:
    """A curated prior: settings for hardware/model families, with the reason."""

    id: str
    applies_to: dict[str, Any]  # e.g. {"architecture": ["gemma3"], "gpu_arch": ["sm_70"]}
    settings: dict[str, Any]
    rationale: str
    source: str = "assets/recipes.json"


@dataclass(frozen=True)
class QualityRecord:
    """One candidate measured against its model's reference over one evaluation text."""

    reference_model: str  # fingerprint of the reference file
    candidate_model: str  # fingerprint of the candidate's weights file
    kv_type: str  # the candidate's KV-cache type (K and V alike)
    text_hash: str  # sha256 of the evaluation text
    n_ctx: int  # tokens per evaluation chunk
    candidate: str  # its name in words, e.g. "Q4_0"
    reference: str  # the reference file's name, e.g. "SmolLM2-135M-Instruct.Q4_1.gguf"
    n_tokens: int  # tokens scored
    mean_kld: float  # nats per token
    kld_p99: float
    top1_agreement: float  # 0..1: same most likely next token as the reference
    perplexity: float
    reference_perplexity: float
    created_at: str = ""
    # the reference's `general.architecture` (e.g. "gemma3"): its family, whose other models
    # take a KV type's measured figure as their prior; "" where a row predates the column
    architecture: str = ""


@dataclass(frozen=True)
class ModelDefault:
    key: TuningKey
    config: dict[str, Any]
    goal: str
    run_id: int | None
    updated_at: str = ""


def config_key(config: Mapping[str, Any]) -> str:
    """The same settings give the same key, whatever the dict order or the model's path."""
    tunable = {name: value for name, value in config.items() if name != "model_path"}
    if tunable.get("n_parallel") == 1:  # keys written before there were slots stay the same
        del tunable["n_parallel"]
    canonical = json.dumps(tunable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
