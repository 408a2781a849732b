"""The Hardware page: what the machine is good for in plain words first, then what it has,
what the engine can use, what each processor feature means, the calibration, and the probe's
advice, with a button for each fix Hearthside can run itself.

The summary ("2 cores with AVX-512 and 23.5 GiB of memory: …") comes from the planner's
predictions for a ladder of catalog model sizes on this machine, with its calibration when it
has one — nothing is hard-coded. The calibration card shows a short summary (memory speed,
compute, disk, whether other programs disturbed the measurements) and the raw figures behind
"Details"; "Measure this machine" runs the same calibration the wizard runs, as one
EngineService job (chats wait meanwhile), and the page then reads it again.

The probe runs in a child process (`probe_in_subprocess`) on a worker thread, so a hanging
driver neither freezes nor crashes the window; the calibration comes from the window's
`MachineState` (read on a worker thread: another Hearthside may hold the DB's lock for a
moment), which tells the page each time it reads it again — after "Measure this machine", the
wizard's calibration or tuning, or Apply — and the predictions are made on a worker too. A
fix runs as a command of Hearthside's own in a QProcess after the user confirms it; its output
streams into a log box on the page.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QProcess, Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QFormLayout,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.labels import make_label as _label
from hearthside.app.gui.machine_state import MachineState
from hearthside.app.gui.workers import MainThreadRelay, run_in_background
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.planner import plan
from hearthside.core.errors import EngineError, HearthsideError, describe_error
from hearthside.core.models.catalog import catalog_entry, catalog_spec
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.engine_build import GpuTarget, choose_build
from hearthside.core.probe.engine_ladder import library_identity, read_record, record_rows
from hearthside.core.probe.profile import (
    Advice,
    DiskInfo,
    EngineInfo,
    GpuInfo,
    HardwareProfile,
)
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.units import GB, GIB, format_bytes
from hearthside.kernels.measurement import Measurement
from hearthside.kernels.results import CalibrationError, CalibrationReport

if TYPE_CHECKING:
    from hearthside.core.engine.service import EngineService

MEASURE_BUTTON_TEXT = "Measure this machine"
NOT_CALIBRATED = (
    "Not calibrated yet: the speeds above use typical figures for this kind of machine. "
    f"Press “{MEASURE_BUTTON_TEXT}” (about a minute; chats wait meanwhile) for figures of its own."
)
MEASURE_AGAIN = f"Press “{MEASURE_BUTTON_TEXT}” to measure it again with this version."
DISTURBED = (
    "The measurements were disturbed: other programs were busy while they ran, so the figures "
    "may be low. Measure again when the computer is idle."
)
MEASURING = "Measuring this machine: memory, compute, disk and the engine…"
READING_CALIBRATION = "Reading this machine's calibration…"
BACKEND_NAMES = {
    "cuda": "CUDA",
    "hip": "ROCm/HIP",
    "metal": "Metal",
    "vulkan": "Vulkan",
    "cpu": "the CPU",
}
OS_NAMES = {"linux": "Linux", "darwin": "macOS", "windows": "Windows"}
# Subcommands a fix button may run; anything else in an advice's fix is shown as text only.
RUNNABLE_SUBCOMMANDS = {("engine", "rebuild")}
MAX_LOG_BLOCKS = 5000

STYLE = """
QFrame#card { background: palette(base); border: 1px solid palette(midlight);
              border-radius: 8px; }
