"""One byte formatter and one set of unit constants (`core/units.py`) for the GUI and the CLI.

The scans read the source with `ast`: a module that defines KIB/MIB/GIB/GB (or a spelling of
them) itself, or a function that returns a size it divided by a byte unit and labelled, is a
second convention waiting to drift ("25.3 GB RAM" on one page, "23.5 GiB" on the next).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthside.core.units import GB, GIB, KIB, MIB, format_bytes, format_duration

pytestmark = pytest.mark.beside

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("app", "core", "autotune", "kernels")
UNITS_MODULE = ROOT / "core" / "units.py"
# bootstrap.py runs these as plain scripts before Hearthside is installed: standard library only,
# so they cannot import core/units.py (an import there stopped the first setup).
STANDALONE = {ROOT / "core" / "probe" / name for name in ("engine_build.py", "engine_ladder.py")}
CONSTANT_NAMES = {"KIB", "MIB", "GIB", "TIB", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB"}
BYTE_DIVISORS = {1024**k for k in (1, 2, 3, 4)} | {10 ** (3 * k) for k in (1, 2, 3, 4)}
UNIT_LABEL = re.compile(r"^\s*(KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB|G)\b(?!/s)")  # not "M"/"B": counts


def source_files() -> Iterator[Path]:
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path != UNITS_MODULE and path not in STANDALONE:
                yield path


def constant_definitions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        found += [(t.lineno, t.id) for t in targets if isinstance(t, ast.Name)]
    return [(line, name) for line, name in found if name in CONSTANT_NAMES]


def _is_byte_divisor(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id in CONSTANT_NAMES
    try:
        value = eval(compile(ast.Expression(node), "<divisor>", "eval"), {"__builtins__": {}})
    except Exception:  # a name or call: not a literal unit
        return False
    return isinstance(value, (int, float)) and value in BYTE_DIVISORS


def formats_bytes(string: ast.JoinedStr) -> bool:
    """True for f"{size / GIB:.1f} GiB"-like text (a size divided by a unit, then its label);
    speeds ("GB/s") are not sizes."""
    pieces = string.values
    for value, after in zip(pieces, pieces[1:], strict=False):
        divided = (
            isinstance(value, ast.FormattedValue)
            and isinstance(value.value, ast.BinOp)
            and isinstance(value.value.op, ast.Div)
            and _is_byte_divisor(value.value.right)
        )
        if divided and isinstance(after, ast.Constant) and UNIT_LABEL.match(str(after.value)):
            return True
    return False


def byte_formatters(tree: ast.AST) -> list[tuple[int, str]]:
    """Functions whose returned text is a formatted byte count."""
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Return) and node.value is not None:
                strings = [n for n in ast.walk(node.value) if isinstance(n, ast.JoinedStr)]
                if any(formats_bytes(s) for s in strings):
                    found.append((function.lineno, function.name))
                    break
    return found


def scan(finder) -> list[str]:
    problems = []
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        problems += [f"{path.relative_to(ROOT)}:{line} {name}" for line, name in finder(tree)]
    return problems


def test_no_module_defines_its_own_byte_constants() -> None:
    assert scan(constant_definitions) == []


def test_no_second_byte_formatter() -> None:
    assert scan(byte_formatters) == []


def test_the_scan_finds_a_formatter_and_a_constant() -> None:
    """The scans would catch the shapes that were replaced."""
    written = (
        "GIB = 1024**3\n"
        "def gib(value):\n"
        "    return f'{value / GIB:.1f} GiB' if value else 'unknown'\n"
        "def gb(size):\n"
        "    return f'{size / 10**9:.1f} GB'\n"
        "def speed(rate):\n"
        "    return f'{rate / 1e9:.1f} GB/s'\n"
    )
    tree = ast.parse(written)
    assert constant_definitions(tree) == [(1, "GIB")]
    assert byte_formatters(tree) == [(2, "gib"), (4, "gb")]


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (None, "unknown"),
        (12, "12 bytes"),
        (512 * KIB, "512 KiB"),
        (241 * MIB + 100, "241 MiB"),
        (int(23.5 * GIB), "23.5 GiB"),
        (-3 * GIB, "-3.0 GiB"),
        (1.5 * GIB, "1.5 GiB"),
    ],
)
def test_format_bytes_in_binary_units(size: float | None, text: str) -> None:
    assert format_bytes(size) == text


def test_the_same_memory_reads_the_same_everywhere() -> None:
    """A machine's 25.3 × 10^9 bytes of RAM: 23.6 GiB, never "25.3 GB" beside it."""
    ram = 25_300_000_000
    assert format_bytes(ram) == "23.6 GiB"
    assert GB == 10**9 and GIB == 1024**3


def test_a_wait_reads_in_the_largest_units_that_keep_it_exact() -> None:
    assert [format_duration(s) for s in (0, 45, 60, 90, 600, 3900, 7200)] == [
        "0 s",
        "45 s",
        "1 min",
        "1 min 30 s",
        "10 min",
        "1 h 5 min",
        "2 h",
    ]
    assert format_duration(78.4) == "1 min 18 s"
