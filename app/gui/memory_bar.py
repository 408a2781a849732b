"""Per-device memory bars for the Plan view: weights / KV cache / compute / overhead / free.

`bar_segments` turns a planner `DeviceBudget` into coloured segments (pure, tested directly);
`MemoryBar` paints them as one horizontal stacked bar, scaled to the device's usable memory,
with a red marker at the capacity line when the plan needs more than there is;
`DeviceMemoryView` adds the device's name, the totals and a legend with byte labels.
`ServingGpuView` shows one GPU of a vLLM serving plan (`GpuMemory`) with the same bar: weights,
KV cache (with the tokens it holds), activations and runtime, and what vLLM leaves free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from PySide6.QtCore import QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPaintEvent, QPen
from PySide6.QtWidgets import QGridLayout, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from hearthside.autotune.memory import CPU
from hearthside.autotune.planner import DeviceBudget
from hearthside.autotune.serving import GpuMemory
from hearthside.core.units import format_bytes

OVER_CAPACITY_COLOR = "#d32f2f"
# Mid-tone colours that read on both the light and the dark palette.
SEGMENT_STYLE: dict[str, tuple[str, str]] = {
    "weights": ("Weights", "#3f7fd9"),
    "kv": ("KV cache", "#2e9e6b"),
    "compute": ("Compute buffers", "#e39a2d"),
    "overhead": ("Runtime overhead", "#8e6cc9"),
}
FREE_KIND = "free"
# vLLM's parts of a GPU, in the words of the serving recipe.
SERVING_LABELS: dict[str, str] = {
    "weights": "Weights",
    "kv": "KV cache",
    "overhead": "Activations, CUDA graphs, runtime",
    FREE_KIND: "Left free",
}
BAR_HEIGHT = 22
SWATCH_SIZE = 12


@dataclass(frozen=True)
class BarSegment:
    kind: str  # "weights", "kv", "compute", "overhead" or "free"
    label: str
    size_bytes: int
    color: str | None  # None: the free part, drawn in the palette's background tone


def bar_segments(budget: DeviceBudget, labels: Mapping[str, str] | None = None) -> list[BarSegment]:
    """What the plan puts on this device, then what is left (never negative). `labels`
    renames parts; parts of size zero stay in (zero wide)."""
    names = {kind: style[0] for kind, style in SEGMENT_STYLE.items()} | {FREE_KIND: "Free"}
    names |= dict(labels or {})
    sizes = {
        "weights": budget.weights_bytes,
        "kv": budget.kv_bytes,
        "compute": budget.compute_bytes,
        "overhead": budget.overhead_bytes,
    }
    segments = [
        BarSegment(kind, names[kind], size, SEGMENT_STYLE[kind][1]) for kind, size in sizes.items()
    ]
    segments.append(BarSegment(FREE_KIND, names[FREE_KIND], max(0, budget.free_bytes), None))
    return segments


def serving_budget(gpu: GpuMemory) -> DeviceBudget:
    """A serving plan's GPU as a budget over its whole memory: the free part is then exactly
    what vLLM leaves outside --gpu-memory-utilization."""
    return DeviceBudget(
        device=gpu.device,
        capacity_bytes=gpu.total_bytes,
        weights_bytes=gpu.weights_bytes,
        kv_bytes=gpu.kv_bytes,
        compute_bytes=0,
        overhead_bytes=gpu.overhead_bytes,
    )


def device_title(budget: DeviceBudget) -> str:
    return "CPU · system memory" if budget.device == CPU else f"{budget.device} · graphics memory"


def usage_text(budget: DeviceBudget) -> str:
    used, capacity = format_bytes(budget.used_bytes), format_bytes(budget.capacity_bytes)
    if budget.free_bytes < 0:
        return f"needs {used}, only {capacity} usable — {format_bytes(-budget.free_bytes)} short"
    return f"{used} of {capacity} usable"


class MemoryBar(QWidget):
    """One stacked bar. The scale is the usable capacity, or what is needed when that is more."""

    def __init__(
        self,
        budget: DeviceBudget,
        parent: QWidget | None = None,
        *,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(parent)
        self.budget = budget
        self.segments = bar_segments(budget, labels)
        self.setMinimumWidth(200)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setToolTip(self.summary())
        self.setAccessibleName(f"Memory on {budget.device}")
        self.setAccessibleDescription(self.summary())

    @property
    def over_capacity(self) -> bool:
        return self.budget.free_bytes < 0

    def summary(self) -> str:
        parts = [f"{s.label} {format_bytes(s.size_bytes)}" for s in self.segments]
        return f"{self.budget.device}: {usage_text(self.budget)} ({', '.join(parts)})"

    def sizeHint(self) -> QSize:  # noqa: N802 (Qt's name)
        return QSize(400, BAR_HEIGHT)

    def scale_bytes(self) -> int:
        return max(self.budget.capacity_bytes, self.budget.used_bytes, 1)

    def segment_rects(self) -> list[tuple[BarSegment, QRectF]]:
        """Where each segment is drawn, left to right (empty segments included, zero wide)."""
        area = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        per_byte = area.width() / self.scale_bytes()
        rects, x = [], area.left()
        for segment in self.segments:
            width = segment.size_bytes * per_byte
            rects.append((segment, QRectF(x, area.top(), width, area.height())))
            x += width
        return rects

    def capacity_x(self) -> float:
        area = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        share = max(self.budget.capacity_bytes, 0) / self.scale_bytes()
        return area.left() + area.width() * share

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        area = QRectF(self.rect()).adjusted(0.5, 0.5, -0.5, -0.5)
        outline = QPainterPath()
        outline.addRoundedRect(area, 5, 5)
        painter.setClipPath(outline)
        painter.fillRect(area, self.palette().base())
        for segment, rect in self.segment_rects():
            if segment.color is not None and rect.width() > 0:
                painter.fillRect(rect, QColor(segment.color))
        painter.setClipping(False)
        painter.setPen(QPen(self.palette().mid().color(), 1))
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawPath(outline)
        if self.over_capacity:
            self._paint_capacity_marker(painter, area)
        painter.end()

    def _paint_capacity_marker(self, painter: QPainter, area: QRectF) -> None:
        x = self.capacity_x()
        painter.setPen(QPen(QColor(OVER_CAPACITY_COLOR), 3))
        painter.drawLine(QPointF(x, area.top() - 1), QPointF(x, area.bottom() + 1))


class DeviceMemoryView(QWidget):
    """A device's name and totals, its bar, and a legend with each part's size."""

    def __init__(
        self,
        budget: DeviceBudget,
        parent: QWidget | None = None,
        *,
        title: str | None = None,
        usage: str | None = None,
        labels: Mapping[str, str] | None = None,
        legend_extra: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(parent)
        self.budget = budget
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(6)
        heading = QHBoxLayout()
        title_label = QLabel(title or device_title(budget))
        title_label.setObjectName("cardTitle")
        self.usage_label = QLabel(usage or usage_text(budget))
        self.usage_label.setObjectName("problem" if budget.free_bytes < 0 else "muted")
        heading.addWidget(title_label)
        heading.addStretch(1)
        heading.addWidget(self.usage_label)
        column.addLayout(heading)
        self.bar = MemoryBar(budget, labels=labels)
        column.addWidget(self.bar)
        column.addLayout(self._legend(legend_extra or {}))

    def _legend(self, extra: Mapping[str, str]) -> QGridLayout:
        legend = QGridLayout()
        legend.setHorizontalSpacing(6)
        legend.setVerticalSpacing(2)
        self.legend_labels: dict[str, QLabel] = {}
        shown = [s for s in self.bar.segments if s.size_bytes or s.kind == FREE_KIND]
        for index, segment in enumerate(shown):
            swatch = QLabel()
            swatch.setFixedSize(SWATCH_SIZE, SWATCH_SIZE)
            fill = segment.color or "palette(base)"
            swatch.setStyleSheet(
                f"background: {fill}; border: 1px solid palette(mid); border-radius: 2px;"
            )
            suffix = f" {extra[segment.kind]}" if segment.kind in extra else ""
            text = QLabel(f"{segment.label} {format_bytes(segment.size_bytes)}{suffix}")
            self.legend_labels[segment.kind] = text
            row, column = divmod(index, 2 if extra else 3)
            legend.addWidget(swatch, row, column * 2, Qt.AlignmentFlag.AlignVCenter)
            legend.addWidget(text, row, column * 2 + 1)
        for column in range(2 if extra else 3):
            legend.setColumnStretch(column * 2 + 1, 1)
        return legend


class ServingGpuView(DeviceMemoryView):
    """One GPU of a vLLM serving plan: its bar over the GPU's whole memory, and the tokens of
    context its KV cache holds."""

    def __init__(self, gpu: GpuMemory, name: str, parent: QWidget | None = None) -> None:
        self.gpu = gpu
        used = gpu.weights_bytes + gpu.kv_bytes + gpu.overhead_bytes
        super().__init__(
            serving_budget(gpu),
            parent,
            title=f"{gpu.device} · {name}",
            usage=f"{format_bytes(used)} of {format_bytes(gpu.total_bytes)} in use",
            labels=SERVING_LABELS,
            legend_extra={"kv": f"({gpu.kv_tokens:,} tokens)"},
        )
