"""`python -m hearthside.core.probe`: prints the HardwareProfile as JSON (the child process
the GUI and the server probe in)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hearthside.core.probe.base import ProbeContext
from hearthside.core.probe.runner import probe_hardware


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hearthside.core.probe")
    parser.add_argument("--models-dir", type=Path, help="the folder whose disk to describe")
    args = parser.parse_args(argv)
    profile = probe_hardware(ProbeContext(models_dir=args.models_dir))
    sys.stdout.write(profile.to_json() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