QLabel#cardTitle { font-weight: 600; }
QLabel#pageTitle { font-size: 16pt; font-weight: 600; }
QLabel#muted { color: gray; }
QLabel#problem { color: #c62828; }
QFrame#advice { background: #fff8e1; border: 1px solid #ffe082; border-radius: 6px; }
QFrame#advice QLabel { color: #3e2f00; }
"""

Row = tuple[str, str]


# ---- what to show: pure functions of the profile ---------------------------------------------


def processor_rows(profile: HardwareProfile) -> list[Row]:
    cpu = profile.cpu
    rows = [("Processor", f"{cpu.model or 'Unknown model'} ({cpu.arch})")]
    cores = f"{cpu.physical_cores or '?'} cores, {cpu.logical_cores or '?'} threads"
    if cpu.efficiency_cores:
        cores += f" ({cpu.performance_cores} performance + {cpu.efficiency_cores} efficiency)"
    rows.append(("Cores", cores))
    rows.append(("Instruction sets", " · ".join(f.upper() for f in cpu.flags) or "none known"))
    if (cpu.sockets or 1) > 1 or (cpu.numa_nodes or 1) > 1:
        rows.append(("Layout", f"{cpu.sockets or '?'} sockets, {cpu.numa_nodes or '?'} NUMA nodes"))
    rows += memory_rows(profile)
    system = OS_NAMES.get(profile.os, profile.os)
    rows.append(("System", f"{system} {profile.os_version or ''}".strip()))
    return rows


def memory_rows(profile: HardwareProfile) -> list[Row]:
    memory = profile.memory
    text = f"{format_bytes(memory.total_bytes)} total"
    if memory.available_bytes is not None:
        text += f", {format_bytes(memory.available_bytes)} free"
    rows = [("Memory", text)]
    if memory.cgroup_limit_bytes is not None:
        rows.append(("Container limit", format_bytes(memory.cgroup_limit_bytes)))
    if memory.swap_total_bytes:
        rows.append(("Swap", format_bytes(memory.swap_total_bytes)))
    return rows


def gpu_rows(gpu: GpuInfo) -> list[Row]:
    memory = format_bytes(gpu.vram_total_bytes)
    if gpu.vram_free_bytes is not None:
        memory += f" ({format_bytes(gpu.vram_free_bytes)} free)"
    if gpu.unified_memory:
        memory += ", shared with the CPU"
    rows = [("Architecture", gpu.arch or "unknown"), ("Memory", memory)]
    if gpu.memory_bandwidth_bytes_per_s:
        rows.append(("Bandwidth", f"{gpu.memory_bandwidth_bytes_per_s / 1e9:,.0f} GB/s"))
    driver = gpu.driver_version or "unknown"
    if gpu.runtime_version:
        driver += f" ({_runtime_name(gpu)} {gpu.runtime_version})"
    rows.append(("Driver", driver))
    if gpu.pcie_generation and gpu.pcie_width:
        rows.append(("PCIe link", f"Gen {gpu.pcie_generation} ×{gpu.pcie_width}"))
    return rows


def _runtime_name(gpu: GpuInfo) -> str:
    return {"nvidia": "CUDA", "amd": "ROCm", "apple": "Metal"}.get(gpu.vendor, "runtime")


def gpu_title(gpu: GpuInfo) -> str:
    index = "" if gpu.index is None else f"GPU {gpu.index}: "
    kind = " (integrated)" if gpu.integrated else ""
    return f"{index}{gpu.name}{kind}"


def disk_rows(disk: DiskInfo) -> list[Row]:
    kind = {True: "spinning disk", False: "SSD", None: "disk type unknown"}[disk.rotational]
    rows = [("Models folder", disk.path), ("Kind", kind)]
    if disk.free_bytes is not None:
        rows.append(
            ("Free space", f"{format_bytes(disk.free_bytes)} of {format_bytes(disk.total_bytes)}")
        )
    if disk.read_bytes_per_s:
        rows.append(("Read speed", f"{disk.read_bytes_per_s / 1e9:.1f} GB/s"))
    return rows


def engine_rows(engine: EngineInfo | None) -> list[Row]:
    if engine is None:
        return [("Engine", "not inspected")]
    rows = [
        ("Engine", f"llama-cpp-python {engine.package_version or '(version unknown)'}"),
        ("Backends", ", ".join(engine.backends) or "none"),
        ("GPU offload", "available" if engine.gpu_offload else "no: the CPU does all the work"),
    ]
    for device in engine.devices:
        memory = f", {format_bytes(device.memory_total_bytes)}" if device.memory_total_bytes else ""
        rows.append((device.name, f"{device.description} ({device.kind}{memory})"))
    return rows


def build_rows(home: Path | None = None) -> list[Row]:
    """How the engine build was chosen and how its self-test went (engine-build.json); where
    the terminal's words name a command, the page names its button instead."""
    record = read_record(home or data_dir())
    if record is None:
        return [("Build", f"not tested on this machine yet: “{SELF_TEST.label}” tests it")]
    rows = record_rows(record, current=True)
    if not engine_record_current(home):
        rows.append(("Self-test", f"the engine changed since: “{SELF_TEST.label}” tests it again"))
    return rows


def engine_record_current(home: Path | None = None) -> bool:
    record = read_record(home or data_dir())
    return record is not None and record.self_test.library == library_identity()


@dataclass(frozen=True)
class FixAction:
    """A fix Hearthside can run for the user: `hearthside <arguments>`."""

    label: str
    arguments: tuple[str, ...]
    changes_engine: bool = True  # a rebuild: the running Hearthside keeps the old one

    @property
    def command_line(self) -> str:
        return shlex.join(("hearthside", *self.arguments))


SELF_TEST = FixAction("Test the engine", ("engine", "selftest"), changes_engine=False)


def fix_action(advice: Advice, profile: HardwareProfile) -> FixAction | None:
    """The button for this advice, when its fix is a `hearthside` command we may run."""
    if advice.fix is None or not advice.fix.startswith("hearthside "):
        return None
    try:
        words = shlex.split(advice.fix)[1:]
    except ValueError:
        return None
    if tuple(words[:2]) not in RUNNABLE_SUBCOMMANDS:
        return None
    if words == ["engine", "rebuild"]:
        return rebuild_action(profile)
    return FixAction(f"Run {advice.fix}", tuple(words))


def rebuild_action(profile: HardwareProfile) -> FixAction:
    """`engine rebuild` with the backend named, so the user confirms exactly what will run."""
    targets = [GpuTarget(g.vendor, g.arch, g.name, g.vram_total_bytes) for g in profile.gpus]
    build = choose_build(targets, platform=profile.os, machine=profile.cpu.arch)
    name = BACKEND_NAMES.get(build.backend, build.backend)
    return FixAction(
        f"Rebuild the engine for {name}", ("engine", "rebuild", "--backend", build.backend)
    )


