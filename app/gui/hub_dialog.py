"""The "Download from the hub" dialog: search GGUF repos, see which files fit this machine,
and download one with progress, Cancel and resume.

Search, listing, the hardware probe, the fit badges and the download all run on worker
threads (`run_in_background`); the widgets only show their results. Each badge comes from the
planner run on a what-if spec of a file that is not downloaded yet: the catalog's architecture
when the repo names a catalog model, else an estimate from the file's size and quant type,
marked "about". A cancelled or broken download keeps its `.part` file, and the next Download
of the same file resumes it (`download_model` does that; the dialog says from where).
"""

from __future__ import annotations

import errno
import math
import platform
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from hearthside.app.gui.message_bar import MessageBar
from hearthside.app.gui.workers import BackgroundTask, MainThreadRelay, run_in_background
from hearthside.autotune.calibration import calibration_for
from hearthside.autotune.memory import CPU
from hearthside.autotune.planner import DEFAULT_FREE_MARGIN_BYTES, DeviceBudget, Plan, plan
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.errors import (
    HearthsideError,
    ModelFileError,
    ModelStoreError,
    describe_error,
)
from hearthside.core.models.catalog import catalog_entry, catalog_ids
from hearthside.core.models.descriptor import QUANT_PROFILES, Descriptor, spec_from_descriptor
from hearthside.core.models.download import DownloadCancelled, download_model
from hearthside.core.models.hub import (
    HubFile,
    HubFilePart,
    HubRepoSummary,
    list_repo_gguf_files,
    search_models,
)
from hearthside.core.models.hub_http import (
    HubEndpoint,
    HubError,
    connection_error,
    status_error,
)
from hearthside.core.models.spec import ModelSpec
from hearthside.core.models.store import ModelRecord, ModelStore
from hearthside.core.paths import data_dir, models_dir
from hearthside.core.probe.profile import CpuInfo, HardwareProfile, MemoryInfo, ProbeError
from hearthside.core.probe.runner import probe_in_subprocess
from hearthside.core.units import format_bytes

SEARCH_DEBOUNCE_MS = 350
SEARCH_LIMIT = 30
PERCENT = 100
RATE_WINDOW_S = 5.0  # speed is measured over the last few seconds, not since the start
MIN_RATE_SPAN_S = 0.5
# Average bits per weight assumed for a file whose name gives no quant type (Q4_K_M-like).
UNKNOWN_QUANT_BITS = 4.85
MAX_BITS_PER_WEIGHT = 32.0

REPO_COLUMNS = ("Repo", "Downloads", "Likes", "Updated")
FILE_COLUMNS = ("File", "Quant", "Size", "On this machine")
BADGE_COLUMN_WIDTH = 170

BadgeKind = Literal["fits", "offload", "no-fit", "unknown", "pending"]
BADGE_LABELS: dict[BadgeKind, str] = {
    "fits": "fits",
    "offload": "fits with offload",
    "no-fit": "won't fit",
    "unknown": "?",
    "pending": "…",
}

NETWORK_HINT = (
    "Check your connection, or the hub address in Settings (toolbar → Settings…), then try again."
)
TOKEN_HINT = (
    "This model needs a hub token: accept its licence on the hub's web page, then paste an "
    "access token of your account into Settings (toolbar → Settings… → Hub access token) "
    "and download again."
)
DAMAGED_HINT = (
    "The file was corrupted in transit and has been deleted; download it again. If it fails "
    "again, your connection or a proxy is changing the data."
)
NO_ROOM_HINT = "Free some space, then press Download again: it resumes where it stopped."
_NO_ROOM_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})

STYLE = """
QLabel#muted { color: gray; }
QLabel#badge { border-radius: 8px; padding: 1px 8px; font-weight: 600; }
QLabel#badge[kind="fits"] { background: #e3f4e6; color: #1b5e20; }
QLabel#badge[kind="offload"] { background: #fff4d6; color: #7a4f00; }
QLabel#badge[kind="no-fit"] { background: #fdecea; color: #8a1c12; }
QLabel#badge[kind="unknown"], QLabel#badge[kind="pending"] { color: gray; }
QFrame#messageBar[kind="error"] { background: #fdecea; border: 1px solid #f5c6cb;
                                   border-radius: 6px; }
QFrame#messageBar[kind="error"] QLabel { color: #611a15; }
QFrame#messageBar[kind="info"] { background: #e8f4fd; border: 1px solid #b6dcfe;
                                  border-radius: 6px; }
QFrame#messageBar[kind="info"] QLabel { color: #0d3c61; }
QPushButton#primary { font-weight: 600; }
QTableWidget::item { padding: 0 6px; }
"""


class AlreadyInstalled(HearthsideError):
    """The chosen hub file is registered already; `record` is the installed model."""

    def __init__(self, record: ModelRecord) -> None:
        super().__init__(
            f"{record.name} is already installed as '{record.id}'.",
            hint="It is selected in the Models list. Remove it there to download it again.",
        )
        self.record = record


# ---- what-if specs and fit badges (no Qt: plain functions, run on worker threads) -----------


