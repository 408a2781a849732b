#!/usr/bin/env python3
"""Set Hearthside up from a fresh clone, then run it or test it.

    python3 bootstrap.py [ARGS...]     set up, install the default model, start Hearthside
    python3 bootstrap.py test          set up with dev tools, run lint, types and the tests
    python3 bootstrap.py --help        this text, setting nothing up (Hearthside's own
                                       commands, once set up: .venv/bin/hearthside --help)

Everything goes into .venv beside this file. llama-cpp-python is compiled for this machine's
GPU (CUDA for the NVIDIA architectures found, HIP for AMD gfx targets, Metal on Apple
Silicon, else the CPU with its own instruction sets but without AMX; `--backend
cpu|cuda|hip|metal|vulkan` overrides); CPU builds are kept per set of flags in the user's cache
folder, so later setups install them in seconds. The build then proves itself: a child process
loads the default model and decodes a few tokens, and a build that crashes is rebuilt with
safer flags (core/probe/engine_ladder.py). Uses only the standard library, so any Python 3.11+
runs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
MIN_PYTHON = (3, 11)
BACKENDS = ("auto", "cpu", "cuda", "hip", "metal", "vulkan")
# Standard library only, like this file: it chooses the build, compiles it, and self-tests it.
ENGINE_LADDER = ROOT / "core" / "probe" / "engine_ladder.py"
# The `beside` lane's priority: the lowest, so that it makes way for the other lane's engine
# threads at once (they decode at 0.98-1.0x quiet beside it) and Hearthside does not count it
# as busy (core/probe/cpu_use.py's MAKES_WAY_NICENESS); it gets the cores they leave idle.
BESIDE_NICENESS = 19


def venv_python() -> Path:
    scripts = "Scripts" if os.name == "nt" else "bin"
    suffix = ".exe" if os.name == "nt" else ""
    return VENV / scripts / f"python{suffix}"


def say(text: str) -> None:
    print(f"[bootstrap] {text}", file=sys.stderr, flush=True)


def run(command: list[str | Path], **kwargs: object) -> None:
    subprocess.run([str(part) for part in command], check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def pop_backend(args: list[str]) -> str:
    """Take `--backend NAME` out of `args`; "auto" lets the hardware decide."""
    backend = os.environ.get("HEARTHSIDE_ENGINE_BACKEND", "auto")
    if "--backend" in args:
        index = args.index("--backend")
        backend = args[index + 1] if index + 1 < len(args) else ""
        del args[index : index + 2]
    if backend not in BACKENDS:
        sys.exit(f"Unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}.")
    return backend


def engine_installed() -> bool:
    check = [venv_python(), "-c", "import llama_cpp"]
    return subprocess.call([str(part) for part in check], stderr=subprocess.DEVNULL) == 0


def ensure_venv() -> None:
    if venv_python().exists():
        return
    say(f"creating a virtual environment in {VENV}")
    venv.EnvBuilder(with_pip=True).create(VENV)


# Qt's runtime libraries for the window, Xvfb for screenshots and the launcher's validator.
APP_DEBIAN_PACKAGES = (
    "libegl1",
    "libgl1",
    "libxkbcommon0",
    "libxkbcommon-x11-0",
    "libfontconfig1",
    "libdbus-1-3",
    "libxcb-cursor0",
    "libxcb-icccm4",
    "libxcb-keysyms1",
)
TEST_DEBIAN_PACKAGES = ("xvfb", "xauth", "desktop-file-utils", "appstream")


def install_debian_packages(names: tuple[str, ...]) -> None:
    """apt-get what is missing, on Debian-like systems where we may (root); elsewhere say what."""
    if not sys.platform.startswith("linux") or shutil.which("dpkg") is None:
        return
    missing = [
        name
        for name in names
        if subprocess.call(
            ["dpkg", "-s", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        != 0
    ]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        say(f"please install these system packages: {' '.join(missing)}")
        return
    say(f"installing system packages: {' '.join(missing)}")
    apt = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    quiet = {
        "stdout": subprocess.DEVNULL,
        "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    }
    if subprocess.call(apt, **quiet) != 0:  # type: ignore[call-overload]
        run(["apt-get", "update", "-q"], **quiet)
        run(apt, **quiet)


def install(extras: str, backend: str) -> None:
    pip = [venv_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    just_built = not engine_installed()
    if just_built:
        say("compiling llama.cpp for this machine (the first time takes 5-10 minutes)")
        ladder = [sys.executable, ENGINE_LADDER, "install", "--python", venv_python()]
        run([*ladder, "--backend", backend])
    elif backend != "auto":
        say(
            "the engine is already built; "
            f"`hearthside engine rebuild --backend {backend}` changes it"
        )
    target = f".[{extras}]" if extras else "."
    say(f"installing Hearthside{f' [{extras}]' if extras else ''}")
    run([*pip, "-e", target])
    prove_engine(backend, just_built=just_built)


def venv_output(code: str) -> str:
    """What a line of Python prints in the new environment (Hearthside installed there)."""
    completed = subprocess.run(
        [str(venv_python()), "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    return completed.stdout.strip()


def prove_engine(backend: str, *, just_built: bool) -> None:
    """Load the default model in a child process and decode a few tokens; if the build crashes,
    rebuild it with the next safer flags (core/probe/engine_ladder.py). A build that passed
    for these very libraries before is not tested again."""
    say("checking the engine build on this machine")
    model = venv_output(
        "from hearthside.core.models.default_model import cached_default_model_file as f; "
        "print(f())"
    )
    data = venv_output("from hearthside.core.paths import data_dir; print(data_dir())")
    command = [
        sys.executable, ENGINE_LADDER, "prove", "--python", venv_python(), "--backend", backend,
        "--model", model, "--data-folder", data, *(["--just-built"] if just_built else []),
    ]  # fmt: skip
    if subprocess.call([str(part) for part in command], cwd=ROOT) != 0:
        sys.exit("Hearthside cannot run models on this machine (see the messages above).")


def run_app(args: list[str]) -> int:
    say("installing the default model if needed")
    # its report goes to stderr with ours: stdout is the app's (`chat --prompt` prints the answer)
    run([venv_python(), "-m", "hearthside.app.cli", "models", "install-default"], stdout=sys.stderr)
    offer_launcher()
    return subprocess.call([venv_python(), "-m", "hearthside.app.cli", *args], cwd=ROOT)


LAUNCHER_CHECK = (
    "from hearthside.app.launcher import manifest_path; from hearthside.core.paths import "
    "data_dir; print(manifest_path(data_dir()).exists())"
)


def offer_launcher() -> None:
    """One line, until a launcher is installed: how to get a double-click icon."""
    check = subprocess.run(
        [str(venv_python()), "-c", LAUNCHER_CHECK], capture_output=True, text=True, check=False
    )
    if check.stdout.strip() == "False":
        hearthside = venv_python().with_name("hearthside" + venv_python().suffix)
        say(f"to start Hearthside with a double-click: {hearthside} install-launcher")


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
                "-p",
                "hearthside.kernels",
            ],
            mypy_env,
        ),
    ]
    for name, command, env in steps:
        say(f"running {name}")
        code = subprocess.call([str(part) for part in command], cwd=ROOT, env=env)
        if code != 0:
            say(f"{name} failed (exit {code})")
            return code
    say("running pytest")
    code = run_pytest(python, args)
    if code == 5:
        say("pytest collected no tests: that is a failure")
        return 1
    if code != 0:
        say(f"pytest failed (exit {code})")
    return code


def run_pytest(python: Path, args: list[str]) -> int:
    """The tests in two lanes at once: those marked `beside` (they time nothing and count no
    CPU or threads) in a second pytest at a lower priority, the rest at the normal one. A
    niced program makes way for the measuring tests' threads at once and Hearthside does not
    count it as busy (core/probe/cpu_use.py), so the second lane takes the CPU time the first
    leaves idle: the suite alone used 1.2 of 2 cores. With a marker filter of the caller's
    (`-m`), one pytest runs it."""
    command = [str(python), "-m", "pytest"]
    if "-m" in args:
        return subprocess.call([*command, *args], cwd=ROOT)
    log_path = ROOT / "build" / "pytest-beside.log"
    log_path.parent.mkdir(exist_ok=True)
    with log_path.open("w") as log:
        beside = subprocess.Popen(
            [*command, "-m", "beside", "-p", "no:cacheprovider", *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_lowered_priority if hasattr(os, "nice") else None,
        )
        try:
            alone = subprocess.call([*command, "-m", "not beside", *args], cwd=ROOT)
        except BaseException:  # Ctrl-C: the other lane stops too
            beside.terminate()
            beside.wait()
            raise
        beside_code = beside.wait()
    say(f"the tests that ran beside the others, at a lower priority ({log_path}):")
    sys.stdout.write(log_path.read_text())
    sys.stdout.flush()
    return lanes_code(alone, beside_code)


def _lowered_priority() -> None:
    os.nice(BESIDE_NICENESS)


def lanes_code(alone: int, beside: int) -> int:
    """One exit status for both lanes: either one's failure; a lane without tests (pytest's
    5) is fine when the other ran some, and 5 when neither did."""
    if alone == beside == 5:
        return 5
    failed = [code for code in (alone, beside) if code not in (0, 5)]
    return failed[0] if failed else 0


def main(argv: list[str]) -> int:
    if sys.version_info < MIN_PYTHON:
        sys.exit(f"Hearthside needs Python {'.'.join(map(str, MIN_PYTHON))} or newer.")
    args = list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)  # before anything is installed: a fresh setup takes minutes
        return 0
    backend = pop_backend(args)
    testing = bool(args) and args[0] == "test"
    install_debian_packages(APP_DEBIAN_PACKAGES + (TEST_DEBIAN_PACKAGES if testing else ()))
    ensure_venv()
    install("dev" if testing else "", backend)
    if testing:
        return run_tests(args[1:])
    return run_app(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
