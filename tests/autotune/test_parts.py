"""`autotune/` keeps its shape (`autotune/__init__.py`): every module in one part, imports only
towards the plan and never in a circle, a plan that loads no engine and opens no database,
and one door for tuning, calibrating and planning."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hearthside.app
import hearthside.autotune
from hearthside.autotune import DOOR, MEASURE, PARTS, PLAN, STORE

pytestmark = pytest.mark.beside

PACKAGE = "hearthside.autotune"
SOURCE = Path(hearthside.autotune.__file__).parent
APP = Path(hearthside.app.__file__).parent
RANK = {PLAN: 0, STORE: 1, MEASURE: 2, DOOR: 3}
# Loading any of these loads llama.cpp or runs an engine.
ENGINE_MODULES = (
    "llama_cpp",
    "hearthside.core.engine.engine",
    "hearthside.core.engine.worker_engine",
    "hearthside.core.engine.worker",
    "hearthside.core.engine.service",
    "hearthside.core.engine.bench",
    "hearthside.core.engine.speculative",
)
DATABASE_MODULES = ("sqlite3", "hearthside.core.database", "hearthside.core.models.store")
# What `hearthside tune`, `calibrate` and `plan` and the wizard may import from autotune/:
# the door, and the plan's pure types and words.
THROUGH_THE_DOOR = ("calibrate_cli.py", "plan_cli.py", "tune_cli.py", "gui/wizard.py")


def modules_on_disk() -> set[str]:
    return {path.stem for path in SOURCE.glob("*.py") if path.stem != "__init__"}


def imported(path: Path) -> Iterator[str]:
    """Every module `path` imports at run time, at the top or inside a function (not the
    imports under `if TYPE_CHECKING:`, which only the type checker follows)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    checking_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and ast.unparse(branch.test).endswith("TYPE_CHECKING")
        for statement in branch.body
        for node in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in checking_only:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def autotune_imports(name: str) -> set[str]:
    prefix = PACKAGE + "."
    found = {m.removeprefix(prefix).split(".")[0] for m in imported(SOURCE / f"{name}.py")}
    return {m for m in found if m in PARTS and m != name}


def import_graph() -> dict[str, set[str]]:
    return {name: autotune_imports(name) for name in PARTS}


def test_every_module_belongs_to_one_part() -> None:
    assert modules_on_disk() == set(PARTS)
    assert set(PARTS.values()) == set(RANK)


def test_imports_go_towards_the_plan() -> None:
    backwards = [
        f"{name} ({PARTS[name]}) imports {other} ({PARTS[other]})"
        for name, others in import_graph().items()
        for other in others
        if RANK[PARTS[other]] > RANK[PARTS[name]]
    ]
    assert backwards == []


def test_the_import_picture_has_no_circles() -> None:
    graph = import_graph()
    done: set[str] = set()

    def circle_from(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for other in sorted(graph[name]):
            found = circle_from(other, [*path, name])
            if found:
                return found
        done.add(name)
        return None

    circles = [c for name in sorted(graph) if (c := circle_from(name, [])) is not None]
    assert circles == []


def test_only_the_measure_part_names_an_engine() -> None:
    naming = {
        name: sorted(m for m in imported(SOURCE / f"{name}.py") if m.startswith(ENGINE_MODULES))
        for name, part in PARTS.items()
        if part != MEASURE
    }
    assert {name: found for name, found in naming.items() if found} == {}


LOADED = """
import importlib, json, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by(part: str) -> set[str]:
    """Every module a fresh interpreter holds after importing `part`'s modules."""
    names = [f"{PACKAGE}.{name}" for name, where in PARTS.items() if where == part]
    result = subprocess.run(
        [sys.executable, "-c", LOADED, *names], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def test_the_plan_loads_no_engine_and_opens_no_database() -> None:
    loaded = loaded_by(PLAN)
    assert f"{PACKAGE}.planner" in loaded  # it did import the plan
    others = {f"{PACKAGE}.{name}" for name, part in PARTS.items() if part != PLAN}
    assert sorted(loaded & {*ENGINE_MODULES, *DATABASE_MODULES, *others}) == []


def test_the_store_loads_no_engine() -> None:
    loaded = loaded_by(STORE)
    assert f"{PACKAGE}.wisdom" in loaded and "sqlite3" in loaded
    measuring = {f"{PACKAGE}.{name}" for name, part in PARTS.items() if part in (MEASURE, DOOR)}
    assert sorted(loaded & {*ENGINE_MODULES, *measuring}) == []


def test_the_cli_and_the_wizard_tune_calibrate_and_plan_through_optimize() -> None:
    reaching_in = {
        path: sorted(
            module
            for module in {
                m.removeprefix(PACKAGE + ".").split(".")[0]
                for m in imported(APP / path)
                if m.startswith(PACKAGE + ".")
            }
            if module in PARTS and PARTS[module] != PLAN and module != "optimize"
        )
        for path in THROUGH_THE_DOOR
    }
    assert {path: found for path, found in reaching_in.items() if found} == {}