@dataclass(frozen=True)
class WhatIfSpec:
    """A spec for a hub file that is not on this machine, and what it is based on."""

    spec: ModelSpec
    estimated: bool  # True: the architecture is a guess from the file size
    basis: str  # one line for the tooltip


@dataclass(frozen=True)
class FitBadge:
    kind: BadgeKind
    estimated: bool
    tooltip: str

    @property
    def label(self) -> str:
        text = BADGE_LABELS[self.kind]
        is_verdict = self.kind in ("fits", "offload", "no-fit")
        return f"≈ {text}" if self.estimated and is_verdict else text


PENDING_BADGE = FitBadge("pending", False, "Looking at this machine's memory…")


def _id_pattern(catalog_id: str) -> re.Pattern[str]:
    """'llama-3.1-8b' matches 'Meta-Llama-3.1-8B-Instruct' but not 'Llama-3.1-80B'."""
    chunks = [re.escape(chunk) for chunk in re.split(r"[^a-z0-9]+", catalog_id) if chunk]
    return re.compile(r"(?<![a-z0-9])" + r"[-_. ]?".join(chunks) + r"(?![a-z0-9])")


def catalog_match(repo: str) -> Descriptor | None:
    """The catalog model a hub repo holds: the entry whose `gguf_repo` it is, else the entry
    whose id appears in the repo's name (the longest id wins: 'qwen3-30b-a3b' over 'qwen3')."""
    lowered = repo.lower()
    entries = [catalog_entry(entry_id) for entry_id in catalog_ids()]
    for entry in entries:
        if entry.gguf_repo is not None and entry.gguf_repo.lower() == lowered:
            return entry
    name = lowered.split("/", 1)[-1]
    named = [e for e in entries if e.id is not None and _id_pattern(e.id).search(name)]
    return max(named, key=lambda e: len(e.id or ""), default=None)


def _bits_for(size_bytes: int, params: float) -> float:
    return min(MAX_BITS_PER_WEIGHT, max(size_bytes * 8 / params, 0.01))


def what_if_spec(hub_file: HubFile) -> WhatIfSpec | None:
    """A spec for planning `hub_file` before it is downloaded; None when its size is unknown.

    The weights take the file's real size; the architecture (and so the KV cache) comes from
    the catalog when the repo names a catalog model, else from the dense catalog model closest
    in parameters to what the size and quant type suggest."""
    size = hub_file.size_bytes
    if size is None:
        return None
    entry = catalog_match(hub_file.repo)
    if entry is not None:
        basis = f"Architecture of {entry.name}, from Hearthside's catalog; the file's real size."
        return WhatIfSpec(_sized_spec(entry, hub_file, size), False, basis)
    profile = QUANT_PROFILES.get(hub_file.quant or "")
    params = size * 8 / (profile.bits if profile is not None else UNKNOWN_QUANT_BITS)
    reference = _closest_dense_entry(params)
    quant = hub_file.quant or "an unknown type"
    basis = (
        f"An estimate: about {_params_text(params)} parameters from the size and {quant}; the "
        f"memory for context is taken from a model of similar size ({reference.name})."
    )
    return WhatIfSpec(_sized_spec(reference, hub_file, size), True, basis)


def _closest_dense_entry(params: float) -> Descriptor:
    dense = [
        entry
        for entry in (catalog_entry(entry_id) for entry_id in catalog_ids())
        if not entry.is_moe and not entry.is_mla
    ]
    return min(dense, key=lambda entry: abs(math.log(entry.total_params / params)))


def _sized_spec(entry: Descriptor, hub_file: HubFile, size_bytes: int) -> ModelSpec:
    bits = _bits_for(size_bytes, entry.total_params)
    sized = entry.model_copy(update={"quant": None, "bits_per_weight": bits})
    spec = spec_from_descriptor(sized)
    return _renamed(spec, hub_file)


def _renamed(spec: ModelSpec, hub_file: HubFile) -> ModelSpec:
    return replace(spec, name=hub_file.display_name, ref=hub_file.source, file_type=hub_file.quant)


def _params_text(params: float) -> str:
    return f"{params / 1e9:.1f} B" if params >= 1e9 else f"{params / 1e6:.0f} M"


def assess_file(
    hub_file: HubFile, profile: HardwareProfile, calibration: dict[str, float] | None = None
) -> FitBadge:
    """The badge for `hub_file` on `profile`: fits / fits with offload / won't fit, and why."""
    try:
        what_if = what_if_spec(hub_file)
    except HearthsideError as exc:
        return FitBadge("unknown", True, f"Hearthside cannot size this file: {exc.message}")
    if what_if is None:
        return FitBadge("unknown", True, "The hub did not say how big this file is.")
    if profile.memory.usable_bytes is None:
        return FitBadge("unknown", True, "This machine's memory could not be read.")
    result = plan(what_if.spec, profile, calibration=calibration)
    kind = _badge_kind(result, has_gpu=any(d.device != CPU for d in result.devices))
    return FitBadge(kind, what_if.estimated, fit_explanation(result, what_if, kind))


