"""The window's one `MachineContext`: this machine's profile, calibration figures and
fingerprints, read once and handed to the pages that show or plan with them.

    machine = MachineState(window)
    machine.changed.connect(plan_page.set_context)
    machine.set_profile(profile)   # after a probe: read the context for it
    machine.refresh()              # after a calibration, a tuning run or Apply: read it again

The read (a few queries of the autotune DB) runs on a worker thread; `changed`
carries the new context on the GUI thread, so the Hardware and Plan pages show a new
calibration without "Probe again". A read that a later one overtook is dropped.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from hearthside.app.gui.workers import run_in_background
from hearthside.autotune.calibration import read_machine_context
from hearthside.autotune.machine import MachineContext
from hearthside.autotune.wisdom import WisdomDB
from hearthside.core.probe.profile import HardwareProfile


def _read_context(profile: HardwareProfile) -> MachineContext:
    """`optimize.machine_context`'s read, without importing the tuner behind it."""
    with WisdomDB() as wisdom:
        return read_machine_context(profile, wisdom)


class MachineState(QObject):
    changed = Signal(object)  # MachineContext
    failed = Signal(object)  # BaseException: the autotune DB could not be read

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.profile: HardwareProfile | None = None
        self.context: MachineContext | None = None
        self._serial = 0  # the latest read's
        self._in_flight = 0

    @property
    def reading(self) -> bool:
        return self._in_flight > 0

    def set_profile(self, profile: HardwareProfile) -> None:
        """A probe found `profile`: read its context (unless it is the one already held)."""
        if profile is self.profile:
            return
        self.profile = profile
        self.refresh()

    def refresh(self) -> None:
        """Read the context again: a calibration or a tuning run stored new figures."""
        profile = self.profile
        if profile is None:
            return
        self._serial += 1
        self._in_flight += 1
        serial = self._serial
        run_in_background(lambda: (serial, _read_context(profile)), self._arrived, self._failed)

    def _arrived(self, outcome: tuple[int, MachineContext]) -> None:
        self._in_flight -= 1
        serial, context = outcome
        if serial != self._serial:  # a later read is on its way: it has the newer figures
            return
        self.context = context
        self.changed.emit(context)

    def _failed(self, error: BaseException) -> None:
        self._in_flight -= 1
        if not self._in_flight:  # else a later read is on its way and may yet succeed
            self.failed.emit(error)