def fix_command(action: FixAction) -> list[str]:
    """The process to start: this Python running the `hearthside` CLI."""
    return [sys.executable, "-m", "hearthside.app.cli", *action.arguments]


# ---- processor features in plain words --------------------------------------------------------

# (flags that name it, what to call it, what it means for the user). AMX: ggml's AMX matmul
# segfaults at the first decode on some Sapphire Rapids CPUs (llama.cpp #20824), so the
# engine is built with it off (core/probe/engine_build.py).
FEATURE_MEANINGS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("avx2",),
        "AVX2",
        "Vector math the engine needs for good speed on this kind of processor. Used.",
    ),
    (
        ("avx512f",),
        "AVX-512",
        "Twice as wide vector math: quantized models read prompts and write faster. Used.",
    ),
    (
        ("avx512_vnni", "avx_vnni"),
        "VNNI",
        "8-bit dot products in one step: faster prompt reading with quantized models. Used.",
    ),
    (("avx512_bf16",), "BF16", "bfloat16 math, for models stored in BF16. Used."),
    (
        ("amx_tile", "amx_int8", "amx_bf16"),
        "AMX",
        "Matrix units. Present, but left off on purpose: the engine's AMX code crashes at "
        "the first word on some of these processors, and AVX-512 does the same work safely, "
        "a little slower on long prompts.",
    ),
    (("neon",), "NEON", "Arm vector math. Used."),
    (("dotprod",), "Dot product", "8-bit dot products: faster quantized models. Used."),
    (("i8mm",), "I8MM", "8-bit matrix multiply: faster prompt reading. Used."),
    (("sve", "sve2"), "SVE", "Arm's scalable vectors, used where the engine has code for them."),
)


def feature_rows(flags: Sequence[str]) -> list[Row]:
    """What each feature this processor has means for running models."""
    present = set(flags)
    rows = [(name, meaning) for names, name, meaning in FEATURE_MEANINGS if present & set(names)]
    if not rows:
        rows.append(("None known", "Models still run, but slowly: no vector math was found."))
    return rows


def feature_headline(flags: Sequence[str]) -> str:
    """The processor's best vector feature, for the summary: "with AVX-512"."""
    for flag, name in (
        ("avx512f", "AVX-512"),
        ("avx2", "AVX2"),
        ("i8mm", "I8MM"),
        ("neon", "NEON"),
    ):
        if flag in flags:
            return f" with {name}"
    return ""


# ---- what this machine is good for ----------------------------------------------------------

# Catalog models of rising size whose plans stand for "a model of that size" on this machine.
SIZE_LADDER = (
    "llama-3.2-1b",
    "llama-3.2-3b",
    "llama-3.1-8b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "llama-3.1-70b",
)
WORDS_PER_TOKEN = 0.75  # English text: about ¾ of a word per token
READING_WORDS_PER_S = 4.0  # people read about 4 words a second


@dataclass(frozen=True)
class SizePrediction:
    """The planner's prediction for one model size on this machine."""

    size: str  # "8B"
    fits: bool
    decode_tps: float  # tokens per second while writing; 0 when it does not fit


def size_label(name: str, params: float | None) -> str:
    """The size a model is known by: "8B" from "Llama 3.1 8B", else from its parameters."""
    named = re.search(r"(\d+(?:\.\d+)?B)$", name)
    if named:
        return named.group(1)
    return f"{params / 1e9:.0f}B" if params else "?"


def predict_sizes(
    profile: HardwareProfile, calibration: dict[str, float]
) -> tuple[SizePrediction, ...]:
    """Plan each ladder model for this machine (blocking, about 0.05 s each)."""
    predictions = []
    for model_id in SIZE_LADDER:
        planned = plan(catalog_spec(model_id), profile, calibration=calibration)
        entry = catalog_entry(model_id)
        size = size_label(entry.name, entry.total_params)
        speed = planned.speed.decode_tps if planned.fits else 0.0
        predictions.append(SizePrediction(size, planned.fits, speed))
    return tuple(predictions)


def speed_words(decode_tps: float) -> str:
    """A writing speed as a person feels it."""
    words = decode_tps * WORDS_PER_TOKEN
    if words >= 2 * READING_WORDS_PER_S:
        return f"about {words:.0f} words a second, faster than you read"
    if words >= READING_WORDS_PER_S:
        return f"about {words:.0f} words a second, as fast as you read"
    if words >= 1:
        plural = "" if round(words) == 1 else "s"
        return f"about {words:.0f} word{plural} a second, slower than you read"
    return f"about one word every {1 / max(words, 1e-3):.0f} seconds: too slow to chat"


def size_rows(predictions: Sequence[SizePrediction]) -> list[Row]:
    """One row per model size: "8B models" → "about 2 words a second, slower than you read"."""
    return [
        (f"{p.size} models", speed_words(p.decode_tps) if p.fits else "do not fit in memory")
        for p in predictions
    ]