def _badge_kind(result: Plan, *, has_gpu: bool) -> BadgeKind:
    if not result.fits:
        return "no-fit"  # including "only by streaming from disk": not in memory
    all_on_gpu = result.config.n_gpu_layers == -1 and not result.config.tensor_overrides
    return "offload" if has_gpu and not all_on_gpu else "fits"


def fit_explanation(result: Plan, what_if: WhatIfSpec, kind: BadgeKind) -> str:
    """E.g. "Needs about 44.0 GB (context 8192 tokens); this machine has 23.1 GB of RAM for
    models", then the verdict and what the numbers are based on."""
    about = "about " if what_if.estimated else ""
    needed = sum(device.used_bytes for device in result.devices)
    lines = [
        f"Needs {about}{format_bytes(needed)} (context {result.config.n_ctx} tokens); "
        "this machine has " + ", ".join(_room_text(device) for device in result.devices) + "."
    ]
    if len(result.devices) > 1:
        lines.append(
            "Used: "
            + ", ".join(f"{format_bytes(d.used_bytes)} {_tier(d.device)}" for d in result.devices)
            + "."
        )
    lines += [_verdict(result, kind), what_if.basis]
    return "\n".join(lines)


def _tier(device: str) -> str:
    return "in RAM" if device == CPU else f"on GPU {device}"


def _room_text(device: DeviceBudget) -> str:
    room = format_bytes(max(device.capacity_bytes, 0))
    return f"{room} of RAM for models" if device.device == CPU else f"{room} on GPU {device.device}"


def _verdict(result: Plan, kind: BadgeKind) -> str:
    keep_free = format_bytes(DEFAULT_FREE_MARGIN_BYTES)
    if kind == "fits":
        return f"Fits, keeping {keep_free} of RAM free for other programs."
    if kind == "offload":
        return "Fits with part of the model in RAM: slower than all of it on the GPU."
    if result.streams_from_disk:
        return (
            "Larger than this machine's memory: it could only run by reading the weights from "
            f"disk, at {_speed_text(result.speed.decode_tps)}."
        )
    return "Larger than this machine's memory, even with a short context."


def _speed_text(tokens_per_s: float) -> str:
    if tokens_per_s < 0.1:
        return "less than 0.1 tokens/s"
    return f"about {tokens_per_s:.1f} tokens/s"


def assess_files(
    files: Sequence[HubFile],
    profile: HardwareProfile,
    calibration: dict[str, float],
    on_badge: Callable[[int, FitBadge], None] | None = None,
    stop: threading.Event | None = None,
) -> list[FitBadge]:
    """Badges for `files`, in order; `on_badge(index, badge)` as each is ready (planning a
    big model for a GPU machine takes about a second). Stops early when `stop` is set."""
    badges = []
    for index, hub_file in enumerate(files):
        if stop is not None and stop.is_set():
            break
        badges.append(assess_file(hub_file, profile, calibration))
        if on_badge is not None:
            on_badge(index, badges[-1])
    return badges


def probe_machine(home: Path) -> tuple[HardwareProfile, dict[str, float]]:
    """This machine's profile (probed in a child process) and its calibration figures."""
    profile = probe_in_subprocess(models_dir(home))
    with WisdomDB() as wisdom:
        return profile, calibration_for(profile, wisdom)


# ---- downloading (worker thread) ------------------------------------------------------------


def download_hub_file(
    home: Path,
    hub_file: HubFile,
    endpoint: HubEndpoint,
    report: Callable[[tuple[int, int]], None],
    cancel: threading.Event,
) -> ModelRecord:
    """Download, verify and register `hub_file` in the store at `home` (its own connection)."""
    with ModelStore(home) as store:
        existing = store.find_by_source(hub_file.source)
        if existing is None and hub_file.sha256 is not None:
            existing = store.find_by_sha256(hub_file.sha256)
        if existing is not None:
            raise AlreadyInstalled(existing)
        return download_model(
            hub_file,
            store,
            endpoint=endpoint,
            progress=lambda done, total: report((done, total)),
            cancel=cancel,
        )


