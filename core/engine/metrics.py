"""What a generation cost and what its drafts did: plain data, importable without the engine
(the chat history and the window read them before llama.cpp has loaded)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class SpeculationStats:
    """What the drafts of one generation did.

    `acceptance_rate` is accepted / drafted (llama.cpp's figure); `mean_accepted_length` is
    accepted tokens per verify step that had a draft; `rejections` counts the steps that ended
    on a drafted token the target sampled otherwise (the rest took the whole draft). Drafted
    tokens past the end of the generation (it stopped first) are not counted.
    """

    mode: str  # "prompt_lookup" | "draft_model"
    draft_tokens: int  # the most tokens one step may draft (k)
    drafted: int
    accepted: int
    steps: int  # verify steps (a plain decode step when the draft found nothing)
    draft_steps: int  # verify steps that had at least one drafted token
    rejections: int
    acceptance_rate: float | None
    mean_accepted_length: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GenerationMetrics:
    """What one generation cost. Rates are None when there was nothing to time."""

    prompt_tokens: int
    prompt_tokens_evaluated: int  # prompt tokens not served from the KV cache
    completion_tokens: int
    ttft_s: float | None
    prompt_tok_s: float | None
    decode_tok_s: float | None
    total_s: float
    stop_reason: str  # "eos" | "stop" | "length" | "context_full" | "cancelled"
    speculative: SpeculationStats | None = None  # drafted/accepted tokens when speculation is on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
