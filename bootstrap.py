#!/usr/bin/env python3
"""Set Hearthside up from a fresh clone, then run it or test it.

    python3 bootstrap.py [ARGS...]     set up, install the default model, start Hearthside
    python3 bootstrap.py test          set up with dev tools, run lint, types and the tests

Everything goes into .venv beside this file. llama-cpp-python is compiled for this machine
(CPU here; `--backend cuda|hip|metal|vulkan` picks a GPU build); pip caches the result, so
only the first setup is slow. Uses only the standard library, so any Python 3.11+ runs it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
MIN_PYTHON = (3, 11)
# CMake flags that select llama.cpp's GPU backend when llama-cpp-python is compiled.
BACKEND_CMAKE_ARGS = {
    "cpu": "-DGGML_NATIVE=ON",
    "cuda": "-DGGML_CUDA=ON",
    "hip": "-DGGML_HIP=ON",
    "metal": "-DGGML_METAL=ON",
    "vulkan": "-DGGML_VULKAN=ON",
}


def venv_python() -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    suffix = ".exe" if os.name == "nt" else ""
    return VENV / scripts / f"python{suffix}"


def say(text: str) -> None:
    print(f"[bootstrap] {text}", file=sys.stderr, flush=True)


def run(command: list[str | Path], **kwargs: object) -> None:
    subprocess.run([str(part) for part in command], check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def default_backend() -> str:
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "metal"
    return "cpu"


def pop_backend(args: list[str]) -> str:
    """Take `--backend NAME` out of `args` (the probe issue will choose it automatically)."""
    backend = os.environ.get("HEARTHSIDE_ENGINE_BACKEND", default_backend())
    if "--backend" in args:
        index = args.index("--backend")
        backend = args[index + 1]
        del args[index : index + 2]
    if backend not in BACKEND_CMAKE_ARGS:
        sys.exit(f"Unknown backend {backend!r}; choose one of {', '.join(BACKEND_CMAKE_ARGS)}.")
    return backend


def ensure_venv() -> None:
    if venv_python().exists():
        return
    say(f"creating a virtual environment in {VENV}")
    venv.EnvBuilder(with_pip=True).create(VENV)


def install(extras: str, backend: str) -> None:
    env = dict(os.environ, CMAKE_ARGS=os.environ.get("CMAKE_ARGS", BACKEND_CMAKE_ARGS[backend]))
    target = f".[{extras}]" if extras else "."
    say(
        f"installing Hearthside{f' [{extras}]' if extras else ''}"
        " (the first time compiles llama.cpp: 5-10 minutes)"
    )
    pip = [venv_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    run([*pip, "-e", target], env=env)


def run_app(args: list[str]) -> int:
    say("installing the default model if needed")
    run([venv_python(), "-m", "hearthside.app.cli", "models", "install-default"])
    return subprocess.call([venv_python(), "-m", "hearthside.app.cli", *args], cwd=ROOT)


def typecheck_tree() -> Path:
    """A `hearthside/` folder of links to the source folders, so mypy resolves
    `hearthside.core...` imports itself (it cannot see through the editable-install hook)."""
    tree = ROOT / "build" / "typecheck"
    package = tree / "hearthside"
    package.mkdir(parents=True, exist_ok=True)
    for folder in ("app", "core", "autotune", "kernels", "assets"):
        link = package / folder
        if not link.is_symlink():
            shutil.rmtree(link, ignore_errors=True)
            link.symlink_to(ROOT / folder, target_is_directory=True)
    return tree


def run_tests(args: list[str]) -> int:
    python = venv_python()
    mypy_env = dict(os.environ, MYPYPATH=str(typecheck_tree()))
    steps: list[tuple[str, list[str | Path], dict[str, str] | None]] = [
        ("ruff", [python, "-m", "ruff", "check", "."], None),
        (
            "mypy",
            [
                python,
                "-m",
                "mypy",
                "-p",
                "hearthside.core",
                "-p",
                "hearthside.autotune",
                "-p",
                "hearthside.app",
            ],
            mypy_env,
        ),
        ("pytest", [python, "-m", "pytest", *args], None),
    ]
    for name, command, env in steps:
        say(f"running {name}")
        code = subprocess.call([str(part) for part in command], cwd=ROOT, env=env)
        if code == 5 and name == "pytest":
            say("pytest collected no tests: that is a failure")
            return 1
        if code != 0:
            say(f"{name} failed (exit {code})")
            return code
    return 0


def main(argv: list[str]) -> int:
    if sys.version_info < MIN_PYTHON:
        sys.exit(f"Hearthside needs Python {'.'.join(map(str, MIN_PYTHON))} or newer.")
    args = list(argv)
    backend = pop_backend(args)
    testing = bool(args) and args[0] == "test"
    ensure_venv()
    install("dev" if testing else "", backend)
    if testing:
        return run_tests(args[1:])
    return run_app(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