class TransferRate:
    """Speed over the last RATE_WINDOW_S seconds and the time left at that speed."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, done_bytes: int) -> None:
        now = self._clock()
        self._samples.append((now, done_bytes))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()

    def bytes_per_s(self) -> float | None:
        if len(self._samples) < 2:
            return None
        (first_t, first_b), (last_t, last_b) = self._samples[0], self._samples[-1]
        span = last_t - first_t
        return (last_b - first_b) / span if span >= MIN_RATE_SPAN_S else None

    @property
    def last_bytes(self) -> int:
        return self._samples[-1][1] if self._samples else 0

    def seconds_left(self, done_bytes: int, total_bytes: int) -> float | None:
        speed = self.bytes_per_s()
        return (total_bytes - done_bytes) / speed if speed else None


def eta_text(seconds: float) -> str:
    if seconds < 60:
        return f"about {max(1, round(seconds))} s left"
    if seconds < 3600:
        return f"about {round(seconds / 60)} min left"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"about {hours} h {minutes} min left"


def progress_text(done_bytes: int, total_bytes: int, resumed_from: int, rate: TransferRate) -> str:
    parts = [f"{format_bytes(done_bytes)} of {format_bytes(total_bytes)}"]
    if resumed_from:
        parts[0] += f" (resumed from {format_bytes(resumed_from)})"
    speed = rate.bytes_per_s()
    if speed:
        parts.append(f"{format_bytes(int(speed))}/s")
        left = rate.seconds_left(done_bytes, total_bytes)
        if left is not None:
            parts.append(eta_text(left))
    return " — ".join(parts)


# ---- errors in plain words ------------------------------------------------------------------

# The hub client makes its errors with these two functions; an error with the same hint is one
# of theirs (the client has no error codes, and its messages name the host and status).
_NETWORK_FAILURE_HINT = connection_error("hub", OSError()).hint
_REFUSED_HINT = status_error(401, "a file").hint


def hub_error_text(error: BaseException) -> str:
    """What went wrong and what to do, worded for the window rather than the terminal."""
    if isinstance(error, HubError):
        if error.hint == _NETWORK_FAILURE_HINT:
            return f"The hub could not be reached. {error.message}\n{NETWORK_HINT}"
        if error.hint == _REFUSED_HINT:
            return f"{error.message}\n{TOKEN_HINT}"
    if isinstance(error, ModelFileError):
        return f"{error.message}\n{DAMAGED_HINT}"
    if isinstance(error, ModelStoreError) and _ran_out_of_room(error):
        return f"{error.message}\n{NO_ROOM_HINT}"
    return describe_error(error)


def _ran_out_of_room(error: BaseException) -> bool:
    cause = error.__cause__
    return isinstance(cause, OSError) and cause.errno in _NO_ROOM_ERRNOS


# ---- table texts ----------------------------------------------------------------------------


def count_text(count: int | None) -> str:
    if count is None:
        return "?"
    if count >= 10**6:
        return f"{count / 10**6:.1f} M"
    if count >= 10**4:
        return f"{count / 10**3:.0f} k"
    return f"{count:,}"


def repo_texts(summary: HubRepoSummary) -> tuple[str, ...]:
    return (
        summary.repo + ("  (gated)" if summary.gated else ""),
        count_text(summary.downloads),
        count_text(summary.likes),
        (summary.last_modified or "?")[:10],
    )


def file_texts(hub_file: HubFile) -> tuple[str, ...]:
    """Name (with "(N parts)" for a split model), quant type and size."""
    size = hub_file.size_bytes
    return (
        hub_file.display_name,
        hub_file.quant or "?",
        format_bytes(size) if size is not None else "?",
    )


# ---- the dialog -----------------------------------------------------------------------------


class HubDialog(QDialog):
    """Search the hub, pick a GGUF file by how it fits, download it into the model store.

    `profile` (and `calibration`) describe the machine the badges are for; without them the
    dialog probes this machine once, in the background. `endpoint` defaults to the settings.
    """

    downloaded = Signal(object)  # ModelRecord of the new model
    show_model = Signal(str)  # id of an installed model the user picked again
    searched = Signal()  # the repo table shows a search's results (or its error)
    listed = Signal()  # the file table shows a repo's files (or the error)
    badges_ready = Signal()  # the file table's badges are the planner's
    progress_changed = Signal(str)  # the download's progress line
    download_ended = Signal()  # the download finished, failed or stopped

    def __init__(
        self,
        home: Path | None = None,
        parent: QWidget | None = None,
        *,
        endpoint: HubEndpoint | None = None,
        profile: HardwareProfile | None = None,
        calibration: dict[str, float] | None = None,
    ) -> None:
        super().__init__(parent)
        self.home = Path(home) if home is not None else data_dir()
        self._endpoint = endpoint
        self._profile = profile
        self._calibration = dict(calibration or {})
        self._repos: list[HubRepoSummary] = []
        self._files: list[HubFile] = []
        self._badges: list[FitBadge] = []
        self._search_seq = 0
        self._list_seq = 0
        self._searched_once = False
        self._listed_repo: str | None = None
        self._probe: BackgroundTask[tuple[HardwareProfile, dict[str, float]]] | None = None
        self._download: BackgroundTask[ModelRecord] | None = None
        self._cancel = threading.Event()
        self._rate = TransferRate()
        self._resumed_from = 0
        self._first_report = True
        self._downloading_name = ""
        self._progress_relay = MainThreadRelay(self._show_progress, self)
        self._badge_relay = MainThreadRelay(self._badge_arrived, self)
        self._assess_seq = 0
        self._stop_assessing = threading.Event()
        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DEBOUNCE_MS)
        self._search_timer.timeout.connect(self.search_now)
        self.setWindowTitle("Download from the hub")
        self.setStyleSheet(STYLE)
        self._build()
        self.resize(980, 640)

    # -- public --

    @property
    def busy(self) -> bool:
        """True while a download runs."""
        return self._download is not None

    @property
    def message(self) -> str:
        return self.message_bar.text

    @property
    def repos(self) -> list[HubRepoSummary]:
        return list(self._repos)

    @property
    def files(self) -> list[HubFile]:
        return list(self._files)

    @property
    def badges(self) -> list[FitBadge]:
        return list(self._badges)

    def set_hardware(
        self, profile: HardwareProfile, calibration: dict[str, float] | None = None
    ) -> None:
        """Plan badges for this machine (a profile probed elsewhere, or a what-if one)."""
        self._profile = profile
        self._calibration = dict(calibration or {})
        self._assess_files()

    def search_now(self) -> None:
        """Search for what the box holds (also run, debounced, as the user types)."""
        self._search_timer.stop()
        self._searched_once = True
        query = self.search_box.text().strip()
        self._search_seq += 1
        seq = self._search_seq
        self.search_status.setText(f"Searching for “{query}”…" if query else "Loading popular…")
        endpoint = self._hub_endpoint()
        if endpoint is None:
            return
        run_in_background(
            lambda: search_models(query, limit=SEARCH_LIMIT, endpoint=endpoint),
            lambda results: self._show_repos(seq, results),
            lambda error: self._search_failed(seq, error),
        )

    def select_repo(self, repo: str) -> None:
        for row, summary in enumerate(self._repos):
            if summary.repo == repo:
                self.repo_table.selectRow(row)
                return

    def select_file(self, filename: str) -> None:
        for row, hub_file in enumerate(self._files):
            if filename in hub_file.filenames:
                self.file_table.selectRow(row)
                return

    def selected_file(self) -> HubFile | None:
        rows = self.file_table.selectionModel().selectedRows()
        return _at(self._files, rows[0].row()) if rows else None

    def start_download(self) -> None:
        """Download the selected file (resuming what an earlier try left)."""
        hub_file = self.selected_file()
        endpoint = self._hub_endpoint()
        if hub_file is None or endpoint is None or self._download is not None:
            return
        self._cancel = threading.Event()
        self._rate = TransferRate()
        self._resumed_from = 0
        self._first_report = True
        self._downloading_name = hub_file.display_name
        self.message_bar.hide()
        self._show_busy(f"Starting the download of {hub_file.display_name}…")
        home, cancel, report = self.home, self._cancel, self._progress_relay.post
        self._download = run_in_background(
            lambda: download_hub_file(home, hub_file, endpoint, report, cancel),
            self._download_done,
            self._download_failed,
        )

    def cancel_download(self) -> None:
        """Stop the download; what has arrived is kept for the next Download."""
        if self._download is not None:
            self._cancel.set()
            self.cancel_button.setEnabled(False)
            self._set_progress_text("Stopping…")

    def show_message(self, text: str, *, error: bool = False) -> None:
        self.message_bar.show_text(text, error=error)

    # -- Qt --

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(event)
        if not self._searched_once:
            self.search_now()  # the most downloaded GGUF repos, before anything is typed
        if self._profile is None and self._probe is None:
            self._start_probe()

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        self.cancel_download()  # closing means "stop"; the part file stays for next time
        super().closeEvent(event)

    def reject(self) -> None:
        self.cancel_download()
        super().reject()

    # -- building --

    def _build(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(16, 14, 16, 14)
        layout.setSpacing(10)
        layout.addLayout(self._build_search_row())
        layout.addWidget(self._build_message_bar())
        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self._build_repo_table())
        splitter.addWidget(self._build_file_panel())
        splitter.setSizes([260, 300])
        layout.addWidget(splitter, 1)
        layout.addWidget(self._build_progress_row())
        layout.addLayout(self._build_buttons())

    def _build_search_row(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.search_box = QLineEdit()
        self.search_box.setPlaceholderText("Search GGUF models, e.g. qwen3 or gemma-3")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.textEdited.connect(lambda _text: self._search_timer.start())
        self.search_box.returnPressed.connect(self.search_now)
        self.search_status = QLabel()
        self.search_status.setObjectName("muted")
        row.addWidget(self.search_box, 1)
        row.addWidget(self.search_status)
        return row

    def _build_message_bar(self) -> MessageBar:
        self.message_bar = MessageBar(self)
        return self.message_bar

    def _build_repo_table(self) -> QTableWidget:
        self.repo_table = _table(REPO_COLUMNS, stretch="Repo")
        self.repo_table.itemSelectionChanged.connect(self._repo_chosen)
        return self.repo_table

    def _build_file_panel(self) -> QWidget:
        panel = QWidget()
        layout = QVBoxLayout(panel)
        layout.setContentsMargins(0, 0, 0, 0)
        self.files_title = QLabel("Choose a repo to see its GGUF files.")
        self.files_title.setObjectName("muted")
        self.machine_label = QLabel()
        self.machine_label.setObjectName("muted")
        title_row = QHBoxLayout()
        title_row.addWidget(self.files_title, 1)
        title_row.addWidget(self.machine_label)
        layout.addLayout(title_row)
        self.file_table = _table(FILE_COLUMNS, stretch="File")
        badge_column = FILE_COLUMNS.index("On this machine")
        self.file_table.horizontalHeader().setSectionResizeMode(
            badge_column, QHeaderView.ResizeMode.Fixed
        )
        self.file_table.setColumnWidth(badge_column, BADGE_COLUMN_WIDTH)
        self.file_table.itemSelectionChanged.connect(self._update_buttons)
        self.file_table.cellDoubleClicked.connect(lambda _r, _c: self.start_download())
        layout.addWidget(self.file_table, 1)
        return panel

    def _build_progress_row(self) -> QWidget:
        self.progress_row = QWidget()
        row = QHBoxLayout(self.progress_row)
        row.setContentsMargins(0, 0, 0, 0)
        self.progress_label = QLabel()
        self.progress_bar = QProgressBar()
        self.progress_bar.setRange(0, PERCENT)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_download)
        row.addWidget(self.progress_label, 2)
        row.addWidget(self.progress_bar, 1)
        row.addWidget(self.cancel_button)
        self.progress_row.hide()
        return self.progress_row

    def _build_buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        note = QLabel("Badges are the planner's estimate for this machine; hover for details.")
        note.setObjectName("muted")
        self.download_button = QPushButton("Download")
        self.download_button.setObjectName("primary")
        self.download_button.setEnabled(False)
        self.download_button.clicked.connect(self.start_download)
        self.close_button = QPushButton("Close")
        self.close_button.clicked.connect(self.reject)
        row.addWidget(note, 1)
        row.addWidget(self.download_button)
        row.addWidget(self.close_button)
        return row

    # -- the hub endpoint --

    def _hub_endpoint(self) -> HubEndpoint | None:
        if self._endpoint is not None:
            return self._endpoint
        try:
            return HubEndpoint.from_settings()
        except HubError as exc:  # a bad hub address in the settings
            self.search_status.setText("")
            self.show_message(hub_error_text(exc), error=True)
            return None

    # -- search results --

    def _show_repos(self, seq: int, results: list[HubRepoSummary]) -> None:
        if seq != self._search_seq:
            return  # an older search answered after a newer one started
        chosen = self._selected_repo()
        self._repos = results
        self.search_status.setText(f"{len(results)} repos" if results else "No GGUF repos found")
        gated = "Gated: downloading needs a hub access token (Settings… → Hub access token)."
        _fill(
            self.repo_table,
            [repo_texts(summary) for summary in results],
            [gated if summary.gated else "" for summary in results],
        )
        if chosen is not None:
            self.select_repo(chosen)
        self.searched.emit()

    def _search_failed(self, seq: int, error: BaseException) -> None:
        if seq != self._search_seq:
            return
        self.search_status.setText("Search failed")
        self.show_message(hub_error_text(error), error=True)
        self.searched.emit()

    def _selected_repo(self) -> str | None:
        rows = self.repo_table.selectionModel().selectedRows()
        summary = _at(self._repos, rows[0].row()) if rows else None
        return summary.repo if summary is not None else None

    # -- a repo's files --

    def _repo_chosen(self) -> None:
        repo = self._selected_repo()
        if repo is None or repo == self._listed_repo:
            return
        self._listed_repo = repo
        self._list_seq += 1
        seq = self._list_seq
        self._set_files([], [])
        self.files_title.setText(f"Listing the GGUF files of {repo}…")
        endpoint = self._hub_endpoint()
        if endpoint is None:
            return
        run_in_background(
            lambda: list_repo_gguf_files(repo, endpoint=endpoint),
            lambda files: self._show_files(seq, repo, files),
            lambda error: self._listing_failed(seq, repo, error),
        )

    def _show_files(self, seq: int, repo: str, files: list[HubFile]) -> None:
        if seq != self._list_seq:
            return
        count = f"{len(files)} GGUF file{'s' if len(files) != 1 else ''}" if files else "no GGUF"
        self.files_title.setText(f"{repo}: {count}")
        self._set_files(files, [PENDING_BADGE] * len(files))
        if len(files) == 1:
            self.file_table.selectRow(0)
        self.listed.emit()
        self._assess_files()

    def _listing_failed(self, seq: int, repo: str, error: BaseException) -> None:
        if seq != self._list_seq:
            return
        self._listed_repo = None  # choosing it again tries again
        self.files_title.setText(f"Could not list {repo}.")
        self.show_message(hub_error_text(error), error=True)
        self.listed.emit()

    def _set_files(self, files: list[HubFile], badges: list[FitBadge]) -> None:
        self._stop_assessment()
        chosen = self.selected_file()
        self._files = files
        _fill(
            self.file_table,
            [file_texts(hub_file) for hub_file in files],
            ["\n".join(hub_file.filenames) for hub_file in files],
        )
        self._show_badges(badges)
        if chosen is not None and chosen in files:
            self.select_file(chosen.filename)
        self._update_buttons()

    def _show_badges(self, badges: list[FitBadge]) -> None:
        self._badges = list(badges)
        for row, badge in enumerate(badges):
            self._show_badge(row, badge)

    def _show_badge(self, row: int, badge: FitBadge) -> None:
        label = QLabel(badge.label)
        label.setObjectName("badge")
        label.setProperty("kind", badge.kind)
        label.setToolTip(badge.tooltip)
        label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        holder = QWidget()
        holder.setToolTip(badge.tooltip)
        box = QHBoxLayout(holder)
        box.setContentsMargins(4, 2, 4, 2)
        box.addWidget(label)
        box.addStretch(1)
        self.file_table.setCellWidget(row, FILE_COLUMNS.index("On this machine"), holder)

    # -- fit badges --

    def _start_probe(self) -> None:
        self.machine_label.setText("Looking at this machine…")
        home = self.home
        self._probe = run_in_background(
            lambda: probe_machine(home), self._probed, self._probe_failed
        )

    def _probed(self, result: tuple[HardwareProfile, dict[str, float]]) -> None:
        profile, calibration = result
        self.set_hardware(profile, calibration)

    def _probe_failed(self, error: BaseException) -> None:
        self.set_hardware(_failed_probe_profile(error))

    def _assess_files(self) -> None:
        """Plan every listed file for the machine, in the background, row by row."""
        profile = self._profile
        if profile is None:
            return
        self.machine_label.setText(machine_summary(profile))
        stop = self._stop_assessment()
        seq, files, calibration = self._assess_seq, list(self._files), dict(self._calibration)
        if not files:
            return
        self._show_badges([PENDING_BADGE] * len(files))
        post = self._badge_relay.post
        run_in_background(
            lambda: assess_files(
                files, profile, calibration, lambda i, badge: post((seq, i, badge)), stop
            ),
            lambda _badges: self._assessed(seq),
        )

    def _stop_assessment(self) -> threading.Event:
        """Drop the badges being planned (the files or the machine changed); a new stop event
        for the next assessment."""
        self._stop_assessing.set()
        self._stop_assessing = threading.Event()
        self._assess_seq += 1
        return self._stop_assessing

    def _badge_arrived(self, value: tuple[int, int, FitBadge]) -> None:
        seq, index, badge = value
        if seq == self._assess_seq and index < len(self._badges):
            self._badges[index] = badge
            self._show_badge(index, badge)

    def _assessed(self, seq: int) -> None:
        if seq == self._assess_seq:
            self.badges_ready.emit()

    # -- downloading --

    def _update_buttons(self) -> None:
        self.download_button.setEnabled(self.selected_file() is not None and not self.busy)

    def _set_progress_text(self, text: str) -> None:
        self.progress_label.setText(text)
        self.progress_changed.emit(text)

    def _show_busy(self, text: str) -> None:
        self._set_progress_text(text)
        self.progress_bar.setRange(0, 0)
        self.cancel_button.setEnabled(True)
        self.progress_row.show()
        self._update_buttons()

    def _show_progress(self, value: tuple[int, int]) -> None:
        done, total = value
        if self._download is None:
            return
        if self._first_report:
            self._first_report = False
            self._resumed_from = done  # download_model reports the kept bytes first
            if done:
                self._set_progress_text(f"Resuming from {format_bytes(done)}…")
        self._rate.add(done)
        if total <= 0:
            self._set_progress_text(f"Downloading: {format_bytes(done)}")
            return
        self.progress_bar.setRange(0, PERCENT)
        self.progress_bar.setValue(done * PERCENT // total)
        if done > self._resumed_from or not self._resumed_from:
            line = progress_text(done, total, self._resumed_from, self._rate)
            self._set_progress_text(f"{self._downloading_name}: {line}")

    def _download_finished(self) -> None:
        self._download = None
        self.progress_row.hide()
        self._update_buttons()
        self.download_ended.emit()

    def _download_done(self, record: ModelRecord) -> None:
        self._download_finished()
        self.show_message(f"Added {record.name} ({format_bytes(record.size_bytes)}).")
        self.downloaded.emit(record)
        self.accept()

    def _download_failed(self, error: BaseException) -> None:
        self._download_finished()
        if isinstance(error, AlreadyInstalled):
            self.show_message(error.user_text())
            self.show_model.emit(error.record.id)
        elif isinstance(error, DownloadCancelled):
            kept = self._rate.last_bytes
            what = (
                f"{format_bytes(kept)} is kept: press Download to resume from there."
                if kept
                else "Nothing had arrived yet."
            )
            self.show_message(f"Stopped the download of {self._downloading_name}. {what}")
        else:
            self.show_message(hub_error_text(error), error=True)


def _failed_probe_profile(error: BaseException) -> HardwareProfile:
    """What the badges know when probing raised: nothing about memory, so every badge says so."""
    reason = error.message if isinstance(error, HearthsideError) else type(error).__name__
    return HardwareProfile(
        cpu=CpuInfo(arch=platform.machine()),
        memory=MemoryInfo(),
        os=sys.platform,
        errors=(ProbeError("probe", reason),),
    )


def machine_summary(profile: HardwareProfile) -> str:
    ram = profile.memory.usable_bytes
    parts = [f"{format_bytes(ram)} RAM" if ram else "RAM unknown"]
    parts += [
        f"{gpu.name} {format_bytes(gpu.vram_total_bytes)}" if gpu.vram_total_bytes else gpu.name
        for gpu in profile.gpus
    ]
    return "Badges for this machine: " + ", ".join(parts)


def _table(columns: Sequence[str], *, stretch: str) -> QTableWidget:
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setAlternatingRowColors(True)
    table.setShowGrid(False)
    table.setWordWrap(False)
    table.verticalHeader().hide()
    table.verticalHeader().setDefaultSectionSize(30)
    header = table.horizontalHeader()
    header.setHighlightSections(False)
    header.setDefaultAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter)
    for column in range(len(columns)):
        header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
    header.setSectionResizeMode(list(columns).index(stretch), QHeaderView.ResizeMode.Stretch)
    return table


def _fill(table: QTableWidget, rows: Sequence[Sequence[str]], tooltips: Sequence[str]) -> None:
    """New contents and no selection, without a selection signal for the rows going away;
    `tooltips[row]` goes on the row's first cell."""
    table.blockSignals(True)
    try:
        table.clearSelection()
        table.clearContents()
        table.setRowCount(len(rows))
        for row, texts in enumerate(rows):
            for column, text in enumerate(texts):
                item = QTableWidgetItem(text)
                if column == 0 and tooltips[row]:
                    item.setToolTip(tooltips[row])
                table.setItem(row, column, item)
    finally:
        table.blockSignals(False)