def good_for_text(profile: HardwareProfile, predictions: Sequence[SizePrediction]) -> str:
    """The page's first sentence: the machine, then the largest size that is comfortable."""
    cpu = profile.cpu
    cores = cpu.physical_cores or cpu.logical_cores
    machine = f"{cores or 'Unknown number of'} cores{feature_headline(cpu.flags)}"
    machine += f" and {format_bytes(profile.memory.total_bytes)} of memory"
    gpus = [gpu.name for gpu in profile.gpus]
    if gpus:
        machine += f", {' and '.join(gpus)}"
    fluent = [
        p for p in predictions if p.fits and p.decode_tps * WORDS_PER_TOKEN >= READING_WORDS_PER_S
    ]
    usable = [p for p in predictions if p.fits and p.decode_tps * WORDS_PER_TOKEN >= 1]
    if fluent:
        verdict = f"models up to {fluent[-1].size} write at least as fast as you read"
        slower = [p for p in usable if p not in fluent]
        if slower:
            verdict += f"; up to {slower[-1].size} they still run, slower than you read"
    elif usable:
        verdict = f"models up to {usable[-1].size} run, slower than you read"
    else:
        verdict = "only the smallest models run at a usable speed"
    return f"{machine}: {verdict}."


# ---- calibration figures ---------------------------------------------------------------------

KIND_NAMES = {
    "memory_read": "Memory read",
    "memory_copy": "Memory copy",
    "memory_triad": "Memory triad",
    "matmul": "Matrix multiply",
    "h2d": "Host → GPU",
    "d2h": "GPU → host",
    "disk_read": "Disk read",
    "engine_prefill": "Prompt speed",
    "engine_decode": "Generation speed",
}
# the CPU time other programs used (`kernels/anomalies.py`); reports stored before 2026-12-07
# said "other programs were busy" whenever repeats varied, which an idle 2-vCPU VM's do
DISTURBED_MARKS = ("Other programs kept", "other programs were busy")
MODEL_SIZE_FOR_LOAD_BYTES = 4 * GIB  # "a 4 GiB model loads in …": a typical 7B–8B file


@dataclass(frozen=True)
class CalibrationView:
    """What the page shows of the calibration and the predictions: the summary (plain rows,
    whether the figures were disturbed), the raw rows and notes behind Details, and the
    predicted speeds per model size."""

    rows: tuple[Row, ...] = ()
    notes: tuple[str, ...] = ()
    summary: tuple[Row, ...] = ()
    status: str = ""  # one sentence above the summary (not calibrated, unreadable, …)
    disturbed: bool = False
    calibrated: bool = False
    predictions: tuple[SizePrediction, ...] = ()


def calibration_view(context: MachineContext) -> CalibrationView:
    """This machine's latest calibration, and the planner's speeds per model size with it; a
    few plans, so on a worker thread."""
    report = context.report
    figures = context.calibration if report is not None else {}
    predictions = predict_sizes(context.profile, figures)
    if report is None:
        return CalibrationView(status=NOT_CALIBRATED, predictions=predictions)
    return replace(report_view(report), predictions=predictions)


def unreadable_view(error: BaseException) -> CalibrationView | None:
    """What the card says when this machine's calibration could not be read; None for an error
    that is not about the calibration or the DB (the card shows it as any error)."""
    if isinstance(error, CalibrationError):  # a report from a newer version
        return CalibrationView(status=f"{error.message} {MEASURE_AGAIN}")
    if isinstance(error, HearthsideError):  # a locked or damaged DB
        return CalibrationView(status=error.user_text())
    return None


def report_view(report: CalibrationReport) -> CalibrationView:
    measured = [m for m in report.measurements if m.ok]
    skipped = {
        f"{KIND_NAMES.get(m.kind, m.kind)}: {m.note}" for m in report.measurements if not m.ok
    }
    when = report.created_at.replace("T", " ")[:16]
    disturbed = any(mark in flag for flag in report.anomalies for mark in DISTURBED_MARKS)
    return CalibrationView(
        rows=tuple(measurement_row(m) for m in measured),
        notes=(f"Measured {when} UTC.", *report.anomalies, *sorted(skipped)),
        summary=tuple(summary_rows(measured)) + (("Measured", f"{when} UTC"),),
        disturbed=disturbed,
        calibrated=True,
    )


def _best(measurements: Sequence[Measurement], kind: str, device: str = "cpu") -> float | None:
    values = [m.value for m in measurements if m.kind == kind and m.device.startswith(device)]
    return max(values) if values else None


def summary_rows(measured: Sequence[Measurement]) -> list[Row]:
    """The few figures that explain the speeds, each with what it decides."""
    rows = []
    memory = _best(measured, "memory_read")
    if memory is not None:
        rows.append(("Memory speed", f"{memory:.0f} GB/s: how fast a model writes"))
    compute = _best(measured, "matmul")
    if compute is not None:
        rows.append(("Compute", f"{compute:,.0f} GFLOP/s: how fast a prompt is read"))
    disk = _best(measured, "disk_read", "disk")
    if disk is not None:
        load_s = MODEL_SIZE_FOR_LOAD_BYTES / (disk * GB)
        rows.append(("Disk", f"{disk:.1f} GB/s: a 4 GiB model loads in about {load_s:.0f} s"))
    decode, prefill = _best(measured, "engine_decode"), _best(measured, "engine_prefill")
    if decode is not None:
        reads = f", reads prompts at {prefill:,.0f}" if prefill is not None else ""
        rows.append(("Test model", f"writes {decode:.0f} tokens a second{reads}"))
    return rows


