"""The Hardware page: what the machine has, what the engine can use, calibration figures, and
the probe's advice, with a button for each fix Hearthside can run itself.

The probe runs in a child process (`probe_in_subprocess`) on a worker thread, so a hanging
driver neither freezes nor crashes the window; the calibration is read from the autotune DB
on a worker thread too (another Hearthside may hold its lock for a moment). A fix runs as a
`hearthside ...` command in a QProcess after the user confirms it; its output streams into a
log box on the page.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.labels import make_label as _label
from hearthside.app.gui.workers import run_in_background
from hearthside.autotune.calibration import latest_report
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.errors import HearthsideError, describe_error
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
from hearthside.kernels.measurement import Measurement

GIB = 1024**3
NOT_CALIBRATED = "Not calibrated yet — run `hearthside calibrate` to measure this machine."
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


def gib(value: int | None) -> str:
    return f"{value / GIB:.1f} GiB" if value is not None else "unknown"


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
    text = f"{gib(memory.total_bytes)} total"
    if memory.available_bytes is not None:
        text += f", {gib(memory.available_bytes)} free"
    rows = [("Memory", text)]
    if memory.cgroup_limit_bytes is not None:
        rows.append(("Container limit", gib(memory.cgroup_limit_bytes)))
    if memory.swap_total_bytes:
        rows.append(("Swap", gib(memory.swap_total_bytes)))
    return rows


def gpu_rows(gpu: GpuInfo) -> list[Row]:
    memory = gib(gpu.vram_total_bytes)
    if gpu.vram_free_bytes is not None:
        memory += f" ({gib(gpu.vram_free_bytes)} free)"
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
        rows.append(("Free space", f"{gib(disk.free_bytes)} of {gib(disk.total_bytes)}"))
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
        memory = f", {gib(device.memory_total_bytes)}" if device.memory_total_bytes else ""
        rows.append((device.name, f"{device.description} ({device.kind}{memory})"))
    return rows


def build_rows(home: Path | None = None) -> list[Row]:
    """How the engine build was chosen and how its self-test went (engine-build.json)."""
    record = read_record(home or data_dir())
    current = record is not None and record.self_test.library == library_identity()
    return record_rows(record, current)


@dataclass(frozen=True)
class FixAction:
    """A fix Hearthside can run for the user: `hearthside <arguments>`."""

    label: str
    arguments: tuple[str, ...]

    @property
    def command_line(self) -> str:
        return shlex.join(("hearthside", *self.arguments))


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


@dataclass(frozen=True)
class CalibrationView:
    """What the Calibration card shows: one row per figure, then sentences (status, flags)."""

    rows: tuple[Row, ...] = ()
    notes: tuple[str, ...] = ()


def calibration_view(profile: HardwareProfile) -> CalibrationView:
    """This machine's latest calibration in the autotune DB; blocking (a worker thread)."""
    try:
        with WisdomDB() as wisdom:
            report = latest_report(profile, wisdom)
    except HearthsideError as exc:  # a locked or damaged DB, a report from a newer version
        return CalibrationView(notes=(exc.user_text(),))
    if report is None:
        return CalibrationView(notes=(NOT_CALIBRATED,))
    measured = [m for m in report.measurements if m.ok]
    skipped = {
        f"{KIND_NAMES.get(m.kind, m.kind)}: {m.note}" for m in report.measurements if not m.ok
    }
    when = report.created_at.replace("T", " ")[:16]
    return CalibrationView(
        rows=tuple(measurement_row(m) for m in measured),
        notes=(f"Measured {when} UTC.", *report.anomalies, *sorted(skipped)),
    )


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


class CalibrationCard(QFrame):
    """The Calibration card: "Reading…" until `calibration_view` returns from a worker."""

    def __init__(self, profile: HardwareProfile) -> None:
        super().__init__()
        self._layout = _card_layout(self, "Calibration")
        self.status = _label(READING_CALIBRATION, "muted")
        self._layout.addWidget(self.status)
        self.loaded = False
        run_in_background(lambda: calibration_view(profile), self.show_view, self.show_error)

    def show_view(self, view: CalibrationView) -> None:
        self.status.clear()
        self.status.hide()
        if view.rows:
            self._layout.addLayout(_form(view.rows))
        for note in view.notes:
            self._layout.addWidget(_label(note, "muted"))
        self.loaded = True

    def show_error(self, error: BaseException) -> None:
        self.status.setText(describe_error(error))
        self.loaded = True


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
    profile_ready = Signal(object)  # HardwareProfile

    def __init__(
        self, parent: QWidget | None = None, *, probe_command: Sequence[str] | None = None
    ) -> None:
        super().__init__(parent)
        self._probe_command = list(probe_command) if probe_command is not None else None
        self._probing = False
        self.profile: HardwareProfile | None = None
        self.calibration_card: CalibrationCard | None = None
        self.fix_buttons: list[QPushButton] = []
        self.process: QProcess | None = None
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
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(0, 0, 8, 0)
        layout.setSpacing(12)
        layout.addWidget(self._advice_card(profile))
        columns = QGridLayout()
        columns.setHorizontalSpacing(12)
        columns.setVerticalSpacing(12)
        left = [self._processor_card(profile), self._storage_card(profile)]
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
        self.calibration_card = CalibrationCard(profile)
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
        return _card("What the engine can use", engine_rows(profile.engine) + build_rows())[0]

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
            "This can take several minutes. Restart Hearthside when it has finished.",
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        self._start_process(action)

    def _start_process(self, action: FixAction) -> None:
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
        for button in self.fix_buttons:
            button.setEnabled(False)
        self.process.start(command[0], command[1:])

    def _read_output(self) -> None:
        if self.process is not None:
            data = self.process.readAllStandardOutput().data()
            self.log.appendPlainText(bytes(data).decode(errors="replace").rstrip("\n"))

    def _fix_finished(self, exit_code: int, status: QProcess.ExitStatus) -> None:
        self._read_output()
        if status == QProcess.ExitStatus.NormalExit and exit_code == 0:
            self.log_title.setText("Finished. Restart Hearthside to use the new engine.")
        else:
            self.log_title.setText(f"The command failed (exit {exit_code}); see its output.")
        self._fix_done()

    def _fix_failed_to_start(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            self.log_title.setText("The command could not start.")
            self._fix_done()

    def _fix_done(self) -> None:
        self.stop_button.setEnabled(False)
        for button in self.fix_buttons:
            button.setEnabled(True)
        if self.process is not None:
            self.process.deleteLater()
        self.process = None

    def _stop_fix(self) -> None:
        if self.process is not None:
            self.process.kill()