T = TypeVar("T")


def _at(items: Sequence[T], index: int) -> T | None:
    return items[index] if 0 <= index < len(items) else None


# ---- a staged dialog for screenshots (sample hub data, no network) ---------------------------

_SAMPLE_REPOS = (  # (repo, downloads, likes, last modified, gated)
    ("bartowski/Meta-Llama-3.1-70B-Instruct-GGUF", 48_213, 311, "2024-09-24", False),
    ("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF", 1_104_998, 1_012, "2024-09-24", False),
    ("unsloth/Llama-3.2-3B-Instruct-GGUF", 402_117, 187, "2025-05-12", False),
    ("meta-llama/Llama-3.2-1B-Instruct-GGUF", 96_402, 140, "2024-10-24", True),
)
_SAMPLE_FILES = (  # the 70B repo's files as the hub lists them: (quant, GB, parts)
    ("IQ1_M", 16.8, 1),
    ("IQ2_M", 24.1, 1),
    ("Q3_K_M", 34.3, 1),
    ("Q4_K_M", 42.5, 1),
    ("Q5_K_M", 49.9, 1),
    ("Q6_K", 57.9, 2),
    ("Q8_0", 75.0, 2),
    ("F16", 141.1, 3),
)
_SAMPLE_DOWNLOAD = 3  # the Q4_K_M file, resumed from 12 GB, at 18 GB now, 50 MB/s


