"""`hearthside chat` under a real cgroup memory limit far too small for the context asked for:
it backs off to settings that fit and answers, where loading what was asked gets the process
killed by the kernel without a word.

The figures (Gemma 3 270M Q4_K_M, trained on 32768 tokens, 18 layers with one 256-wide KV
head, and llama-cpp-python's full-size sliding-window cache): an f16 KV cache takes 1 KiB per
token per layer, so 2.25 GiB at 131072 tokens and 576 MiB at 32768; the chat process itself
is charged ~60 MiB before the model loads. Under 600 MiB, both the context asked for and the
trained one are killed (the premise test below), while the back-off's pick (16384 tokens, a
q4_0 KV cache, 128-token batches) peaks at ~250 MiB here. The model file's mmapped pages count
toward a v1 limit too when this cgroup is the first to read them, but the kernel reclaims them.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from tests.cgroup_limit import memory_limited_cgroup

pytestmark = pytest.mark.beside

MIB = 1 << 20
LIMIT = 600 * MIB
CLI = [sys.executable, "-m", "hearthside.app.cli"]
# Loads exactly this context with llama-cpp-python's other defaults, as Hearthside did when
# nothing fitted: what happens without backing off.
BARE_LOAD = """
import sys
from hearthside.core.engine.config import EngineConfig
from hearthside.core.engine.engine import Engine

Engine(EngineConfig(sys.argv[1], n_ctx=int(sys.argv[2])))
print("loaded")
"""


@pytest.mark.slow
def test_chat_backs_off_under_a_memory_limit_and_answers(default_model_file: Path) -> None:
    with memory_limited_cgroup(LIMIT) as cgroup:
        command = [*CLI, "chat", "--model", str(default_model_file), "--ctx", "131072"]
        # greedy: a sampled reply was once nothing but a newline (CI, 2026-12-03)
        greedy = ["--seed", "0", "--temperature", "0"]
        prompt = ["--prompt", "Name a colour.", "--max-tokens", "24"]
        result = cgroup.run([*command, *prompt, *greedy])
        peak, kills = cgroup.peak_bytes, cgroup.oom_kills
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()  # an answer
    assert "The model was trained on 32768 tokens, so the context is 32768, not 131072." in (
        result.stderr
    )
    assert "A 32768-token context does not fit in the " in result.stderr
    assert "under its 600 MiB memory limit; loading with " in result.stderr
    assert kills == 0
    assert peak is not None and peak < LIMIT


@pytest.mark.slow
@pytest.mark.parametrize("n_ctx", [131072, 32768])  # asked for, and capped at the trained one
def test_without_backing_off_the_same_load_is_killed(default_model_file: Path, n_ctx: int) -> None:
    with memory_limited_cgroup(LIMIT) as cgroup:
        if not cgroup.swap_limited:
            pytest.skip("swap is on and not limited for the cgroup: the load would swap instead")
        result = cgroup.run([sys.executable, "-c", BARE_LOAD, str(default_model_file), str(n_ctx)])
        kills = cgroup.oom_kills
    assert result.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), result.stdout
    assert "loaded" not in result.stdout
    assert kills >= 1


TINY_LIMIT = 100 * MIB  # the app alone fits; the app and a child loading a model do not


@pytest.mark.slow
def test_under_a_100_mib_limit_the_chat_says_memory_ran_out(chat_model_file: Path) -> None:
    """Issue 36: the kernel killed the chat process itself (the largest one while its model
    check started) and the user saw nothing. Children that load models now ask the OOM killer
    to take them first, and their death is a plain message."""
    with memory_limited_cgroup(TINY_LIMIT) as cgroup:
        if not cgroup.swap_limited:
            pytest.skip("swap is on and not limited for the cgroup: the load would swap instead")
        command = [*CLI, "chat", "--model", str(chat_model_file), "--prompt", "Hi."]
        result = cgroup.run([*command, "--max-tokens", "8"])
        kills = cgroup.oom_kills
    # The child's KV cache alone (SmolLM2 at the chat context) outgrows 100 MiB: a kill is
    # certain on any machine, so a run without one means the limit was not applied.
    assert kills > 0, "nothing was killed: the cgroup's limit did not hold the chat"
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert result.stderr.startswith("error: ") or "\nerror: " in result.stderr
    assert "ran out of memory" in result.stderr or "not enough memory" in result.stderr
    assert "Traceback" not in result.stderr
