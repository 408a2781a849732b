"""The context-capacity audit: the context holds what was promised, and decode at depth."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.autotune.capacity import audit_context
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine

pytestmark = pytest.mark.beside


@pytest.fixture(scope="module")
def engine(default_model_file: Path) -> Engine:
    loaded = Engine(EngineConfig(str(default_model_file), n_ctx=1024, n_threads=2))
    yield loaded
    loaded.close()


def test_the_default_models_context_holds_every_token(engine: Engine) -> None:
    audit = audit_context(engine)
    assert audit.holds, audit.message
    assert audit.allocated_ctx >= audit.requested_ctx == 1024
    assert audit.first_position == 0
    assert audit.last_position == audit.filled_tokens - 1
    assert audit.filled_tokens >= 0.9 * 1024
    assert [round(speed.fraction, 2) for speed in audit.speeds] == [0.0, 0.25, 0.9]
    assert all(speed.decode_tps > 0 for speed in audit.speeds)
    assert audit.speeds[-1].depth_tokens > audit.speeds[1].depth_tokens > 0
    assert "nothing evicted" in audit.message


def test_the_engine_is_left_with_an_empty_cache(engine: Engine) -> None:
    audit_context(engine, depths=(0.0, 0.5), decode_steps=4)
    assert engine.llama.n_tokens == 0
