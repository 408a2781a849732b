"""The engine's grammar pre-check, with the real llama.cpp parser. Anything that could crash
runs in a child process, so a regression shows as a failed test, not a dead test run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.grammar_limits import (
    MAX_GRAMMAR_NESTING,
    MAX_GRAMMAR_RULES,
    GrammarError,
)

pytestmark = pytest.mark.beside


@pytest.fixture(scope="module")
def engine(chat_model_file: Path) -> Iterator[Engine]:
    loaded = Engine(EngineConfig(model_path=str(chat_model_file), n_ctx=512))
    yield loaded
    loaded.close()


def ask(engine: Engine, grammar: str | None) -> str:
    sampling = SamplingParams(temperature=0, max_tokens=4, grammar=grammar)
    return engine.chat([ChatMessage("user", "Say hi.")], sampling).text


def test_a_left_recursive_grammar_is_refused_with_a_clear_error(engine: Engine) -> None:
    with pytest.raises(GrammarError, match="llama.cpp refused it") as refused:
        ask(engine, "root ::= a\na ::= a\n")
    assert refused.value.hint and "JSON schema" in refused.value.hint
    assert ask(engine, None)  # the engine still answers


CHILD_DEEP_GRAMMAR = """
import sys
from hearthside.core.engine.config import EngineConfig, SamplingParams
from hearthside.core.engine.engine import ChatMessage, Engine
from hearthside.core.engine.grammar_limits import GrammarError

engine = Engine(EngineConfig(model_path=sys.argv[1], n_ctx=512))
deep = 'root ::= "a" ' + '([a-z] ' * 20000 + ')?' * 20000 + '\\n'
try:
    engine.chat([ChatMessage("user", "hi")], SamplingParams(max_tokens=2, grammar=deep))
except GrammarError as exc:
    print("refused:", exc.message)
plain = engine.chat([ChatMessage("user", "hi")], SamplingParams(max_tokens=2))
print("still answers:", bool(plain.text))
"""


def test_a_grammar_that_overflowed_llama_cpps_stack_is_refused_first(chat_model_file: Path) -> None:
    """20000 nested groups were a SIGSEGV inside `llama_sampler_init_grammar`."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD_DEEP_GRAMMAR, str(chat_model_file)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    assert "refused: The grammar for the requested output format nests groups deeper than" in (
        child.stdout
    )
    assert "still answers: True" in child.stdout


CHILD_AT_THE_LIMITS = """
import ctypes, sys, threading
import llama_cpp

log = llama_cpp.llama_log_callback(lambda level, text, data: None)
llama_cpp.llama_log_set(log, ctypes.c_void_p())
params = llama_cpp.llama_model_default_params()
params.vocab_only = True
model = llama_cpp.llama_model_load_from_file(sys.argv[1].encode(), params)
vocab = llama_cpp.llama_model_get_vocab(model)
nesting, rules = int(sys.argv[2]), int(sys.argv[3])
grammars = [
    'root ::= "a" ' + '([a-z] ' * nesting + ')?' * nesting + '\\n',
    'root ::= r0\\n'
    + ''.join(f'r{i} ::= r{i + 1}\\n' for i in range(rules))
    + f'r{rules} ::= "a"\\n',
]

def parse_all():
    for grammar in grammars:
        sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
        if sampler:
            llama_cpp.llama_sampler_free(sampler)
    print("survived")

threading.stack_size(1 << 20)  # far smaller than any desktop OS gives a thread
worker = threading.Thread(target=parse_all)
worker.start()
worker.join()
"""


def test_llama_cpp_survives_four_times_the_limits_on_a_one_mib_stack(chat_model_file: Path) -> None:
    """The margin behind the limits: llama.cpp parses 4x the nesting limit and a chain of
    rules as long as the rule limit on a 1 MiB thread stack (measured to crash at 2323 nested
    groups and 8163 chained rules) without crashing."""
    child = subprocess.run(
        [
            sys.executable, "-c", CHILD_AT_THE_LIMITS, str(chat_model_file),
            str(4 * MAX_GRAMMAR_NESTING), str(MAX_GRAMMAR_RULES),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert child.returncode == 0, f"llama.cpp crashed (exit {child.returncode})"
    assert "survived" in child.stdout
