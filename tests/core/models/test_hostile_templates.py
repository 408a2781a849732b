"""Chat templates that take memory without bound (issue 36 item 1b), each run in a real cgroup.

Every load compiled a model's chat template with no bound, the `models add` check included:
llama-cpp-python's `Llama()` compiles every `tokenizer.chat_template*` it finds, and Jinja
folds constant expressions while compiling, so `{{ 'a'|center(4000000) }}` repeated built
gigabytes before any render cap applied (one file drove the check to 17.5 GB and the kernel's
machine-wide OOM killer). Now llama-cpp-python compiles none, Hearthside's own compile folds
nothing, and the check renders ordinary conversations with at most TEMPLATE_MEMORY_CAP_BYTES
more memory. Each attack runs inside a 1 GiB cgroup, so a regression is an OOM kill in the
cgroup (which the tests assert never happens), not a machine out of memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.core.errors import ModelFileError
from hearthside.core.models.child_check import (
    CHILD_MODULE,
    TEMPLATE_MEMORY_CAP_BYTES,
    check_loads_in_child,
)
from hearthside.core.models.store import ModelStore
from hearthside.core.paths import data_dir
from hearthside.core.units import MIB
from tests.cgroup_limit import memory_limited_cgroup
from tests.gguf_samples import write_tiny_gguf

pytestmark = pytest.mark.beside

CGROUP_LIMIT_BYTES = 1024 * MIB
CLI = [sys.executable, "-m", "hearthside.app.cli"]
# 400 constant outputs of 4 million characters: folded while compiling, 1.6 GB of literals and
# as much again in the generated code; rendered, the first output fills the 4 MiB prompt cap.
FOLDS = "{{ 'a'|center(4000000) }}" * 400
# One list of 4 million distinct one-character strings: within the size caps (4 Mi items),
# ~350 MB to build; folded while compiling (llama-cpp-python), far more.
BUILDS = "{% set letters = ('\U0001f600' * 4000000)|list %}{{ letters|length }}"
PLAIN = "{% for message in messages %}{{ message['content'] }}\n{% endfor %}"
# Slack for what two checks compared do not charge alike (page cache, Python's allocator
# keeping freed arenas).
PEAK_SLACK_BYTES = 48 * MIB
CHECK_CHILD = [sys.executable, "-m", CHILD_MODULE]
# What a chat, serve or tune does with a model in its worker: load it, then answer.
LOAD_AND_CHAT = """
import sys
from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.errors import TemplateError

engine = Engine(EngineConfig(sys.argv[1], n_ctx=64))
try:
    reply = engine.chat([ChatMessage("user", "hi")], SamplingParams(max_tokens=4))
except TemplateError as exc:
    print("refused:", exc.message)
else:
    print("answered:", reply.metrics.completion_tokens, "tokens")
"""


def check_in_a_cgroup(model: Path) -> tuple[ModelFileError | None, int]:
    """The `models add` check of `model` with its child in a fresh 1 GiB cgroup: the error it
    raised (None when the file passed) and the cgroup's peak. No OOM kill is allowed."""
    error = None
    with memory_limited_cgroup(CGROUP_LIMIT_BYTES) as cgroup:
        try:
            check_loads_in_child(model, command=cgroup.command(CHECK_CHILD))
        except ModelFileError as exc:
            error = exc
        peak, kills = cgroup.peak_bytes, cgroup.oom_kills
    assert kills == 0, f"the OOM killer ended the check: {error}"
    assert peak is not None
    return error, peak


def run_in_a_cgroup(*command: str) -> subprocess.CompletedProcess[str]:
    """`command` in a fresh 1 GiB cgroup; fails the test if anything in it was OOM-killed."""
    with memory_limited_cgroup(CGROUP_LIMIT_BYTES) as cgroup:
        result = cgroup.run(command, env=dict(os.environ), timeout=180)
        kills = cgroup.oom_kills
    assert kills == 0, f"the OOM killer ended a process in the cgroup: {result.stderr[-2000:]}"
    return result


