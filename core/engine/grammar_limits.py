"""Bounds a GBNF grammar must keep before llama.cpp's native grammar parser may see it.

llama.cpp parses a grammar recursively: every nested `( ... )` group is one more C++ stack
frame pair (about 440 bytes a level), and a chain of rules that each start with the next
rule is one more frame (about 130 bytes a link) when it checks for left recursion. Measured
on the vendored build (llama-cpp-python 0.3.36) by parsing grammars in a child process, on a
thread with the given stack:

    nested groups:        8 MiB stack (Linux default) survives 18702, crashes at 18718
                          1 MiB stack survives 2313;  256 KiB stack survives 565
    left chain of rules:  1 MiB stack survives 8104, crashes at 8163

A crash there is a SIGSEGV that ends the whole app, so these limits stay far below: 256
nested groups is 9x under what a 1 MiB thread stack survives (Windows gives threads 2 MiB,
macOS 16 MiB), and 4096 rules bounds every chain of rules at half of what 1 MiB survives.

The parser also refuses, with a clean error, a `{m,n}` whose `m` exceeds 2000, and it quietly
treats an `n` above 2000 as unbounded, so the schema converter never writes one (it splits
long repetitions into chunks; see core/server/schema_converter.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from hearthside.core.errors import EngineError

MAX_GRAMMAR_BYTES = 1 << 20
MAX_GRAMMAR_RULES = 4096
MAX_GRAMMAR_NESTING = 256
# Rules llama.cpp builds itself when it expands `x{m,n}` (about max(m, n) each).
MAX_GRAMMAR_REPETITIONS = 200_000
# llama.cpp's own ceiling for one `{m,n}` count (MAX_REPETITION_THRESHOLD in llama-grammar.cpp).
LLAMA_CPP_MAX_REPETITION = 2000
_MAX_COUNT_DIGITS = 9
_HINT = (
    "Simplify the JSON schema (or tool parameters): fewer nested groups in `pattern`s, "
    "smaller `maxLength`/`maxItems`, fewer properties or `enum` values."
)


class GrammarError(EngineError):
    """A grammar (from a JSON schema or tool parameters) is too large, or llama.cpp refused it."""


@dataclass(frozen=True)
class GrammarShape:
    """What a grammar costs llama.cpp: its size, rules, deepest group and expanded repetitions."""

    bytes: int
    rules: int
    nesting: int
    repetitions: int


def measure_grammar(gbnf: str) -> GrammarShape:
    """The shape of `gbnf`, read in one pass without recursion (quotes and `[...]` skipped)."""
    depth = nesting = rules = repetitions = 0
    index, length = 0, len(gbnf)
    while index < length:
        char = gbnf[index]
        if char in '"[':
            index = _skip_quoted(gbnf, index, '"' if char == '"' else "]")
            continue
        if char == "#":
            index = _end_of_line(gbnf, index)
            continue
        if char == "(":
            depth += 1
            nesting = max(nesting, depth)
        elif char == ")":
            depth -= 1
        elif char == "{":
            count, index = _repetition_count(gbnf, index)
            repetitions += count
            continue
        elif gbnf.startswith("::=", index):
            rules += 1
        index += 1
    return GrammarShape(len(gbnf.encode()), rules, nesting, repetitions)


def check_grammar_bounds(gbnf: str) -> GrammarShape:
    """Refuses a grammar llama.cpp's parser cannot take safely, naming the limit and the value."""
    if len(gbnf) > MAX_GRAMMAR_BYTES:  # before measuring: a character is at least one byte
        _refuse("is larger than", f"{MAX_GRAMMAR_BYTES} bytes", f"{len(gbnf)} characters")
    shape = measure_grammar(gbnf)
    if shape.bytes > MAX_GRAMMAR_BYTES:
        _refuse("is larger than", f"{MAX_GRAMMAR_BYTES} bytes", f"{shape.bytes} bytes")
    if shape.rules > MAX_GRAMMAR_RULES:
        _refuse("has more rules than", f"{MAX_GRAMMAR_RULES}", f"{shape.rules} rules")
    if shape.nesting > MAX_GRAMMAR_NESTING:
        _refuse("nests groups deeper than", f"{MAX_GRAMMAR_NESTING} levels", f"{shape.nesting}")
    if shape.repetitions > MAX_GRAMMAR_REPETITIONS:
        _refuse(
            "repeats more than", f"{MAX_GRAMMAR_REPETITIONS} items", f"{shape.repetitions} items"
        )
    return shape


def _refuse(what: str, limit: str, found: str) -> None:
    raise GrammarError(
        f"The grammar for the requested output format {what} the limit of {limit} "
        f"(it has {found}).",
        hint=_HINT,
    )


def _skip_quoted(text: str, start: int, closing: str) -> int:
    index = start + 1
    while index < len(text) and text[index] != closing:
        index += 2 if text[index] == "\\" else 1
    return index + 1


def _end_of_line(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _repetition_count(text: str, start: int) -> tuple[int, int]:
    """How many items `{m}`, `{m,}` or `{m,n}` at `start` makes llama.cpp build, and the index
    after it; a count too long to read is reported as more than any limit."""
    end = text.find("}", start)
    if end < 0:
        return 0, start + 1  # llama.cpp refuses the unterminated brace itself
    counts = [part.strip() for part in text[start + 1 : end].split(",")]
    if any(
        len(part) > _MAX_COUNT_DIGITS or not (part.isascii() and part.isdigit())
        for part in counts
        if part
    ):
        return MAX_GRAMMAR_REPETITIONS + 1, end + 1
    return max((int(part) for part in counts if part), default=0), end + 1
