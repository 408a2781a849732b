"""Loading again, smaller, when llama.cpp cannot allocate what was chosen.

The settings were chosen to fit (autotune/load_settings.py), but an estimate can be wrong and
memory can be taken meanwhile. When a load fails for want of memory, it is tried again
smaller, twice at most, and whoever loads hears why: with one slot when it had several
(parallel requests go before the context, as in autotune/backoff.py), else with half the
context and a KV cache of at most q8_0.
Other load failures (a damaged file, an old engine) are raised at once: a smaller context
would not help them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hearthside.core.engine.config import KV_CACHE_TYPES, EngineConfig
from hearthside.core.errors import EngineLoadError, EngineOutOfMemoryError

MAX_RETRIES = 2
MIN_RETRY_CONTEXT = 512
QUANTIZED_KV = tuple(name for name in KV_CACHE_TYPES if name not in ("f32", "f16", "bf16"))

EngineT = TypeVar("EngineT")


def is_allocation_failure(error: Exception) -> bool:
    return isinstance(error, EngineOutOfMemoryError)


def smaller_config(config: EngineConfig) -> EngineConfig | None:
    """One slot where there were several; else half the context (not below
    MIN_RETRY_CONTEXT) with a KV cache of at most q8_0; None when there is nothing left to
    shrink."""
    if config.n_parallel > 1:
        return config.with_changes(n_parallel=1)
    kv = config.type_k if config.type_k in QUANTIZED_KV else "q8_0"
    smaller = config.with_changes(
        n_ctx=max(MIN_RETRY_CONTEXT, config.n_ctx // 2),
        type_k=kv,
        type_v=config.type_v if config.type_v in QUANTIZED_KV else kv,
        flash_attn=True,  # a quantized V cache needs it
    )
    return None if smaller == config else smaller


def describe_retry(failed: EngineConfig, retry: EngineConfig) -> str:
    """E.g. "llama.cpp could not allocate memory for a 32768-token context; retrying with
    16384 tokens and a q8_0 KV cache." """
    if retry.n_parallel != failed.n_parallel:
        return (
            f"llama.cpp could not allocate memory for {failed.n_parallel} parallel requests of "
            f"{failed.n_ctx} tokens each; retrying with one request at a time."
        )
    changes = [f"{retry.n_ctx} tokens"] if retry.n_ctx != failed.n_ctx else []
    if (retry.type_k, retry.type_v) != (failed.type_k, failed.type_v):
        changes.append(f"a {retry.type_k} KV cache")
    return (
        f"llama.cpp could not allocate memory for a {failed.n_ctx}-token context; "
        f"retrying with {' and '.join(changes)}."
    )


def load_retrying(
    load: Callable[[EngineConfig], EngineT],
    config: EngineConfig,
    on_retry: Callable[[str], None],
) -> tuple[EngineT, EngineConfig]:
    """`load(config)`, or, where that fails for want of memory, `load` of a smaller config
    (MAX_RETRIES times at most); the engine and the config it was loaded with."""
    attempt = config
    for _ in range(MAX_RETRIES):
        try:
            return load(attempt), attempt
        except EngineLoadError as error:
            smaller = smaller_config(attempt)
            if smaller is None or not is_allocation_failure(error):
                raise
            on_retry(describe_retry(attempt, smaller))
            attempt = smaller
    return load(attempt), attempt
