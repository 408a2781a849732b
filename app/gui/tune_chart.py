"""The wizard's live chart of tuning candidates: predicted vs measured decode speed, and memory.

One column group per candidate the tuner reached, in the order it reached them: a light bar
for the cost model's predicted decode tok/s beside a solid bar for what the engine measured,
the candidate's settings and its quality (mean KL divergence against the f16 KV cache, once
measured) under it, and a strip for the memory llama.cpp allocated. A
candidate that ran out of memory or failed keeps its place, drawn as such in red, so a sweep
with failures reads honestly; one the time budget cut off (never started, or stopped at its
deadline) is drawn in a neutral dashed outline as "not measured": nothing is known of it but
its prediction. Painted by hand (QtCharts is not in PySide6-Essentials) from the
palette, so it follows the light and dark themes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

from PySide6.QtCore import QEvent, QPointF, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QHelpEvent, QPainter, QPaintEvent, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from hearthside.autotune.tuner import TuneEvent
from hearthside.autotune.wisdom import config_key
from hearthside.core.units import format_bytes

EntryState = Literal[
    "measuring",
    "measured",
    "reused",
    "failed",
    "oom",
    "crashed",
    "skipped",
    "stopped",
    "unmeasured",
]
MIN_GROUPS = 6  # so two candidates do not become two giant bars
LEFT, RIGHT, TOP = 48.0, 12.0, 34.0
LABEL_LINES = 3  # two of settings, one of quality
MEMORY_ROW = 22.0
FAILURE_COLOURS = {False: "#c5221f", True: "#f28b82"}  # by dark theme
BEST_COLOURS = {False: "#188038", True: "#81c995"}


@dataclass(frozen=True)
class ChartEntry:
    """One candidate as the chart shows it."""

    index: int  # the tuner's 1-based position
    config: dict[str, Any]
    state: EntryState
    predicted_tps: float | None = None
    measured_tps: float | None = None
    memory_bytes: int | None = None
    note: str = ""
    baseline: str = ""  # whose defaults: "llama.cpp", "llama-cpp-python" or "" (a candidate)
    chosen: bool = False
    quality: str = ""  # e.g. "KLD 0.002"; "" until known
    over_budget: bool = False  # its KLD is over the goal's budget: not chosen for it
    variant: str = ""  # an installed quant variant's label ("Q4_0") when the run is of that file

    @property
    def has_result(self) -> bool:
        return self.state in ("measured", "reused")


BASELINE_NAMES = {"llama.cpp": "llama.cpp defaults", "llama-cpp-python": "Llama() defaults"}


def candidate_label(
    config: dict[str, Any], baseline: str = "", variant: str = ""
) -> tuple[str, str]:
    """Two short lines naming a candidate's settings (and its file, for a quant variant)."""
    threads = config.get("n_threads")
    first = BASELINE_NAMES.get(baseline) or f"{threads} thread{'s' if threads != 1 else ''}"
    if variant:
        first = f"{variant} file · {first}"
    flash = "FA on" if config.get("flash_attn") else "FA off"
    second = f"{flash} · ub {config.get('n_ubatch')} · KV {config.get('type_k')}"
    return first, second


def memory_text(size_bytes: int | None) -> str:
    return format_bytes(size_bytes, unknown="–")


def entry_description(entry: ChartEntry) -> str:
    """The tooltip and accessible text of one candidate."""
    first, second = candidate_label(entry.config, entry.baseline, entry.variant)
    parts = [f"Candidate {entry.index}: {first}, {second}"]
    if entry.predicted_tps is not None:
        parts.append(f"predicted {entry.predicted_tps:.1f} tok/s")
    if entry.measured_tps is not None:
        parts.append(f"measured {entry.measured_tps:.1f} tok/s")
    if entry.memory_bytes is not None:
        parts.append(f"memory {memory_text(entry.memory_bytes)}")
    if entry.quality:
        budget = " — over the quality budget, not chosen" if entry.over_budget else ""
        parts.append(f"quality {entry.quality}{budget}")
    state_words = {
        "measuring": "being measured",
        "reused": "measured before (from the autotune database)",
        "failed": "failed",
        "oom": "ran out of memory",
        "crashed": "crashed the engine (Hearthside carried on with the next)",
        "skipped": "skipped: it failed before",
        "stopped": "stopped before it finished",
        "unmeasured": "not measured (cut off by the time budget; not a failure)",
    }
    if entry.state in state_words:
        parts.append(state_words[entry.state])
    if entry.note:
        parts.append(entry.note)
    return "; ".join(parts)


