"""The engine build proves itself on this machine, or gives way to a safer one.

After llama.cpp is compiled (by bootstrap.py or `hearthside engine rebuild`) a child process
loads a small model, evaluates a prompt and decodes a few tokens
(core/engine/selftest.py). If the child dies from a signal, aborts, hangs or fails, the next
rung of the build ladder (core/probe/engine_build.py `build_ladder`: this CPU's instruction
sets without AMX → an AVX2 baseline → no SIMD) is compiled and tested, until one passes or
none is left. `next_ladder_step` decides, as a pure function of what was tried; the rest runs
pip and the child. The chosen build, why, and the self-test's result are kept in the data
folder (`engine-build.json`) for `hearthside engine info`, `doctor` and the Hardware page.

Nothing here imports llama_cpp, or anything outside the standard library: this process must
survive the build it is testing, and bootstrap.py runs it as a plain script before Hearthside
is installed (`python3 core/probe/engine_ladder.py install|prove --python .venv/bin/python`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

try:
    from hearthside.core.probe.engine_build import (
        PACKAGE,
        PINNED_LLAMA_CPP_VERSION,
        EngineBuild,
        build_ladder,
        quick_gpu_scan,
        read_cpu_flags,
    )
except ImportError:  # run as a plain script by bootstrap.py, before Hearthside is installed
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from engine_build import (  # type: ignore[no-redef]
        PACKAGE,
        PINNED_LLAMA_CPP_VERSION,
        EngineBuild,
        build_ladder,
        quick_gpu_scan,
        read_cpu_flags,
    )

RECORD_FILE = "engine-build.json"
RECORD_SCHEMA = 1
SELF_TEST_TIMEOUT_S = 180.0
KEPT_LOG_LINES = 40
Status = Literal["passed", "crashed", "failed", "timeout", "build_failed"]
# The build that was there before Hearthside recorded its flags (an older setup).
AS_INSTALLED = EngineBuild(
    backend="cpu",
    cmake_args=(),
    env={},
    reasons=("The engine was installed before Hearthside recorded its build flags.",),
    warnings=(),
    rung="as-installed",
    summary="the engine as it was installed",
)


@dataclass(frozen=True)
class SelfTest:
    """What the self-test child did."""

    status: Status
    signal: str | None = None  # "SIGSEGV" when the child died from a signal
    exit_code: int | None = None
    log_tail: tuple[str, ...] = ()  # the child's last stderr lines (llama.cpp's log, a stack)
    seconds: float = 0.0
    text: str = ""  # what the model wrote
    decode_tok_s: float | None = None
    system_info: str = ""  # llama_print_system_info(): the instruction sets compiled in
    library: str = ""  # identity of the llama.cpp libraries that were tested

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def in_words(self) -> str:
        if self.status == "passed":
            rate = f" at {self.decode_tok_s:.3g} tok/s" if self.decode_tok_s else ""
            return f"passed its self-test (decoded {self.text!r}{rate})"
        if self.status == "crashed":
            meaning = SIGNAL_WORDS.get(self.signal or "", "")
            return f"crashed in its self-test ({self.signal}{f', {meaning}' if meaning else ''})"
        if self.status == "timeout":
            return f"hung in its self-test (no answer in {self.seconds:.0f} s)"
        if self.status == "build_failed":
            return "failed to compile"
        last = self.log_tail[-1] if self.log_tail else f"exit code {self.exit_code}"
        return f"failed its self-test ({last})"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SelfTest:
        values = {key: data[key] for key in cls.__dataclass_fields__ if key in data}
        values["log_tail"] = tuple(values.get("log_tail", ()))
        return cls(**values)


SIGNAL_WORDS = {
    "SIGSEGV": "a segmentation fault",
    "SIGILL": "an instruction this CPU does not have",
    "SIGABRT": "llama.cpp aborted",
    "SIGBUS": "a bus error",
    "SIGFPE": "an arithmetic fault",
    "SIGKILL": "killed, often for using too much memory",
}


@dataclass(frozen=True)
class Attempt:
    build: EngineBuild
    result: SelfTest


@dataclass(frozen=True)
class LadderStep:
    action: Literal["keep", "build", "give_up"]
    build: EngineBuild | None
    message: str


def next_ladder_step(ladder: Sequence[EngineBuild], attempts: Sequence[Attempt]) -> LadderStep:
    """What to do after `attempts`: keep the build that passed, build the next rung not yet
    tried, or give up with a message that says what was tried."""
    if attempts and attempts[-1].result.passed:
        kept = attempts[-1]
        return LadderStep(
            "keep", kept.build, f"The engine ({kept.build.summary}) {kept.result.in_words()}."
        )
    tried = {_build_key(attempt.build) for attempt in attempts}
    untried = [build for build in ladder if _build_key(build) not in tried]
    if not untried:
        return LadderStep("give_up", None, _nothing_passed(attempts))
    chosen = untried[0]
    if not attempts:
        return LadderStep("build", chosen, f"Building the engine for {chosen.summary}.")
    last = attempts[-1]
    message = (
        f"The engine ({last.build.summary}) {last.result.in_words()}. "
        f"Rebuilding it for {chosen.summary}."
    )
    return LadderStep("build", chosen, message)


def _build_key(build: EngineBuild) -> tuple[str, tuple[str, ...]]:
    return build.backend, build.cmake_args


def _nothing_passed(attempts: Sequence[Attempt]) -> str:
    tried = "; ".join(f"{a.build.summary}: {a.result.in_words()}" for a in attempts)
    return (
        f"No build of the engine works on this machine (tried {tried}). Hearthside cannot run "
        "models here until this is fixed: please report it, with the log lines above."
    )


# --- running the self-test ---------------------------------------------------------------------


def run_self_test(
    python: str,
    model: Path,
    *,
    timeout_s: float = SELF_TEST_TIMEOUT_S,
    threads: int | None = None,
    gpu_layers: int = -1,
) -> SelfTest:
    """The self-test in a child process of `python` (the environment holding the build).
    Every layer is offloaded by default: a GPU build proves its kernels on the GPU (a CUDA
    build without code for this GPU fails only there), a CPU build ignores the request."""
    command = [python, "-m", "hearthside.core.engine.selftest", "--model", str(model)]
    command += ["--gpu-layers", str(gpu_layers)]
    if threads:
        command += ["--threads", str(threads)]
    started = time.perf_counter()
    try:
        completed = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        tail = _tail(exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else "")
        return SelfTest("timeout", log_tail=tail, seconds=time.perf_counter() - started)
    seconds = time.perf_counter() - started
    result = self_test_outcome(completed.returncode, completed.stdout, completed.stderr, seconds)
    return replace(result, library=library_identity(python)) if result.passed else result


def self_test_outcome(returncode: int, stdout: str, stderr: str, seconds: float) -> SelfTest:
    """The child's exit status and output → a `SelfTest` (pure; recorded outcomes in tests)."""
    tail = _tail(stderr)
    if returncode < 0:
        return SelfTest("crashed", _signal_name(-returncode), returncode, tail, seconds)
    if returncode == 128 + signal.SIGABRT or any("GGML_ASSERT" in line for line in tail):
        return SelfTest("crashed", "SIGABRT", returncode, tail, seconds)
    report = _last_json_line(stdout)
    if returncode != 0 or report.get("status") != "passed":
        return SelfTest("failed", None, returncode, tail, seconds)
    return SelfTest(
        "passed",
        exit_code=0,
        log_tail=tail,
        seconds=seconds,
        text=str(report.get("text", "")),
        decode_tok_s=report.get("decode_tok_s"),
        system_info=str(report.get("system_info", "")),
    )


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _tail(text: str) -> tuple[str, ...]:
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return tuple(lines[-KEPT_LOG_LINES:])