def measurement_row(measurement: Measurement) -> Row:
    name = f"{KIND_NAMES.get(measurement.kind, measurement.kind)} ({measurement.device})"
    value = f"{measurement.value:,.1f} {measurement.unit}"
    if measurement.spread:
        value += f" ±{measurement.spread * 100:.0f}%"
    if measurement.params:
        value += "   " + ", ".join(f"{k}={v}" for k, v in sorted(measurement.params.items()))
    return name, value


# ---- small widgets ---------------------------------------------------------------------------


def _card(title: str, rows: Sequence[Row] = ()) -> tuple[QFrame, QVBoxLayout]:
    card = QFrame()
    layout = _card_layout(card, title)
    if rows:
        layout.addLayout(_form(rows))
    return card, layout


def _card_layout(card: QFrame, title: str) -> QVBoxLayout:
    card.setObjectName("card")
    layout = QVBoxLayout(card)
    layout.setContentsMargins(16, 12, 16, 14)
    layout.setSpacing(8)
    layout.addWidget(_label(title, "cardTitle"))
    return layout


class GoodForCard(QFrame):
    """The page's first card: what this machine is good for, then the speed per model size."""

    def __init__(self, profile: HardwareProfile) -> None:
        super().__init__()
        self.setObjectName("summaryCard")
        self._profile = profile
        self._layout = _card_layout(self, "What this computer is good for")
        self.headline = _label(READING_CALIBRATION, "muted")
        self._layout.addWidget(self.headline)

    def show_view(self, view: CalibrationView) -> None:
        if not view.predictions:
            self.headline.setText(view.status)
            return
        self.headline.setText(good_for_text(self._profile, view.predictions))
        self.headline.setObjectName("headline")
        self.headline.setStyleSheet("font-size: 11pt;")
        self._layout.addLayout(_form(size_rows(view.predictions)))
        basis = (
            "Predicted from this machine's own measurements."
            if view.calibrated
            else "Estimated from typical figures for this kind of machine: "
            f"“{MEASURE_BUTTON_TEXT}” below makes them its own."
        )
        if view.disturbed:
            basis += " Other programs were busy while it measured, so these may be too low."
        self._layout.addWidget(_label(f"{basis} A word is about 1⅓ tokens.", "muted"))


class CalibrationCard(QFrame):
    """The Calibration card: "Reading…" until it is shown this machine's context
    (`show_context`, its view made on a worker), then a short summary with the raw figures
    behind "Details", and the button that measures."""

    def __init__(self, good_for: GoodForCard | None = None) -> None:
        super().__init__()
        self._good_for = good_for
        self._layout = _card_layout(self, "Calibration")
        self.status = _label(READING_CALIBRATION, "muted")
        self._layout.addWidget(self.status)
        self.loaded = False
        self.view: CalibrationView | None = None
        self.measure_button = QPushButton(MEASURE_BUTTON_TEXT)
        self.measure_button.setToolTip(
            "Times this computer's memory, compute, disk and the engine (about a minute), so "
            "plans and the speeds above are its own. Chats wait while it runs."
        )
        self.details_button = QToolButton()
        self.details_button.setText("Details")
        self.details_button.setCheckable(True)
        self.details_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.details_button.setArrowType(Qt.ArrowType.RightArrow)
        self.details_button.toggled.connect(self._show_details)
        self.details_button.hide()
        self.details = QWidget()
        self.details.hide()
        buttons = QHBoxLayout()
        buttons.addWidget(self.details_button)
        buttons.addStretch(1)
        buttons.addWidget(self.measure_button)
        self._summary = QVBoxLayout()
        self._layout.addLayout(self._summary)
        self._layout.addLayout(buttons)
        self._layout.addWidget(self.details)

    def show_context(self, context: MachineContext) -> None:
        run_in_background(lambda: calibration_view(context), self.show_view, self.show_error)

    def show_unreadable(self, error: BaseException) -> None:
        view = unreadable_view(error)
        if view is None:
            self.show_error(error)
        else:
            self.show_view(view)

    def show_view(self, view: CalibrationView) -> None:
        self.view = view
        self.status.setText(DISTURBED if view.disturbed else view.status)
        self.status.setObjectName("problem" if view.disturbed else "muted")
        self.status.setStyleSheet("")  # re-read the object name's style
        self.status.setVisible(bool(self.status.text()))
        if view.summary:
            self._summary.addLayout(_form(view.summary))
        if view.calibrated:
            self.measure_button.setText("Measure again")
        details = QVBoxLayout(self.details)
        details.setContentsMargins(0, 0, 0, 0)
        if view.rows:
            details.addLayout(_form(view.rows))
        for note in view.notes:
            details.addWidget(_label(note, "muted"))
        self.details_button.setVisible(bool(view.rows or view.notes))
        if self._good_for is not None:
            self._good_for.show_view(view)
        self.loaded = True

    def show_error(self, error: BaseException) -> None:
        self.status.setText(describe_error(error))
        if self._good_for is not None:
            self._good_for.headline.setText(describe_error(error))
        self.loaded = True

    def show_measuring(self, text: str) -> None:
        self.measure_button.setEnabled(False)
        self.status.setText(text)
        self.status.setObjectName("muted")
        self.status.show()

    def _show_details(self, shown: bool) -> None:
        self.details.setVisible(shown)
        arrow = Qt.ArrowType.DownArrow if shown else Qt.ArrowType.RightArrow
        self.details_button.setArrowType(arrow)


