#!/usr/bin/env python3
"""Render the app icon for every platform from the one SVG, assets/icon-app.svg.

    .venv/bin/python packaging/make_icons.py [OUTDIR]      (default: build/icons)

Writes `hicolor/<n>x<n>/apps/<id>.png` and `hicolor/scalable/apps/<id>.svg` (Linux),
`<id>.icns` (macOS) and `<id>.ico` (Windows). The output is generated, never committed;
`hearthside install-launcher` renders the same icons itself at install time.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hearthside.app.launcher import APP_ID, PNG_SIZES, IconSet, render_icons

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "build" / "icons"


def icon_files(icons: IconSet) -> dict[str, bytes]:
    """Relative path -> content, for every platform."""
    files = {f"hicolor/{size}x{size}/apps/{APP_ID}.png": icons.png[size] for size in PNG_SIZES}
    files[f"hicolor/scalable/apps/{APP_ID}.svg"] = icons.svg
    files[f"{APP_ID}.icns"] = icons.icns()
    files[f"{APP_ID}.ico"] = icons.ico()
    return files


def write_icons(out: Path) -> list[Path]:
    written = []
    for relative, content in icon_files(render_icons()).items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        written.append(target)
    return written


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    written = write_icons(out)
    print(f"wrote {len(written)} icon files under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
