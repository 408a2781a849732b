#!/usr/bin/env python3
"""Build the self-contained Linux (or macOS/Windows, on those systems) bundle with PyInstaller.

    .venv/bin/python packaging/build_bundle.py [--dist DIR]      (default: dist/)

Needs the `packaging` extra (`pip install -e .[packaging]`). Renders the icons, links the
source folders into `build/bundle-src/hearthside/`, runs PyInstaller on
packaging/hearthside.spec (work files in build/pyinstaller/), then checks that no model file
slipped in. The result, `dist/hearthside/`, runs as `dist/hearthside/hearthside`; the first
start downloads the default model from PyPI. Nothing here is committed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "packaging" / "hearthside.spec"
SOURCE_TREE = ROOT / "build" / "bundle-src"
WORK = ROOT / "build" / "pyinstaller"
SOURCE_FOLDERS = ("app", "core", "autotune", "kernels", "assets")
GGUF_MAGIC = b"GGUF"


def link_source_tree() -> Path:
    package = SOURCE_TREE / "hearthside"
    package.mkdir(parents=True, exist_ok=True)
    for folder in SOURCE_FOLDERS:
        link = package / folder
        if not link.is_symlink():
            shutil.rmtree(link, ignore_errors=True)
            link.symlink_to(ROOT / folder, target_is_directory=True)
    return SOURCE_TREE


def model_files(bundle: Path) -> list[Path]:
    """Files in `bundle` that are GGUF models (by their magic bytes)."""
    found = []
    for path in bundle.rglob("*"):
        if path.is_file() and not path.is_symlink():
            with path.open("rb") as handle:
                if handle.read(4) == GGUF_MAGIC:
                    found.append(path)
    return found


def folder_size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def build(dist: Path) -> Path:
    sys.path.insert(0, str(ROOT / "packaging"))
    from make_icons import write_icons

    write_icons(ROOT / "build" / "icons")
    link_source_tree()
    command = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        str(dist),
        "--workpath",
        str(WORK),
        str(SPEC),
    ]
    subprocess.run(command, check=True, cwd=ROOT, env=dict(os.environ))
    bundle = dist / "hearthside"
    models = model_files(bundle)
    if models:
        raise SystemExit(f"the bundle must not contain models, but has: {models}")
    return bundle


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="output folder")
    args = parser.parse_args(argv)
    started = time.monotonic()
    bundle = build(args.dist.resolve())
    print(
        f"built {bundle} in {time.monotonic() - started:.0f} s, "
        f"{folder_size_bytes(bundle) / 1e6:.0f} MB; run {bundle / 'hearthside'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