def _last_json_line(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return {}


LLAMA_CPP_DIR_SCRIPT = (
    "import importlib.util as u; s = u.find_spec('llama_cpp'); "
    "print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')"
)


def library_identity(python: str = sys.executable) -> str:
    """Names, sizes and modification times of the llama.cpp libraries installed for `python`:
    another build (a rebuild, a reinstall) has another identity. "" when there is none."""
    folder = llama_cpp_dir(python)
    if folder is None:
        return ""
    libraries = sorted(
        path
        for path in folder.rglob("*")
        if path.is_file() and (path.suffix in (".so", ".dylib", ".dll") or ".so." in path.name)
    )
    return "|".join(
        f"{path.relative_to(folder)}:{path.stat().st_size}:{path.stat().st_mtime_ns}"
        for path in libraries
    )


def llama_cpp_dir(python: str = sys.executable) -> Path | None:
    """The llama_cpp package folder of `python`'s environment, found without importing it."""
    if python == sys.executable:
        from importlib.util import find_spec

        spec = find_spec("llama_cpp")
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    try:
        found = subprocess.run(
            [python, "-c", LLAMA_CPP_DIR_SCRIPT],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(found) if found else None


# --- installing a build --------------------------------------------------------------------------


Runner = Callable[[Sequence[str], dict[str, str]], int]


def run_streaming(command: Sequence[str], env: dict[str, str]) -> int:
    """Runs with its output going straight to this terminal (a build takes minutes)."""
    return subprocess.call(list(command), env={**os.environ, **env})


def install_build(
    build: EngineBuild,
    python: str,
    *,
    version: str = PINNED_LLAMA_CPP_VERSION,
    wheel_cache: Path | None = None,
    run: Runner = run_streaming,
    say: Callable[[str], None] | None = None,
) -> bool:
    """Compile llama-cpp-python with `build`'s flags and install it into `python`'s
    environment. CPU wheels are kept per set of flags, so a second setup (or CI) installs in
    seconds; pip's own cache cannot be used, since it ignores CMAKE_ARGS."""
    cache = wheel_folder(build, version, wheel_cache)
    wheel = _cached_wheel(cache) if build.backend == "cpu" else None
    if wheel is None:
        (say or _say)(
            f"Compiling llama.cpp for {build.summary} (5-10 minutes on a small machine) …"
        )
        wheel = _compile_wheel(build, python, version, cache, run)
        if wheel is None:
            return False
    install = [python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", str(wheel)]
    return run(install, {}) == 0


def _compile_wheel(
    build: EngineBuild, python: str, version: str, cache: Path, run: Runner
) -> Path | None:
    with tempfile.TemporaryDirectory(prefix="hearthside-engine-") as scratch:
        command = [
            python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir",
            f"--no-binary={PACKAGE}", f"{PACKAGE}=={version}", "-w", scratch,
        ]  # fmt: skip
        env = {"CMAKE_ARGS": build.env.get("CMAKE_ARGS", "")}
        if run(command, env) != 0:
            return None
        built = sorted(Path(scratch).glob("*.whl"))
        if not built:
            return None
        cache.mkdir(parents=True, exist_ok=True)
        target = cache / built[0].name
        shutil.move(str(built[0]), target)
        return target


def _cached_wheel(cache: Path) -> Path | None:
    # llama-cpp-python's wheels are py3-none-<platform> (ctypes): one serves every Python
    matches = sorted(cache.glob("*.whl"))
    return matches[-1] if matches else None


def wheel_folder(build: EngineBuild, version: str, wheel_cache: Path | None = None) -> Path:
    """Where the wheel of `build` at `version` is kept (benchmarks/cuda_build.py puts the
    CUDA wheels it compiles here too)."""
    return (wheel_cache or engine_wheel_cache()) / _wheel_key(build, version)


def _wheel_key(build: EngineBuild, version: str) -> str:
    import hashlib

    text = json.dumps([version, build.backend, list(build.cmake_args), platform.machine()])
    return (
        f"{version}-{build.rung or build.backend}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    )


def engine_wheel_cache() -> Path:
    """Where compiled engine wheels are kept: the user's cache folder."""
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local"))
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "hearthside" / "engine-wheels"


# --- the loop ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineRecord:
    """What `engine-build.json` holds: the build in use, why, and how it proved itself."""

    build: EngineBuild
    self_test: SelfTest
    message: str
    attempts: tuple[Attempt, ...] = ()
    llama_cpp_version: str = ""
    recorded_at: str = field(
        default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds")
    )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": RECORD_SCHEMA,
            "build": self.build.to_dict(),
            "self_test": asdict(self.self_test),
            "message": self.message,
            "attempts": [
                {"build": a.build.to_dict(), "result": asdict(a.result)} for a in self.attempts
            ],
            "llama_cpp_version": self.llama_cpp_version,
            "recorded_at": self.recorded_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineRecord:
        attempts = tuple(
            Attempt(EngineBuild.from_dict(a["build"]), SelfTest.from_dict(a["result"]))
            for a in data.get("attempts", ())
        )
        return cls(
            build=EngineBuild.from_dict(data["build"]),
            self_test=SelfTest.from_dict(data["self_test"]),
            message=str(data.get("message", "")),
            attempts=attempts,
            llama_cpp_version=str(data.get("llama_cpp_version", "")),
            recorded_at=str(data.get("recorded_at", "")),
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class EngineUnusableError(RuntimeError):
    """No rung of the ladder passed its self-test."""


def prove_engine(
    ladder: Sequence[EngineBuild],
    *,
    install: Callable[[EngineBuild], bool],
    self_test: Callable[[], SelfTest],
    say: Callable[[str], None],
    installed: EngineBuild | None = None,
) -> EngineRecord:
    """Self-test `installed` (when given), then build and test rungs until one passes."""
    attempts: list[Attempt] = []
    if installed is not None:
        say(f"Testing the engine ({installed.summary}) on this machine …")
        attempts.append(Attempt(installed, self_test()))
    while True:
        step = next_ladder_step(ladder, attempts)
        say(step.message)
        if step.action == "keep":
            assert step.build is not None
            return EngineRecord(step.build, attempts[-1].result, step.message, tuple(attempts))
        if step.action == "give_up":
            raise EngineUnusableError(step.message)
        assert step.build is not None
        if not install(step.build):
            attempts.append(Attempt(step.build, SelfTest("build_failed")))
            continue
        say(f"Testing the engine ({step.build.summary}) on this machine …")
        attempts.append(Attempt(step.build, self_test()))


def record_path(data_folder: Path) -> Path:
    return data_folder / RECORD_FILE


def write_record(data_folder: Path, record: EngineRecord) -> Path:
    path = record_path(data_folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".json.part")
    temporary.write_text(json.dumps(record.to_dict(), indent=2))
    os.replace(temporary, path)
    return path


def read_record(data_folder: Path) -> EngineRecord | None:
    """The stored record, or None when there is none or it cannot be read."""
    try:
        data = json.loads(record_path(data_folder).read_text())
        return EngineRecord.from_dict(data) if data.get("schema") == RECORD_SCHEMA else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def proven_for_installed_engine(record: EngineRecord | None, python: str = sys.executable) -> bool:
    """True when `record` passed for the very libraries installed now."""
    if record is None or not record.self_test.passed:
        return False
    current = library_identity(python)
    return bool(current) and record.self_test.library == current


def record_rows(record: EngineRecord | None, current: bool) -> list[tuple[str, str]]:
    """(label, text) pairs saying how the installed build was chosen and proved itself, for
    `hearthside engine info`, `doctor` and the Hardware page; `current`: the record's
    self-test ran on the libraries installed now."""
    if record is None:
        return [("Build", "not recorded yet: run `hearthside engine selftest`")]
    build, test = record.build, record.self_test
    rows = [("Build", f"{build.summary} ({build.rung})")]
    if build.cmake_args:
        rows.append(("Flags", " ".join(build.cmake_args)))
    rows += [("Why", reason) for reason in build.reasons]
    when = record.recorded_at[:16].replace("T", " ")
    rows.append(("Self-test", f"{test.in_words()}, {when}"))
    if not current:
        rows.append(("Self-test", "the engine changed since: run `hearthside engine selftest`"))
    rows += [("Earlier", f"{a.build.summary}: {a.result.in_words()}") for a in record.attempts[:-1]]
    return rows


# --- bootstrap's entry point ---------------------------------------------------------------------


def ensure_proven_engine(
    *,
    data_folder: Path,
    model: Path,
    python: str = sys.executable,
    backend: str = "auto",
    just_built: bool = False,
    say: Callable[[str], None] = print,
) -> EngineRecord:
    """Keep a record that passed for the installed libraries; otherwise self-test what is
    installed (`just_built`: the ladder's first rung) and climb the ladder until a build
    passes. Writes the record."""
    if not model.is_file():  # not the build's fault: rebuilding would not help
        raise EngineUnusableError(f"The self-test model {model} is missing.")
    existing = read_record(data_folder)
    if not just_built and proven_for_installed_engine(existing, python):
        assert existing is not None
        return existing
    ladder = machine_ladder(backend)
    installed = ladder[0] if just_built else existing.build if existing else AS_INSTALLED
    record = prove_engine(
        ladder,
        install=lambda build: install_build(build, python),
        self_test=lambda: run_self_test(python, model),
        say=say,
        installed=installed if llama_cpp_dir(python) else None,
    )
    record = replace(record, llama_cpp_version=installed_version(python))
    write_record(data_folder, record)
    return record


def machine_ladder(backend: str = "auto") -> tuple[EngineBuild, ...]:
    return build_ladder(
        quick_gpu_scan(),
        platform=sys.platform,
        machine=platform.machine(),
        backend=backend,
        cpu_flags=read_cpu_flags(),
    )


def installed_version(python: str) -> str:
    script = f"from importlib.metadata import version; print(version({PACKAGE!r}))"
    try:
        found = subprocess.run(
            [python, "-c", script], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


def _say(text: str) -> None:
    print(f"[engine] {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Install and prove the engine build.")
    commands = parser.add_subparsers(dest="command", required=True)
    first = commands.add_parser("install", help="compile and install the ladder's first build")
    prove = commands.add_parser("prove", help="self-test the engine; rebuild until one passes")
    for command in (first, prove):
        command.add_argument("--python", required=True, help="the environment's interpreter")
        command.add_argument("--backend", default="auto")
    prove.add_argument("--model", required=True, type=Path)
    prove.add_argument("--data-folder", required=True, type=Path)
    prove.add_argument("--just-built", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "install":
        build = machine_ladder(args.backend)[0]
        for reason in (*build.reasons, *(f"warning: {w}" for w in build.warnings)):
            _say(reason)
        return 0 if install_build(build, args.python) else 1
    try:
        ensure_proven_engine(
            data_folder=args.data_folder,
            model=args.model,
            python=args.python,
            backend=args.backend,
            just_built=args.just_built,
            say=_say,
        )
    except EngineUnusableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
