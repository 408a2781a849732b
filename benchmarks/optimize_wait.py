"""The Optimize wizard's shortest budget, run as a person runs it: is the wait it states the
wait they have, and does it measure what matters (issue 32)?

The real wizard (offscreen), the real engine service and tuner, the default chat model
(SmolLM2 135M Q4_1) in a fresh data folder: the first page's "Calibrate this machine first"
as the wizard offers it on a machine never calibrated (`--no-calibrate` to leave it off), the
shortest budget a person may pick (30 s), the default goal. It reads what the goal page says
before Start (the whole wait, and what that measures), presses Start, and times the wait
until the result page, then prints the verdict the page shows.

    .venv/bin/python benchmarks/optimize_wait.py [--budget-s 30] [--no-calibrate] [--json]

Targets: the real wait <= 1.15x the stated one; llama.cpp's defaults and the two settings the
cost model ranks best (the first three in the tuner's queue) measured. Exit status 1 on a
miss. Run it on a quiet machine: a busy one makes the run say so and store nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _setup import add_data_option, data_home  # noqa: E402
from _targets import Target, report  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from hearthside.app.gui.wizard import BUDGET_MIN_S, OptimizeWizard  # noqa: E402
from hearthside.autotune.optimize import MeasureUpdate, TuneResult, verdict  # noqa: E402
from hearthside.autotune.tune_wait import WORTH_MEASURING, expected_wait  # noqa: E402
from hearthside.core.engine.service import EngineService  # noqa: E402
from hearthside.core.probe.base import ProbeContext  # noqa: E402
from hearthside.core.probe.runner import probe_hardware  # noqa: E402

WAIT_WITHIN = 1.15  # the real wait / the stated one
PAGE_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class WaitRun:
    budget_s: float
    calibrate: bool
    said: str  # the goal page's words before Start
    stated_s: float  # the whole wait it stated
    expected_measured: int  # the candidates the estimate said the budget reaches
    candidate_s: float  # the estimate's cost of one candidate
    cost_source: str  # "measured" or "estimated"
    waited_s: float  # Start to the result page
    queue: int  # candidates in the tuner's queue
    measured_positions: tuple[int, ...]  # queue positions measured (1-based)
    headline: str
    detail: str


def targets(run: WaitRun) -> list[Target]:
    """The verdicts, a pure function of one run's figures."""
    first = set(range(1, min(WORTH_MEASURING, run.queue) + 1))
    return [
        Target("real wait / stated wait", run.waited_s / run.stated_s, WAIT_WITHIN, "at most"),
        Target.holds(
            "llama.cpp's defaults and the two settings ranked best measured",
            first <= set(run.measured_positions),
        ),
    ]


def run_wizard(budget_s: float, calibrate: bool) -> WaitRun:
    app = QApplication.instance() or QApplication([])
    profile = probe_hardware(ProbeContext())
    with EngineService() as service:
        wizard = OptimizeWizard(service, profile)
        wizard.show()
        _wait(app, wizard.found_page.isComplete, PAGE_TIMEOUT_S)
        wizard.found_page.calibrate_box.setChecked(calibrate)
        wizard.next()
        _wait(app, lambda: wizard.goal_page.models.count() > 0, PAGE_TIMEOUT_S)
        wizard.goal_page.select_model(None)  # the default model
        wizard.goal_page.budget.setValue(int(budget_s))
        _wait(app, lambda: wizard.costs is not None, PAGE_TIMEOUT_S)
        costs = wizard.costs
        assert costs is not None
        said, stated_s = wizard.goal_page.wait.text(), wizard.stated_wait_s
        updates: list[MeasureUpdate] = []
        ended: list[object] = []
        wizard.runner.update.connect(updates.append)
        wizard.runner.finished.connect(ended.append)
        wizard.runner.failed.connect(ended.append)
        started = time.monotonic()
        wizard.next()
        _wait(app, lambda: bool(ended), RUN_TIMEOUT_S)
        waited_s = time.monotonic() - started
        result = ended[0]
        if not isinstance(result, TuneResult):
            raise SystemExit(f"the wizard measured nothing: {result!r}")
        headline, detail = verdict(result)
        wizard.reject()
    measured = sorted(
        {
            u.event.index
            for u in updates
            if u.event is not None
            and u.event.kind in ("measured", "reused")
            and u.event.workload is None
            and not u.event.variant
        }
    )
    return WaitRun(
        budget_s,
        calibrate,
        said,
        stated_s,
        expected_wait(budget_s, costs).measured,
        costs.candidate_s,
        costs.source,
        waited_s,
        result.candidates,
        tuple(measured),
        headline,
        detail,
    )


def _wait(app: QApplication, condition: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up after {timeout_s:.0f} s waiting for the wizard")
        app.processEvents()
        time.sleep(0.02)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=BUDGET_MIN_S)
    parser.add_argument("--no-calibrate", action="store_true")
    parser.add_argument("--json", action="store_true", help="also print the run as JSON")
    add_data_option(parser)
    args = parser.parse_args(argv)
    with data_home(args.use_my_data) as home:
        print(home.describe())
        home.default_chat_model()
        run = run_wizard(args.budget_s, calibrate=not args.no_calibrate)
    print(f"goal page, before Start: {run.said}")
    print(
        f"stated wait {run.stated_s:.0f} s (budget {run.budget_s:.0f} s"
        f"{', a calibration first' if run.calibrate else ''}); real wait {run.waited_s:.1f} s"
    )
    print(
        f"one candidate: {run.candidate_s:.1f} s ({run.cost_source}); expected to measure "
        f"{run.expected_measured} of {run.queue}, measured positions {list(run.measured_positions)}"
    )
    print(f"verdict: {run.headline}. {run.detail}")
    if args.json:
        print(json.dumps(asdict(run), indent=1))
    return report(targets(run))


if __name__ == "__main__":
    sys.exit(main())
