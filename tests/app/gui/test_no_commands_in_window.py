"""No text in the window sends people to the command line or the environment.

Every string literal under `app/gui/` (read with `ast`, f-strings' literal parts included) is
checked for a `hearthside <subcommand>` command, a `HEARTHSIDE_*` variable and a backticked
command. Docstrings and comments are for developers and are skipped, and so are the names of
the environment variables the code itself reads (constants ending in `_ENV`): they are never
shown. What the window offers instead is a button or a setting.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.beside

GUI = Path(__file__).resolve().parents[3] / "app" / "gui"
COMMAND = re.compile(r"\bhearthside [a-z][a-z-]+")
ENV_NAME = re.compile(r"HEARTHSIDE_[A-Z_]+")
BACKTICKED = re.compile(r"`[^`\n]+`")


def _docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _env_name_constants(tree: ast.AST) -> set[int]:
    """`X_ENV = "HEARTHSIDE_X"`: a name the code reads from the environment, not a text."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if names and all(name.endswith("_ENV") for name in names):
                found.add(id(node.value))
    return found


def shown_strings(source: str) -> Iterator[tuple[int, str]]:
    tree = ast.parse(source)
    skipped = _docstring_nodes(tree) | _env_name_constants(tree)
    # An f-string's literal parts carry its own line (Python 3.11 misplaces theirs).
    lines = {
        id(part): node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    for node in ast.walk(tree):
        text = node.value if isinstance(node, ast.Constant) else None
        if isinstance(text, str) and id(node) not in skipped:
            yield lines.get(id(node), node.lineno), text


def problems_in(source: str) -> list[str]:
    found = []
    for line, text in sorted(shown_strings(source)):
        for pattern in (COMMAND, ENV_NAME, BACKTICKED):
            match = pattern.search(text)
            if match:
                found.append(f"{line}: {match.group(0)!r}")
    return found


def test_no_window_text_asks_for_a_command_or_an_environment_variable() -> None:
    problems = []
    for path in sorted(GUI.glob("*.py")):
        found = problems_in(path.read_text(encoding="utf-8"))
        problems += [f"{path.name}:{problem}" for problem in found]
    assert problems == []


def test_the_scan_catches_each_kind_and_skips_docstrings_and_env_names() -> None:
    source = (
        '"""Run `hearthside calibrate` (a docstring: for developers)."""\n'
        'MARKER_ENV = "HEARTHSIDE_STARTUP_MARKER"\n'
        'a = "Not calibrated yet: run hearthside calibrate."\n'
        'b = f"the hub address in settings (HEARTHSIDE_HUB_ENDPOINT) for {name}"\n'
        'c = "`engine rebuild` fixes it"\n'
        'd = "Press “Measure this machine”."\n'
    )
    assert problems_in(source) == [
        "3: 'hearthside calibrate'",
        "4: 'HEARTHSIDE_HUB_ENDPOINT'",
        "5: '`engine rebuild`'",
    ]
