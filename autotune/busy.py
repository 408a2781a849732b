"""Whether other programs were busy while measuring: one sentence saying why, or None.

A desktop is rarely idle, and a busy one makes measured settings wrong in ways no budget
fixes: on a 2-core machine with one core taken, two decode threads measure several times
slower than one, and do so erratically. Two things give it away: the CPU time other programs
used while measuring (`core/probe/cpu_use.py`, counted around the wizard's and `hearthside
tune`'s whole run, and around each setting's own run, where a burst shows that the whole
run's average hides), and the repeats of one tuner run (llama-bench style,
`core/engine/bench.py`) disagreeing. A run that was disturbed stores no default, the wizard
and `hearthside tune` say so, and the next run measures the disturbed settings again instead
of reusing them. Pure: measured records, reports and CPU figures in, words out.

A calibration's repeats varying is no verdict on its own: on an idle 2-vCPU Zen 4 VM 17-29 of
53 measurements varied by more than 15% (its short engine probes by 25-72%), while two busy
loops taking both cores steadily left a calibration's repeats agreeing (CI, 2026-12-07).
"""

from __future__ import annotations

from collections.abc import Sequence

from hearthside.autotune.records import RunRecord
from hearthside.core.probe.cpu_use import OTHERS_BUSY_CORES
from hearthside.kernels.anomalies import NOISY_SPREAD
from hearthside.kernels.results import CalibrationReport

# (max - min) / median of one run's repetitions beyond which they disagree. Measured on the
# 2-core Xeon VM with AMX (2026-12-04, tiny-dense Q8_0, 3 repetitions of pp128 and tg32 each): one
# thread beside other people's work spread 0.2-8% (two threads 60-292%: that VM is shared);
# with two busy loops started beside it, two threads spread 32-1976% (one thread 0.3-14%:
# steady but slower, which repeats cannot catch).
REPEAT_NOISE_BOUND = 0.25
# The share of a calibration's measurements varying by more than `NOISY_SPREAD` beyond which
# its figures are unsteady (benchmarks say so beside their predictions). Recorded reports
# (tests/fixtures/calibration): the quiet Sapphire Rapids VM 1 of 51 (2%), the busy EPYC VM 27
# of 45 (60%), issue 32's busy run 12 of 53 (23%), but also the idle Zen 4 VM 29 of 53.
UNSTEADY_CALIBRATION_SHARE = 0.1
ADVICE = (
    "Other programs were busy while measuring: these figures may be off; close them and "
    "measure again."
)


def repeats_disagree(run: RunRecord) -> bool:
    """Whether `run`'s repetitions disagreed beyond the noise bound."""
    return run.repeat_spread is not None and run.repeat_spread > REPEAT_NOISE_BOUND


def others_were_busy(run: RunRecord) -> bool:
    """Whether other programs kept more than `OTHERS_BUSY_CORES` busy while `run` was
    measured: a burst the whole tuning's average hides."""
    return run.others_cores is not None and run.others_cores > OTHERS_BUSY_CORES


def disturbed(run: RunRecord) -> bool:
    """Whether `run` was measured beside busy programs, by its repeats or by what other
    programs used meanwhile: measure it again rather than reuse or learn from it."""
    return repeats_disagree(run) or others_were_busy(run)


def disturbed_note(run: RunRecord) -> str:
    """What a person reads beside one setting measured beside busy programs; "" otherwise."""
    if others_were_busy(run):
        why = f"other programs kept {run.others_cores or 0.0:.1f} cores busy meanwhile"
    elif repeats_disagree(run):
        why = f"its repetitions disagreed by {run.repeat_spread or 0.0:.0%}"
    else:
        return ""
    return f"{why}: this speed may read low, and the next tuning measures it again"


def busy_from_runs(
    runs: Sequence[RunRecord], pick: RunRecord | None, baseline: RunRecord | None
) -> str | None:
    """Why the tuner's runs say other programs were busy: the pick or llama.cpp's defaults
    (the verdict compares them) were disturbed, or half the runs were."""
    timed = [run for run in runs if run.repeat_spread is not None]
    noisy = [run for run in timed if disturbed(run)]
    decisive = [run for run in (pick, baseline) if run is not None and disturbed(run)]
    if not noisy or (not decisive and 2 * len(noisy) < len(timed)):
        return None
    return joined(_others_reason(noisy, len(timed)), _repeats_reason(noisy, len(timed)))


def _others_reason(noisy: Sequence[RunRecord], timed: int) -> str | None:
    beside = [run for run in noisy if others_were_busy(run)]
    if not beside:
        return None
    most = max(run.others_cores or 0.0 for run in beside)
    return (
        f"other programs kept up to {most:.1f} cores busy while {len(beside)} of {timed} "
        "settings were measured"
    )


def _repeats_reason(noisy: Sequence[RunRecord], timed: int) -> str | None:
    disagreeing = [run for run in noisy if repeats_disagree(run)]
    if not disagreeing:
        return None
    worst = max(disagreeing, key=lambda run: run.repeat_spread or 0.0)
    return (
        f"the repetitions of {len(disagreeing)} of {timed} settings disagreed by more than "
        f"{REPEAT_NOISE_BOUND:.0%} (up to {worst.repeat_spread or 0.0:.0%}, with "
        f"{worst.config.get('n_threads') or 'automatic'} threads)"
    )


def busy_from_others(others_cores: float, cores: int) -> str | None:
    """Why other programs were busy, when they kept more than `OTHERS_BUSY_CORES` of this
    machine's `cores` busy on average while measuring."""
    if others_cores <= OTHERS_BUSY_CORES:
        return None
    return (
        f"other programs kept {min(others_cores, cores):.1f} of {cores} cores busy on average "
        "while measuring"
    )


def unsteady_calibration(report: CalibrationReport) -> str | None:
    """How unsteady a calibration's figures are, when too many of its measurements varied
    between repetitions; no verdict on other programs (see the module's note)."""
    measured = [m for m in report.measurements if m.ok]
    noisy = [m for m in measured if m.spread > NOISY_SPREAD]
    if not measured or len(noisy) <= UNSTEADY_CALIBRATION_SHARE * len(measured):
        return None
    return (
        f"{len(noisy)} of {len(measured)} calibration measurements varied by more than "
        f"{NOISY_SPREAD:.0%} between repetitions"
    )


def joined(*reasons: str | None) -> str | None:
    """The reasons given, in one sentence; None when there are none."""
    given = [reason for reason in reasons if reason]
    return "; ".join(given) if given else None


def busy_text(reason: str) -> str:
    """What a person reads: the advice, then the reason."""
    return f"{ADVICE} ({reason[0].upper()}{reason[1:]}.)"