def _sample_files(repo: str) -> list[HubFile]:
    stem = repo.split("/", 1)[1].removesuffix("-GGUF")
    files = []
    for quant, size_gb, count in _SAMPLE_FILES:
        if count == 1:
            names = [f"{stem}-{quant}.gguf"]
        else:
            names = [
                f"{stem}-{quant}/{stem}-{quant}-{i:05d}-of-{count:05d}.gguf"
                for i in range(1, count + 1)
            ]
        part_bytes = int(size_gb * 10**9) // count
        files.append(HubFile(repo, tuple(HubFilePart(n, part_bytes, None) for n in names), quant))
    return files


def staged_for_screenshot(
    profile: HardwareProfile, calibration: dict[str, float] | None = None
) -> HubDialog:
    """The dialog as a user sees it mid-download: results for "llama", the 70B repo's files
    with the planner's real badges for `profile`, and a resumed download's progress. The hub
    data is a sample (sizes as the hub lists them); nothing touches the network."""
    dialog = HubDialog(profile=profile, calibration=calibration)
    dialog._searched_once = True  # no live search when it is shown
    dialog.search_box.setText("llama")
    dialog._show_repos(dialog._search_seq, [HubRepoSummary(*repo) for repo in _SAMPLE_REPOS])
    repo = _SAMPLE_REPOS[0][0]
    dialog._listed_repo = repo  # selecting it below must not list it from the hub
    dialog.select_repo(repo)
    files = _sample_files(repo)
    dialog.files_title.setText(f"{repo}: {len(files)} GGUF files")
    dialog.machine_label.setText(machine_summary(profile))
    dialog._set_files(files, assess_files(files, profile, dialog._calibration))
    chosen = files[_SAMPLE_DOWNLOAD]
    dialog.select_file(chosen.filename)
    total = chosen.size_bytes or 0
    moments = iter((0.0, 4.0))
    rate = TransferRate(clock=lambda: next(moments))
    rate.add(17_800_000_000)
    rate.add(18_000_000_000)
    dialog.progress_bar.setValue(18_000_000_000 * PERCENT // total)
    line = progress_text(18_000_000_000, total, 12_000_000_000, rate)
    dialog._set_progress_text(f"{chosen.display_name}: {line}")
    dialog.progress_row.show()
    dialog.download_button.setEnabled(False)  # as while a download runs
    return dialog
