"""The second line of defence: a load llama.cpp cannot allocate is tried again smaller. The
steps and sentences on their own, then the real engine in a child process whose address space
is limited between what a 32768-token and a 16384-token context need."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.load_retry import (
    describe_retry,
    is_allocation_failure,
    smaller_config,
)
from hearthside.core.engine.native_log import is_allocation_message
from hearthside.core.errors import (
    EngineError,
    EngineKilledAtLoadError,
    EngineLoadError,
    EngineOutOfMemoryError,
)

pytestmark = pytest.mark.beside

# Loads a model in an EngineService (the way the chat, the API and the window load), with the
# address space limited to argv[1] bytes (0: no limit); prints each retry, then what loaded
# and the process's peak address space.
CHILD = """
import resource, sys
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.service import EngineService

limit, path, n_ctx, kv = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
if limit:
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
config = EngineConfig(path, n_ctx=n_ctx, type_k=kv, type_v=kv, flash_attn=True)
with EngineService() as service:
    note = lambda text: print("retry:", text, flush=True)
    loaded = service.load(config, on_retry=note).result()
    # the model lives in the engine worker, which inherits the limit: its peak is the one
    status = open(f"/proc/{service.worker_pid}/status").read().splitlines()
print("loaded:", loaded.n_ctx, loaded.type_k)
peak = next(line for line in status if line.startswith("VmPeak:"))
print("peak:", int(peak.split()[1]) * 1024)
"""


def test_each_retry_halves_the_context_and_quantizes_the_kv_cache() -> None:
    config = EngineConfig("m.gguf", n_ctx=32768)
    first = smaller_config(config)
    assert first == config.with_changes(n_ctx=16384, type_k="q8_0", type_v="q8_0", flash_attn=True)
    assert first is not None
    second = smaller_config(first)
    assert second is not None and (second.n_ctx, second.type_k) == (8192, "q8_0")
    q4 = EngineConfig("m.gguf", n_ctx=4096, type_k="q4_0", type_v="q4_0", flash_attn=True)
    assert smaller_config(q4) == q4.with_changes(n_ctx=2048)  # already smaller than q8_0
    assert smaller_config(q4.with_changes(n_ctx=512)) is None  # nothing left to shrink


def test_several_slots_go_down_to_one_before_the_context_shrinks() -> None:
    config = EngineConfig("m.gguf", n_ctx=8192, n_parallel=4)
    first = smaller_config(config)
    assert first == config.with_changes(n_parallel=1)  # same context, same KV cache
    assert first is not None
    assert describe_retry(config, first) == (
        "llama.cpp could not allocate memory for 4 parallel requests of 8192 tokens each; "
        "retrying with one request at a time."
    )
    second = smaller_config(first)
    assert second is not None and (second.n_ctx, second.n_parallel) == (4096, 1)


def test_the_retry_says_what_failed_and_what_comes_next() -> None:
    config = EngineConfig("m.gguf", n_ctx=32768)
    retry = smaller_config(config)
    assert retry is not None
    assert describe_retry(config, retry) == (
        "llama.cpp could not allocate memory for a 32768-token context; retrying with "
        "16384 tokens and a q8_0 KV cache."
    )


def test_only_allocation_failures_are_retried() -> None:
    kv_line = (
        "llama_init_from_model: failed to initialize the context: failed to allocate buffer "
        "for kv cache"
    )
    numpy_line = "Unable to allocate 512. MiB for an array with shape (512, 262144)"
    assert is_allocation_message(kv_line) and is_allocation_message(numpy_line)
    assert not is_allocation_message("gguf_init_from_file: bad magic")
    assert is_allocation_failure(EngineOutOfMemoryError("llama.cpp could not load m.gguf"))
    killed = EngineKilledAtLoadError("The engine was killed while loading m.gguf", cause="SIGKILL")
    assert is_allocation_failure(killed)  # the OOM killer
    assert not is_allocation_failure(EngineLoadError("… (gguf_init_from_file: bad magic)."))
    assert not is_allocation_failure(EngineError("failed to allocate"))  # not a load


def run_child(model: Path, limit: int, n_ctx: int, kv: str) -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(limit), str(model), str(n_ctx), kv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line.partition(": ") for line in result.stdout.splitlines() if ": " in line]
    return {key: value for key, _, value in lines}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_load_that_cannot_allocate_is_loaded_again_smaller(default_model_file: Path) -> None:
    # what each needs, measured: the retry's target, and what is asked for
    small = int(run_child(default_model_file, 0, 16384, "q8_0")["peak"])
    asked = int(run_child(default_model_file, 0, 32768, "f16")["peak"])
    assert asked - small > 256 * 1024**2  # room for a limit between the two
    seen = run_child(default_model_file, (small + asked) // 2, 32768, "f16")
    assert seen["retry"] == (
        "llama.cpp could not allocate memory for a 32768-token context; retrying with "
        "16384 tokens and a q8_0 KV cache."
    )
    assert seen["loaded"] == "16384 q8_0"
