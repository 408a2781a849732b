"""Only app/ may import Qt: every core/autotune/kernels module imports with PySide6 blocked."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.beside

SCRIPT = """
import importlib, pkgutil, sys
sys.modules["PySide6"] = None  # any `import PySide6...` now raises ImportError
import hearthside.core, hearthside.autotune, hearthside.kernels
names = []
for package in (hearthside.core, hearthside.autotune, hearthside.kernels):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        importlib.import_module(info.name)
        names.append(info.name)
print(len(names))
"""


def test_core_layers_import_without_qt() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) >= 8  # the engine, models and settings modules at least