def nice_ceiling(value: float) -> float:
    """The smallest 1/2/2.5/5 × 10^k at or above `value` (an axis top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if value <= step * power:
            return step * power
    return 10 * power


class TuneChart(QWidget):
    """Grouped bars per candidate; feed it with `add_event`, finish it with `mark_chosen`."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.entries: list[ChartEntry] = []
        self.setMinimumSize(QSize(480, 240))
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setAccessibleName("Candidates measured")

    # ---- data ----------------------------------------------------------------------------

    def clear(self) -> None:
        self.entries = []
        self._changed()

    def add_event(self, event: TuneEvent) -> None:
        """One tuner event, with the memory of its run and the kind of a failure."""
        if event.kind == "done":
            return
        entry = ChartEntry(
            index=event.index,
            config=event.config,
            state=_state(event),
            predicted_tps=event.predicted_decode_tps,
            measured_tps=event.decode_tps,
            memory_bytes=event.memory_bytes,
            note=event.message,
            baseline=event.baseline,
            variant=event.variant,
        )
        self._put(entry)

    def stop_pending(self) -> None:
        """The run ended: a candidate still marked as measuring was stopped."""
        self.entries = [
            replace(e, state="stopped") if e.state == "measuring" else e for e in self.entries
        ]
        self._changed()

    def mark_chosen(self, config: dict[str, Any] | None, variant: str = "") -> None:
        """Highlight the winner (`config` as the tuner stored it, on the tuned file or on the
        quant variant `variant`; None: no winner)."""
        chosen = (config_key(config), variant) if config is not None else None
        self.entries = [
            replace(
                e,
                chosen=e.baseline != "llama-cpp-python"
                and (config_key(e.config), e.variant) == chosen,
            )
            for e in self.entries
        ]
        self._changed()

    def mark_quality(self, kv_type: str, text: str, over_budget: bool, variant: str = "") -> None:
        """The quality of every candidate with a `kv_type` KV cache on the same file (the
        tuned one, or the quant variant `variant`)."""
        self.entries = [
            replace(e, quality=text, over_budget=over_budget)
            if e.config.get("type_k") == kv_type and e.variant == variant
            else e
            for e in self.entries
        ]
        self._changed()

    def _put(self, entry: ChartEntry) -> None:
        for position, existing in enumerate(self.entries):
            if existing.index == entry.index:
                self.entries[position] = entry
                break
        else:
            self.entries.append(entry)
        self._changed()

    def _changed(self) -> None:
        self.setAccessibleDescription(". ".join(map(entry_description, self.entries)))
        self.update()

    # ---- geometry ------------------------------------------------------------------------

    def _plot_rect(self) -> QRectF:
        line = QFontMetrics(self.font()).height()
        bottom = LABEL_LINES * line + MEMORY_ROW + 10
        return QRectF(
            LEFT, TOP, self.width() - LEFT - RIGHT, self.height() - TOP - bottom
        ).normalized()

    def _group_width(self, plot: QRectF) -> float:
        return plot.width() / max(len(self.entries), MIN_GROUPS)

    def _axis_top(self) -> float:
        values = [
            value
            for entry in self.entries
            for value in (entry.predicted_tps, entry.measured_tps)
            if value is not None
        ]
        return nice_ceiling(max(values, default=10.0) * 1.12)

    def entry_at(self, x: float) -> ChartEntry | None:
        plot = self._plot_rect()
        position = int((x - plot.left()) // self._group_width(plot))
        if x < plot.left() or not 0 <= position < len(self.entries):
            return None
        return self.entries[position]

    # ---- painting ------------------------------------------------------------------------

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802 (Qt's name)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        plot = self._plot_rect()
        top = self._axis_top()
        self._paint_axis(painter, plot, top)
        self._paint_legend(painter)
        if not self.entries:
            self._paint_empty(painter, plot)
        heaviest = max((e.memory_bytes or 0 for e in self.entries), default=0)
        for position, entry in enumerate(self.entries):
            group = self._group_width(plot)
            rect = QRectF(plot.left() + position * group, plot.top(), group, plot.height())
            self._paint_entry(painter, rect, entry, top, heaviest)
        painter.end()

    def _colours(self) -> dict[str, QColor]:
        palette = self.palette()
        accent = palette.highlight().color()
        dark = palette.window().color().lightness() < 128
        predicted = QColor(accent)
        predicted.setAlpha(60)
        return {
            "text": palette.windowText().color(),
            "muted": palette.placeholderText().color(),
            "grid": palette.mid().color(),
            "measured": accent,
            "predicted": predicted,
            "failed": QColor(FAILURE_COLOURS[dark]),
            "best": QColor(BEST_COLOURS[dark]),
        }

    def _paint_axis(self, painter: QPainter, plot: QRectF, top: float) -> None:
        colours = self._colours()
        metrics = QFontMetrics(self.font())
        for step in range(5):
            value = top * step / 4
            y = plot.bottom() - plot.height() * step / 4
            painter.setPen(
                QPen(colours["grid"], 1, Qt.PenStyle.DotLine if step else Qt.PenStyle.SolidLine)
            )
            painter.drawLine(QPointF(plot.left(), y), QPointF(plot.right(), y))
            painter.setPen(colours["muted"])
            text = f"{value:g}"
            painter.drawText(
                QPointF(
                    plot.left() - 6 - metrics.horizontalAdvance(text), y + metrics.ascent() / 2.5
                ),
                text,
            )
        painter.save()
        painter.translate(12, plot.center().y())
        painter.rotate(-90)
        label = "decode tok/s"
        painter.drawText(QPointF(-metrics.horizontalAdvance(label) / 2, 0), label)
        painter.restore()

    def _paint_legend(self, painter: QPainter) -> None:
        colours = self._colours()
        metrics = QFontMetrics(self.font())
        x = LEFT
        y = 10.0
        for name, fill, outline in (
            ("predicted", colours["predicted"], colours["measured"]),
            ("measured", colours["measured"], colours["measured"]),
            ("failed / out of memory", colours["failed"], colours["failed"]),
            ("not measured", None, colours["muted"]),
        ):
            dashed = Qt.PenStyle.DashLine if fill is None else Qt.PenStyle.SolidLine
            painter.setPen(QPen(outline, 1, dashed))
            painter.setBrush(fill if fill is not None else Qt.BrushStyle.NoBrush)
            painter.drawRoundedRect(QRectF(x, y, 12, 12), 2, 2)
            painter.setPen(colours["text"])
            painter.drawText(QPointF(x + 17, y + 10), name)
            x += 17 + metrics.horizontalAdvance(name) + 18
        painter.setPen(colours["muted"])
        painter.drawText(QPointF(x, y + 10), "strip below: memory llama.cpp allocated")

    def _paint_empty(self, painter: QPainter, plot: QRectF) -> None:
        painter.setPen(self._colours()["muted"])
        painter.drawText(
            plot, Qt.AlignmentFlag.AlignCenter, "Candidates appear here as they are measured."
        )

    def _paint_entry(
        self, painter: QPainter, rect: QRectF, entry: ChartEntry, top: float, heaviest: int
    ) -> None:
        colours = self._colours()
        bar_width = min(rect.width() * 0.3, 34.0)
        middle = rect.center().x()
        predicted_rect = self._bar(
            rect, middle - bar_width - 1, bar_width, entry.predicted_tps, top
        )
        if predicted_rect is not None:
            painter.setPen(QPen(colours["measured"], 1))
            painter.setBrush(colours["predicted"])
            painter.drawRect(predicted_rect)
        measured_x = middle + 1
        if entry.has_result:
            measured_rect = self._bar(rect, measured_x, bar_width, entry.measured_tps, top)
            if measured_rect is not None:
                colour = colours["best"] if entry.chosen else colours["measured"]
                painter.setPen(Qt.PenStyle.NoPen)
                painter.setBrush(colour)
                painter.drawRect(measured_rect)
                self._value_text(painter, measured_rect, entry)
        else:
            self._state_mark(painter, rect, measured_x, bar_width, entry)
        self._labels(painter, rect, entry)
        self._memory_strip(painter, rect, entry, heaviest)

    def _bar(
        self, rect: QRectF, x: float, width: float, value: float | None, top: float
    ) -> QRectF | None:
        if value is None or value <= 0:
            return None
        height = rect.height() * min(value / top, 1.0)
        return QRectF(x, rect.bottom() - height, width, height)

    def _value_text(self, painter: QPainter, bar: QRectF, entry: ChartEntry) -> None:
        colours = self._colours()
        text = f"{entry.measured_tps:.0f}"
        if entry.chosen:
            text = f"★ {text}"
        painter.setPen(colours["best"] if entry.chosen else colours["text"])
        metrics = QFontMetrics(self.font())
        x = bar.center().x() - metrics.horizontalAdvance(text) / 2
        painter.drawText(QPointF(x, bar.top() - 4), text)

    def _state_mark(
        self, painter: QPainter, rect: QRectF, x: float, width: float, entry: ChartEntry
    ) -> None:
        colours = self._colours()
        words = {
            "measuring": "measuring…",
            "failed": "failed",
            "oom": "out of memory",
            "crashed": "crashed",
            "skipped": "skipped",
            "stopped": "stopped",
            "unmeasured": "not measured",
        }
        bad = entry.state in ("failed", "oom", "crashed")
        colour = colours["failed"] if bad else colours["muted"]
        mark = QRectF(x, rect.bottom() - rect.height() * 0.25, width, rect.height() * 0.25)
        pen = QPen(colour, 1.5, Qt.PenStyle.SolidLine if bad else Qt.PenStyle.DashLine)
        painter.setPen(pen)
        painter.setBrush(Qt.BrushStyle.NoBrush)
        painter.drawRect(mark)
        if bad:
            painter.drawLine(mark.topLeft(), mark.bottomRight())
            painter.drawLine(mark.topRight(), mark.bottomLeft())
        painter.save()
        painter.translate(mark.center().x() + 4, mark.top() - 6)
        painter.rotate(-90)
        painter.setPen(colour)
        painter.drawText(QPointF(0, 0), words.get(entry.state, entry.state))
        painter.restore()

    def _labels(self, painter: QPainter, rect: QRectF, entry: ChartEntry) -> None:
        colours = self._colours()
        metrics = QFontMetrics(self.font())
        first, second = candidate_label(entry.config, entry.baseline, entry.variant)
        y = rect.bottom() + metrics.ascent() + 4
        quality_colour = colours["failed"] if entry.over_budget else colours["muted"]
        lines = (
            (first, colours["text"]),
            (second, colours["muted"]),
            (entry.quality, quality_colour),
        )
        for line, colour in lines:
            text = metrics.elidedText(line, Qt.TextElideMode.ElideRight, int(rect.width()) - 4)
            painter.setPen(colour)
            painter.drawText(
                QPointF(rect.center().x() - metrics.horizontalAdvance(text) / 2, y), text
            )
            y += metrics.height()

    def _memory_strip(
        self, painter: QPainter, rect: QRectF, entry: ChartEntry, heaviest: int
    ) -> None:
        colours = self._colours()
        metrics = QFontMetrics(self.font())
        top = rect.bottom() + LABEL_LINES * metrics.height() + 8
        track = QRectF(rect.left() + 6, top, rect.width() - 12, 5)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(colours["predicted"])
        painter.drawRoundedRect(track, 2, 2)
        if entry.memory_bytes and heaviest:
            filled = QRectF(
                track.left(), track.top(), track.width() * entry.memory_bytes / heaviest, 5
            )
            painter.setBrush(colours["muted"])
            painter.drawRoundedRect(filled, 2, 2)
        small = QFont(self.font())
        small.setPointSizeF(max(6.0, self.font().pointSizeF() * 0.85))
        painter.setFont(small)
        painter.setPen(colours["muted"])
        text = memory_text(entry.memory_bytes)
        width = QFontMetrics(small).horizontalAdvance(text)
        painter.drawText(QPointF(rect.center().x() - width / 2, track.bottom() + 12), text)
        painter.setFont(self.font())

    # ---- tooltips ------------------------------------------------------------------------

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.ToolTip and isinstance(event, QHelpEvent):
            entry = self.entry_at(event.pos().x())
            if entry is None:
                QToolTip.hideText()
            else:
                QToolTip.showText(event.globalPos(), entry_description(entry), self)
            return True
        return super().event(event)


def _state(event: TuneEvent) -> EntryState:
    outcome = event.outcome
    if event.kind == "start":
        return "measuring"
    if event.kind == "measured":
        return "measured"
    if event.kind == "reused":
        return "reused"
    if event.kind == "skipped":
        return "skipped"
    if event.kind == "unmeasured" or outcome == "timeout":  # cut off by the budget: no failure
        return "unmeasured"
    if outcome == "oom":
        return "oom"
    return "crashed" if outcome == "crashed" else "failed"
