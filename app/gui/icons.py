"""Icons from the SVGs in `assets/`, drawn in the palette's text colour.

The line icons use `currentColor`; Qt's SVG renderer has no notion of it, so the colour is
written into the SVG text before rendering. That is what lets one set of files serve both the
light and the dark theme.
"""

from __future__ import annotations

import functools
from importlib.resources import files

from PySide6.QtCore import QByteArray, QSize, Qt
from PySide6.QtGui import QColor, QIcon, QImage, QPainter, QPixmap
from PySide6.QtSvg import QSvgRenderer

ICON_SIZES = (16, 20, 24, 32, 48, 64)


@functools.cache
def svg_text(name: str) -> str:
    """The SVG source of `assets/icon-<name>.svg`."""
    return (files("hearthside.assets") / f"icon-{name}.svg").read_text(encoding="utf-8")


def _render(svg: str, size: int) -> QPixmap:
    renderer = QSvgRenderer(QByteArray(svg.encode("utf-8")))
    image = QImage(QSize(size, size), QImage.Format.Format_ARGB32_Premultiplied)
    image.fill(Qt.GlobalColor.transparent)
    painter = QPainter(image)
    renderer.render(painter)
    painter.end()
    return QPixmap.fromImage(image)


def icon(name: str, color: QColor | str | None = None) -> QIcon:
    """The named icon; line icons take `color` (default: black)."""
    colour = QColor(color) if color is not None else QColor("black")
    svg = svg_text(name).replace("currentColor", colour.name())
    result = QIcon()
    for size in ICON_SIZES:
        result.addPixmap(_render(svg, size))
    return result


def app_icon() -> QIcon:
    return icon("app")