def test_compiling_a_template_evaluates_none_of_it() -> None:
    """Hearthside's own compile: 400 outputs of 4 MB constants cost nothing until rendered,
    and the render stops at the prompt cap (its compile peaked past 2 GB before the fix)."""
    script = (
        "import sys\n"
        "from hearthside.core.engine.templates import ChatTemplate\n"
        "from hearthside.core.errors import TemplateError\n"
        "template = ChatTemplate(sys.argv[1])\n"
        "try:\n"
        "    template.render([{'role': 'user', 'content': 'Hello'}])\n"
        "except TemplateError as exc:\n"
        "    print(exc.message)\n"
    )
    with memory_limited_cgroup(CGROUP_LIMIT_BYTES) as cgroup:
        result = cgroup.run([sys.executable, "-c", script, FOLDS], timeout=60)
        peak, kills = cgroup.peak_bytes, cgroup.oom_kills
    assert kills == 0 and result.returncode == 0, result.stderr[-2000:]
    assert "produced a prompt longer than the 4 MiB limit" in result.stdout
    assert peak is not None and peak < 200 * MIB


@pytest.mark.slow
def test_a_template_that_folds_to_gigabytes_is_refused_at_models_add(tmp_path: Path) -> None:
    """The issue's attack through the real CLI: a plain refusal, nothing registered, the
    user's file untouched, and no process killed for memory."""
    with ModelStore(data_dir()) as store:
        store.remember_default_model_installed()  # the CLI installs no 253 MB model here
    model = write_tiny_gguf(tmp_path / "folds.gguf", loadable=True, chat_template=FOLDS)
    refused = run_in_a_cgroup(*CLI, "models", "add", str(model))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "Hearthside did not add this model: its chat template failed the check." in (
        refused.stderr
    )
    assert "produced a prompt longer than the 4 MiB limit" in refused.stderr
    assert "another copy of this model" in refused.stderr  # what to do
    assert "Traceback" not in refused.stderr
    assert model.is_file()
    with ModelStore(data_dir()) as store:
        assert store.list() == []


def test_a_template_that_builds_past_the_cap_is_refused_within_it(tmp_path: Path) -> None:
    """Within every size cap (4 Mi items), one list takes ~350 MB: the check stops it at
    TEMPLATE_MEMORY_CAP_BYTES more than an ordinary template's check takes."""
    plain = write_tiny_gguf(tmp_path / "plain.gguf", loadable=True, chat_template=PLAIN)
    passed, plain_peak = check_in_a_cgroup(plain)
    assert passed is None

    builds = write_tiny_gguf(tmp_path / "builds.gguf", loadable=True, chat_template=BUILDS)
    refused, peak = check_in_a_cgroup(builds)
    assert refused is not None
    cap = f"needed more than the {TEMPLATE_MEMORY_CAP_BYTES // MIB} MiB of memory allowed to it"
    assert cap in refused.message
    assert peak < plain_peak + TEMPLATE_MEMORY_CAP_BYTES + PEAK_SLACK_BYTES


def test_a_files_named_templates_never_reach_llama_cpp_python(tmp_path: Path) -> None:
    """`tokenizer.chat_template.tool_use` is never Hearthside's: the file passes its check and
    answers, though llama-cpp-python compiled every such template at every load."""
    templates = [{"name": "default", "template": PLAIN}, {"name": "tool_use", "template": FOLDS}]
    model = write_tiny_gguf(tmp_path / "named.gguf", loadable=True, chat_template=templates)
    passed, _ = check_in_a_cgroup(model)
    assert passed is None
    loaded = run_in_a_cgroup(sys.executable, "-c", LOAD_AND_CHAT, str(model))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.startswith("answered: ")


def test_a_hostile_template_that_skipped_the_check_is_refused_in_words_at_load(
    tmp_path: Path,
) -> None:
    """A file registered without today's check (an older Hearthside's): its load compiles the
    template folding nothing, and the chat is told what is wrong."""
    model = write_tiny_gguf(tmp_path / "older.gguf", loadable=True, chat_template=FOLDS)
    loaded = run_in_a_cgroup(sys.executable, "-c", LOAD_AND_CHAT, str(model))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert "refused: The model's chat template produced a prompt longer than the 4 MiB" in (
        loaded.stdout
    )