def _form(rows: Sequence[Row]) -> QFormLayout:
    form = QFormLayout()
    form.setHorizontalSpacing(16)
    form.setVerticalSpacing(6)
    form.setLabelAlignment(Qt.AlignmentFlag.AlignLeft)
    form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
    for name, value in rows:
        form.addRow(_label(name, "muted", wrap=False), _label(value))
    return form


# ---- the page --------------------------------------------------------------------------------


class HardwarePage(QWidget):
    """The probe's profile, and this machine's calibration from `machine` (the window's
    `MachineState`, or one of the page's own): the page hands it each profile it probes and
    shows each context it reads, so a new calibration shows without probing again."""

    profile_ready = Signal(object)  # HardwareProfile
    calibrated = Signal()  # "Measure this machine" stored a new calibration

    def __init__(
        self,
        parent: QWidget | None = None,
        *,
        probe_command: Sequence[str] | None = None,
        service: EngineService | None = None,
        machine: MachineState | None = None,
    ) -> None:
        super().__init__(parent)
        self.machine = machine if machine is not None else MachineState(self)
        self.machine.changed.connect(self._show_context)
        self.machine.failed.connect(self._context_failed)
        self._probe_command = list(probe_command) if probe_command is not None else None
        self._probing = False
        self.service = service
        self.profile: HardwareProfile | None = None
        self.calibration_card: CalibrationCard | None = None
        self.good_for_card: GoodForCard | None = None
        self._measuring = False
        self.fix_buttons: list[QPushButton] = []  # the advice's
        self.selftest_button: QPushButton | None = None
        self.process: QProcess | None = None
        self._running_action: FixAction | None = None
        self.setStyleSheet(STYLE)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(20, 16, 20, 16)
        layout.setSpacing(12)
        layout.addLayout(self._build_header())
        self.scroll_area = QScrollArea()
        self.scroll_area.setWidgetResizable(True)
        self.scroll_area.setFrameShape(QFrame.Shape.NoFrame)
        layout.addWidget(self.scroll_area, 1)
        layout.addWidget(self._build_log())
        self._show_content(self._placeholder("Not probed yet. Press “Probe again” to look."))

    # -- probing --

    def refresh(self) -> None:
        """Probe in a child process on a worker thread; the page shows a spinner meanwhile."""
        if self._probing:
            return
        self._probing = True
        self.busy.show()
        self.refresh_button.setEnabled(False)
        self.status.setText("Looking at this computer…")
        command = self._probe_command
        run_in_background(
            lambda: probe_in_subprocess(models_dir(data_dir()), command=command),
            self.show_profile,
            self._probe_failed,
        )

    def show_profile(self, profile: HardwareProfile) -> None:
        """Show `profile` (also usable with a profile probed elsewhere)."""
        self._probe_finished()
        self.profile = profile
        found = len(profile.gpus)
        self.status.setText(
            f"{found} graphics processor{'' if found == 1 else 's'} found"
            if found
            else "No graphics processor found"
        )
        self._show_content(self._build_profile(profile))
        self.profile_ready.emit(profile)
        self.machine.set_profile(profile)
        known = self.machine.context
        if not self.machine.reading and known is not None and self.calibration_card is not None:
            self.calibration_card.show_context(known)  # the one held is this profile's

    def attach_service(self, service: EngineService) -> None:
        """The engine whose queue "Measure this machine" waits in (chats wait behind it)."""
        self.service = service

    def reload_calibration(self) -> None:
        """Read the calibration and the predictions again (after a measurement or a tuning):
        the machine's context is read again, and `_show_context` shows it."""
        self.machine.refresh()

    def _show_context(self, context: MachineContext) -> None:
        """A new context for this machine: the calibration card (a fresh one once the first
        has shown its figures) and the predictions show it."""
        if self.profile is None:
            return  # nothing shown yet: the probe's profile comes with its own read
        card = self.calibration_card
        if card is None or card.loaded:
            self._show_content(self._build_profile(self.profile))
            card = self.calibration_card
        assert card is not None
        card.show_context(context)

    def _show_again(self) -> None:
        """Build the page again for the profile shown (the cards read their records anew),
        its calibration card showing the context held."""
        if self.profile is None:
            return
        self._show_content(self._build_profile(self.profile))
        context = self.machine.context
        if context is not None and self.calibration_card is not None:
            self.calibration_card.show_context(context)

    def _context_failed(self, error: BaseException) -> None:
        if self.calibration_card is not None:
            self.calibration_card.show_unreadable(error)

    # -- measuring --

    def measure_machine(self) -> None:
        """The wizard's calibration as one EngineService job; the page re-reads it after."""
        profile, service = self.profile, self.service
        card = self.calibration_card
        if profile is None or card is None or self._measuring:
            return
        if service is None:
            card.show_error(EngineError("The engine is still starting.", hint="Try again soon."))
            return
        from hearthside.autotune.optimize import (
            CALIBRATION_BUDGET_S,
            CalibrationRequest,
            MeasureUpdate,
            calibrate,
        )
        from hearthside.core.engine.service import Job

        progress = MainThreadRelay(self._show_progress, self)
        done = MainThreadRelay(self._measured, self)
        request = CalibrationRequest(profile, None, CALIBRATION_BUDGET_S)

        def post(update: MeasureUpdate) -> None:
            progress.post(update.text)

        job: Job[object] = Job(
            lambda _engine, _cancel: calibrate(request, post),
            description="measure this machine",
        )
        job.future.add_done_callback(done.post)
        self._measuring = True
        card.show_measuring(MEASURING)
        try:
            service.submit(job)
        except HearthsideError as exc:  # the queue is full
            self._measuring = False
            card.show_error(exc)

    def _show_progress(self, step: str) -> None:
        if self.calibration_card is not None and step:
            self.calibration_card.show_measuring(f"{MEASURING} ({step})")

    def _measured(self, future: Future[object]) -> None:
        self._measuring = False
        error = future.exception()
        if error is not None:
            if self.calibration_card is not None:
                self.calibration_card.show_error(error)
                self.calibration_card.measure_button.setEnabled(True)
            return
        self.reload_calibration()
        self.calibrated.emit()

    def _probe_failed(self, error: BaseException) -> None:
        self._probe_finished()
        self.status.setText(f"The hardware probe failed ({type(error).__name__}).")

    def _probe_finished(self) -> None:
        self._probing = False
        self.busy.hide()
        self.refresh_button.setEnabled(True)

    # -- layout --

    def _build_header(self) -> QHBoxLayout:
        header = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(2)
        titles.addWidget(_label("Hardware", "pageTitle"))
        titles.addWidget(_label("What this computer has, and what Hearthside can use.", "muted"))
        header.addLayout(titles, 1)
        self.status = _label("", "muted", wrap=False)
        self.busy = QProgressBar()
        self.busy.setRange(0, 0)  # an indeterminate bar is Qt's spinner
        self.busy.setFixedWidth(120)
        self.busy.setTextVisible(False)
        self.busy.hide()
        self.refresh_button = QPushButton("Probe again")
        self.refresh_button.clicked.connect(self.refresh)
        for widget in (self.status, self.busy, self.refresh_button):
            header.addWidget(widget, 0, Qt.AlignmentFlag.AlignVCenter)
        return header

    def _build_log(self) -> QWidget:
        self.log_panel = QWidget()
        layout = QVBoxLayout(self.log_panel)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        self.log_title = _label("", "cardTitle")
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self._stop_fix)
        row.addWidget(self.log_title, 1)
        row.addWidget(self.stop_button)
        layout.addLayout(row)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(MAX_LOG_BLOCKS)
        self.log.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.log.setMinimumHeight(140)
        layout.addWidget(self.log)
        self.log_panel.hide()
        return self.log_panel

    def _show_content(self, content: QWidget) -> None:
        self.scroll_area.setWidget(content)

    def _placeholder(self, text: str) -> QWidget:
        holder = QWidget()
        layout = QVBoxLayout(holder)
        layout.addWidget(_label(text, "muted"), 0, Qt.AlignmentFlag.AlignCenter)
        return holder

    def _build_profile(self, profile: HardwareProfile) -> QWidget:
        self.fix_buttons = []
        self.selftest_button = None
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 8, 0)
        layout.setSpacing(12)
        self.good_for_card = GoodForCard(profile)
        layout.addWidget(self.good_for_card)
        layout.addWidget(self._advice_card(profile))
        columns = QGridLayout()
        columns.setHorizontalSpacing(12)
        columns.setVerticalSpacing(12)
        features = _card("What the processor's features mean", feature_rows(profile.cpu.flags))[0]
        left = [self._processor_card(profile), features, self._storage_card(profile)]
        right = [*self._gpu_cards(profile), self._engine_card(profile)]
        for column, cards in enumerate((left, right)):
            stack = QVBoxLayout()
            stack.setSpacing(12)
            for card in cards:
                stack.addWidget(card)
            stack.addStretch(1)
            columns.addLayout(stack, 0, column)
        columns.setColumnStretch(0, 1)
        columns.setColumnStretch(1, 1)
        layout.addLayout(columns)
        for card in self._problem_cards(profile):
            layout.addWidget(card)
        self.calibration_card = CalibrationCard(self.good_for_card)
        self.calibration_card.measure_button.clicked.connect(self.measure_machine)
        layout.addWidget(self.calibration_card)
        layout.addStretch(1)
        return content

    def _processor_card(self, profile: HardwareProfile) -> QFrame:
        return _card("Processor and memory", processor_rows(profile))[0]

    def _storage_card(self, profile: HardwareProfile) -> QFrame:
        card, layout = _card("Storage")
        for disk in profile.disks:
            layout.addLayout(_form(disk_rows(disk)))
        if not profile.disks:
            layout.addWidget(_label("The models folder's disk was not inspected.", "muted"))
        return card

    def _gpu_cards(self, profile: HardwareProfile) -> list[QFrame]:
        if not profile.gpus:
            card, layout = _card("Graphics")
            layout.addWidget(_label("No graphics processor found: models run on the CPU."))
            return [card]
        return [_card(gpu_title(gpu), gpu_rows(gpu))[0] for gpu in profile.gpus]

    def _engine_card(self, profile: HardwareProfile) -> QFrame:
        card, layout = _card("What the engine can use", engine_rows(profile.engine) + build_rows())
        if not engine_record_current():
            button = QPushButton(SELF_TEST.label)
            button.setToolTip(
                "Loads the default model in a separate process and writes a few words"
            )
            button.clicked.connect(lambda _checked=False: self.run_fix(SELF_TEST))
            self.selftest_button = button
            layout.addWidget(button, 0, Qt.AlignmentFlag.AlignLeft)
        return card

    def _problem_cards(self, profile: HardwareProfile) -> list[QFrame]:
        cards = []
        if profile.unsupported:
            rows = [(device.name, device.reason) for device in profile.unsupported]
            cards.append(_card("Devices Hearthside cannot use", rows)[0])
        if profile.errors:
            card, layout = _card("Problems while probing")
            for error in profile.errors:
                layout.addWidget(_label(f"{error.source}: {error.message}", "problem"))
            cards.append(card)
        return cards

    def _advice_card(self, profile: HardwareProfile) -> QFrame:
        card, layout = _card("Advice")
        if not profile.advice:
            layout.addWidget(_label("Nothing to fix: Hearthside can use everything it found."))
        for advice in profile.advice:
            layout.addWidget(self._advice_item(advice, fix_action(advice, profile)))
        return card

    def _advice_item(self, advice: Advice, action: FixAction | None) -> QFrame:
        item = QFrame()
        item.setObjectName("advice")
        row = QHBoxLayout(item)
        row.setContentsMargins(12, 10, 12, 10)
        text = QVBoxLayout()
        text.addWidget(_label(advice.message))
        if advice.fix and action is None:
            text.addWidget(_label(f"What to do: {advice.fix}"))
        row.addLayout(text, 1)
        if action is not None:
            button = QPushButton(action.label)
            button.setToolTip(action.command_line)
            button.clicked.connect(lambda _checked=False, a=action: self.run_fix(a))
            self.fix_buttons.append(button)
            row.addWidget(button, 0, Qt.AlignmentFlag.AlignVCenter)
        return item

    # -- running a fix --

    def run_fix(self, action: FixAction) -> None:
        """Ask first, then run the fix's command with its output in the log box."""
        if self.process is not None:
            return
        answer = QMessageBox.question(
            self,
            action.label,
            f"{action.label}?\n\nHearthside will run:\n{action.command_line}\n\n"
            + (
                "This can take several minutes. Restart Hearthside when it has finished."
                if action.changes_engine
                else "This takes a minute or less."
            ),
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        self._start_process(action)

    def _start_process(self, action: FixAction) -> None:
        self._running_action = action
        command = fix_command(action)
        self.process = QProcess(self)
        self.process.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        self.process.readyReadStandardOutput.connect(self._read_output)
        self.process.finished.connect(self._fix_finished)
        self.process.errorOccurred.connect(self._fix_failed_to_start)
        self.log.clear()
        self.log.appendPlainText(f"$ {action.command_line}")
        self.log_title.setText(f"Running: {action.label}…")
        self.stop_button.setEnabled(True)
        self.log_panel.show()
        for button in self._command_buttons():
            button.setEnabled(False)
        self.process.start(command[0], command[1:])

    def _command_buttons(self) -> list[QPushButton]:
        extra = [self.selftest_button] if self.selftest_button is not None else []
        return [*self.fix_buttons, *extra]

    def _read_output(self) -> None:
        if self.process is not None:
            data = self.process.readAllStandardOutput().data()
            self.log.appendPlainText(bytes(data).decode(errors="replace").rstrip("\n"))

    def _fix_finished(self, exit_code: int, status: QProcess.ExitStatus) -> None:
        self._read_output()
        if status == QProcess.ExitStatus.NormalExit and exit_code == 0:
            changed = self._running_action is None or self._running_action.changes_engine
            self.log_title.setText(
                "Finished. Restart Hearthside to use the new engine."
                if changed
                else "Finished: the engine passed its test."
            )
            if not changed:
                self._fix_done()
                self._show_again()  # the engine card now shows the test's record
                return
        else:
            self.log_title.setText(f"The command failed (exit {exit_code}); see its output.")
        self._fix_done()

    def _fix_failed_to_start(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.log_title.setText("The command could not start.")
            self._fix_done()

    def _fix_done(self) -> None:
        self.stop_button.setEnabled(False)
        for button in self._command_buttons():
            button.setEnabled(True)
        if self.process is not None:
            self.process.deleteLater()
        self.process = None

    def _stop_fix(self) -> None:
        if self.process is not None:
            self.process.kill()
