"""Time from launching `hearthside gui` to a visible window, and to a loaded engine.

Each run starts the real `hearthside` command (this environment's console script) as a new
process on the offscreen platform (or under Xvfb with --xvfb) with
HEARTHSIDE_STARTUP_MARKER set; the app appends `shown <unix time>` when the window is first
painted and `engine-ready <unix time>` when the default model has loaded. The clock starts
just before the process is spawned, so interpreter start-up and every import count.

    .venv/bin/python benchmarks/startup.py [--runs 5] [--xvfb] [--importtime] [--json]
        [--entry cli|gui_main]

One unmeasured run first installs the default model into a temporary data dir (a first run
assembles 253 MB; that is not start-up). Target: median time to `shown` under 2 s on this
machine; exit status 1 on a miss. `--importtime` adds one run under `python -X importtime` and
lists the modules that cost most before the window could show."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _setup import print_settings
from _targets import Target
from _targets import report as report_targets

TARGET_SHOWN_S = 2.0
TIMEOUT_S = 300.0
HEARTHSIDE = Path(sys.executable).parent / "hearthside"


# `gui_main` straight from app/gui_cli.py: what `hearthside gui` costs once the CLI skips
# building every other subcommand (whose modules import the engine, numpy and fastapi).
GUI_MAIN = "import sys; from hearthside.app.gui_cli import gui_main; sys.exit(gui_main([]))"


def launch_command(xvfb: bool, importtime: bool = False, entry: str = "cli") -> list[str]:
    python = [sys.executable, "-X", "importtime"] if importtime else [sys.executable]
    if entry == "gui_main":
        command = [*python, "-c", GUI_MAIN]
    elif importtime:
        command = [*python, "-m", "hearthside.app.cli", "gui"]
    else:
        command = [str(HEARTHSIDE), "gui"]
    if xvfb:
        return ["xvfb-run", "-a", "-s", "-screen 0 1400x900x24", *command]
    return command


def one_run(
    home: Path, xvfb: bool, importtime: bool = False, entry: str = "cli"
) -> dict[str, float | str]:
    """Launch, wait for `engine-ready`, close; seconds from spawn to each event."""
    marker = home / "startup-marker.txt"
    marker.unlink(missing_ok=True)
    env = dict(os.environ, HEARTHSIDE_HOME=str(home), HEARTHSIDE_STARTUP_MARKER=str(marker))
    if not xvfb:
        env["QT_QPA_PLATFORM"] = "offscreen"
    stderr_path = home / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        started = time.time()
        child = subprocess.Popen(
            launch_command(xvfb, importtime, entry),
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        try:
            events = wait_for(marker, "engine-ready", child)
        finally:
            child.terminate()
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
    result: dict[str, float | str] = {name: at - started for name, at in events.items()}
    if importtime:
        result["importtime"] = stderr_path.read_text(encoding="utf-8", errors="replace")
    return result


def wait_for(marker: Path, last: str, child: subprocess.Popen[bytes]) -> dict[str, float]:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        events = read_events(marker)
        if last in events:
            return events
        if child.poll() is not None:
            raise SystemExit(f"hearthside exited ({child.returncode}) before '{last}'")
        time.sleep(0.01)
    raise SystemExit(f"no '{last}' within {TIMEOUT_S:.0f} s")


def read_events(marker: Path) -> dict[str, float]:
    events: dict[str, float] = {}
    try:
        lines = marker.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return events
    for line in lines:
        name, _, stamp = line.partition(" ")
        if stamp:
            events.setdefault(name, float(stamp))
    return events


def slowest_imports(importtime_log: str, top: int = 15) -> list[tuple[float, str]]:
    """(cumulative seconds, module) for the costliest top-level imports in an importtime log."""
    found = []
    for line in importtime_log.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = (part.strip() for part in line[12:].split("|"))
        if cumulative.isdigit():
            found.append((int(cumulative) / 1e6, name))
    return sorted(found, reverse=True)[:top]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--xvfb", action="store_true", help="a real X server (xvfb-run)")
    parser.add_argument("--importtime", action="store_true", help="list the slowest imports")
    parser.add_argument(
        "--entry",
        choices=("cli", "gui_main"),
        default="cli",
        help="cli: the `hearthside gui` command; gui_main: app/gui_cli.gui_main directly",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.xvfb and shutil.which("xvfb-run") is None:
        raise SystemExit("xvfb-run is not installed (apt package xvfb)")
    with tempfile.TemporaryDirectory(prefix="hearthside-startup-") as folder:
        home = Path(folder)
        print_settings(
            "startup runs",
            {
                "command": " ".join(launch_command(args.xvfb, entry=args.entry)),
                "platform": "xvfb" if args.xvfb else "offscreen",
                "data folder": f"fresh ({home}), the default model installed by an unmeasured "
                "first run",
                "measured runs": args.runs,
                "clock": "from just before the process is spawned to each marker line",
            },
        )
        first = one_run(home, args.xvfb, entry=args.entry)  # installs the default model
        runs = [one_run(home, args.xvfb, entry=args.entry) for _ in range(args.runs)]
        profile = (
            one_run(home, args.xvfb, importtime=True, entry=args.entry) if args.importtime else None
        )
    phases = {
        name: statistics.median(float(run[name]) for run in runs)
        for name in ("qt-ready", "window-built", "shown", "engine-ready")
    }
    shown = [float(run["shown"]) for run in runs]
    ready = [float(run["engine-ready"]) for run in runs]
    report = {
        "platform": "xvfb" if args.xvfb else "offscreen",
        "entry": args.entry,
        "first_run_engine_ready_s": first["engine-ready"],
        "shown_s": shown,
        "engine_ready_s": ready,
        "median_shown_s": statistics.median(shown),
        "median_engine_ready_s": statistics.median(ready),
        "median_phases_s": phases,
        "target_shown_s": TARGET_SHOWN_S,
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
    }
    if profile is not None:
        report["slowest_imports"] = slowest_imports(str(profile["importtime"]))
    out = sys.stderr if args.json else sys.stdout
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print_figures(report)
    return report_targets(targets_of(report), out)


def targets_of(figures: dict[str, Any]) -> list[Target]:
    return [
        Target("median time to a visible window", figures["median_shown_s"], TARGET_SHOWN_S,
               "at most", unit="s")
    ]  # fmt: skip


def print_figures(report: dict[str, Any]) -> None:
    shown, ready, phases = report["shown_s"], report["engine_ready_s"], report["median_phases_s"]
    print(f"window shown (s):  {' '.join(f'{x:.2f}' for x in shown)}")
    print(f"engine ready (s):  {' '.join(f'{x:.2f}' for x in ready)}")
    print(
        f"median: shown {report['median_shown_s']:.2f} s (target < {TARGET_SHOWN_S} s), "
        f"engine ready {report['median_engine_ready_s']:.2f} s; "
        f"first run (installs the model) {float(report['first_run_engine_ready_s']):.1f} s; "
        f"load average {report['load_average']}"
    )
    print(
        "median phases: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
    )
    for seconds, module in report.get("slowest_imports", []):
        print(f"  {seconds:6.3f} s  {module}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
