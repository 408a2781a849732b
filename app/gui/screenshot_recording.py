"""A real tuning run, recorded to replay in the Optimize wizard for screenshots and tests.

The recording (`tests/fixtures/wizard/tune_events.json`, made by
`tests/fixtures/wizard/record_tune.py` from a short real tune of the default model) holds the
machine, every `MeasureUpdate` the wizard saw and the `TuneResult`. `RecordedTuneRunner` plays
it back in place of the engine job, and `wizard_for_screenshots` opens a wizard on any page
showing it (`screenshots.py`). It lives here, beside the screenshots, not in the Optimize flow
(`autotune/optimize.py`) or the wizard: the product never reads a recording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QWidget

from hearthside.app.gui.wizard import (
    PAGE_MEASURE,
    OptimizeWizard,
    RunnerSignals,
)
from hearthside.autotune.optimize import (
    MeasureRequest,
    MeasureUpdate,
    ModelChoice,
    TuneResult,
    machine_context,
    model_choices,
)
from hearthside.core.errors import HearthsideError
from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.serialize import from_jsonable, to_jsonable

RECORDING_SCHEMA = 1
RECORDING = "tune_events.json"
# The recording sits with the tests' fixtures: this replays it from a source tree only.
RECORDING_PATH = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "wizard" / RECORDING


@dataclass(frozen=True)
class TuneRecording:
    """A real tuning run, kept to replay (screenshots): the machine, the updates, the result."""

    profile: HardwareProfile
    model_name: str
    updates: tuple[MeasureUpdate, ...]
    result: TuneResult

    def to_json(self) -> str:
        data = {
            "schema": RECORDING_SCHEMA,
            "profile": json.loads(self.profile.to_json()),
            "model_name": self.model_name,
            "updates": [to_jsonable(update) for update in self.updates],
            "result": to_jsonable(self.result),
        }
        return json.dumps(data, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TuneRecording:
        data = json.loads(text)
        if data.get("schema") != RECORDING_SCHEMA:
            raise HearthsideError("This tuning recording has an unknown schema.")
        return cls(
            profile=HardwareProfile.from_json(json.dumps(data["profile"])),
            model_name=data["model_name"],
            updates=tuple(from_jsonable(MeasureUpdate, item) for item in data["updates"]),
            result=from_jsonable(TuneResult, data["result"]),
        )


def recorded_run() -> TuneRecording:
    """The recording kept with the tests (a real short tune of the default model)."""
    if not RECORDING_PATH.is_file():
        raise HearthsideError(
            f"No tuning recording at {RECORDING_PATH}.", hint="Run from a source tree."
        )
    return TuneRecording.from_json(RECORDING_PATH.read_text(encoding="utf-8"))


class RecordedTuneRunner(RunnerSignals):
    """Replays a recording as if it ran now (for screenshots), `interval_ms` between updates."""

    def __init__(
        self, recording: TuneRecording, interval_ms: int = 0, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.recording = recording
        self._pending: list[MeasureUpdate] = []
        self._done = False
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._next)

    @property
    def running(self) -> bool:
        return self._timer.isActive() or bool(self._pending)

    @property
    def started(self) -> bool:
        return self.running  # a replay never waits in a queue

    def start(self, request: MeasureRequest) -> None:
        self._pending = list(self.recording.updates)
        self._done = False
        self._timer.start()

    def cancel(self) -> None:
        self._pending = []
        self._timer.start()  # finish with the recorded result

    def replay_now(self, limit: int | None = None) -> None:
        """Deliver the updates at once (no event loop needed); with `limit`, only that many
        and then hold, as if the run were still going."""
        self._timer.stop()
        count = len(self._pending) if limit is None else limit
        for _ in range(min(count, len(self._pending))):
            self.update.emit(self._pending.pop(0))
        if limit is None:
            self._finish()

    def _next(self) -> None:
        if self._pending:
            self.update.emit(self._pending.pop(0))
        else:
            self._finish()

    def _finish(self) -> None:
        self._timer.stop()
        if not self._done:
            self._done = True
            self.finished.emit(self.recording.result)


def wizard_for_screenshots(
    page: int,
    recording: TuneRecording | None = None,
    parent: QWidget | None = None,
    *,
    mid_run: bool = False,
) -> OptimizeWizard:
    """A wizard on `page` (PAGE_FOUND … PAGE_RESULT) showing a real recorded run, without an
    engine: the recorded machine, the models in the data dir plus catalog suggestions, the
    recorded candidates on the chart, and the recorded result. `mid_run` holds the measuring
    page two thirds of the way through the run."""
    recording = recording or recorded_run()
    runner = RecordedTuneRunner(recording)
    wizard = OptimizeWizard(None, recording.profile, parent, runner=runner)
    found = machine_context(recording.profile)
    wizard.show_survey(found)
    choices = model_choices(found.profile, found.calibration)
    recorded_choice = ModelChoice(
        "default", recording.model_name, "recorded run", Path(f"{recording.model_name}.gguf")
    )
    if not any(choice.installed for choice in choices):
        choices.insert(0, recorded_choice)
    wizard.show_choices(choices)
    wizard.goal_page.goal_buttons[recording.result.goal].setChecked(True)
    wizard.restart()
    for _ in range(page):
        wizard.next()
        if wizard.currentId() == PAGE_MEASURE:
            held = mid_run and page == PAGE_MEASURE
            runner.replay_now(len(recording.updates) * 2 // 3 if held else None)
    return wizard
