"""Compile llama-cpp-python's CUDA build on a machine without a GPU, with exactly the flags the
engine ladder chooses for a recorded GPU, and check that the library holds code for it.

    chrt -i 0 nice -n 19 .venv/bin/python benchmarks/cuda_build.py --gpu h200 >h200.log 2>&1
    chrt -i 0 nice -n 19 .venv/bin/python benchmarks/cuda_build.py --gpu v100 >v100.log 2>&1

Never in CI: on 2 cores the compile takes an hour or more. Steps:
1. The GPU: a recorded probe fixture (`tests/fixtures/probe/gpu/NAME/golden.json`, `--gpu`)
   or an architecture (`--arch sm_90`). Its flags come from `build_ladder`, as setup would
   choose them on that machine (`CMAKE_ARGS`, unchanged).
2. The toolkit, as the ladder's `cuda_toolkit_range` allows: CUDA 13.0 from PyPI
   (`cuda-toolkit[nvcc,cudart,cublas,…]`, the release the device machine's image ships) where
   13 builds for every architecture; else CUDA 12.x, which PyPI has no compiler for (its
   `nvidia-cuda-nvcc-cu12` wheels carry only ptxas), so Debian's `nvidia-cuda-toolkit` 12.4
   packages (apt-get download, unpacked under the cache, nothing installed system-wide), or
   `--cuda-home DIR`. Either is kept under ~/.cache/hearthside/cuda-toolkits/. There is no
   GPU driver here: the link takes a `libcuda.so` stub made from the toolkit's `cuda.h`.
3. llama-cpp-python's sdist (the version installed in .venv; pip's cache), unpacked once, is
   built into a wheel with a build folder kept per flags (~/.cache/hearthside/cuda-build/), so
   a stopped build resumes where it stopped.
4. `cuobjdump --list-elf` on `libggml-cuda.so`: an ELF for every architecture asked for.
5. The wheel goes into the engine-wheel cache folder the ladder uses for these flags
   (`engine_ladder.wheel_folder`), with `cuda-build.json` beside it (toolkit, times, the
   cuobjdump lines), so `benchmarks/device_check.sh` can install it instead of compiling.

Prints the build's wall and CPU time (CPU time is steadier on a shared machine) and a PASS/MISS
table: the wheel was built, and libggml-cuda.so holds an ELF for each architecture.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _targets import Target, report

from hearthside.core.probe.engine_build import (
    PACKAGE,
    EngineBuild,
    GpuTarget,
    build_ladder,
    cuda_architectures,
    cuda_toolkit_range,
)
from hearthside.core.probe.engine_ladder import engine_wheel_cache, wheel_folder

REPO = Path(__file__).resolve().parents[1]
GPU_FIXTURES = REPO / "tests" / "fixtures" / "probe" / "gpu"
CACHE = engine_wheel_cache().parent  # ~/.cache/hearthside
TOOLKITS = CACHE / "cuda-toolkits"
BUILDS = CACHE / "cuda-build"
REPORT_NAME = "cuda-build.json"
# The CUDA 13 line the device machine's image ships (nvcc 13.0, driver 580): a wheel built
# with it finds its libcudart.so.13 and libcublas.so.13 there.
PYPI_CUDA = "13.0"
PYPI_TOOLKIT = (f"cuda-toolkit[nvcc,crt,nvvm,cudart,cublas,cccl,culibos]=={PYPI_CUDA}.*",)
# cuobjdump reads any architecture's ELF; PyPI's first release of it is 13.2.
PYPI_CUOBJDUMP = "nvidia-cuda-cuobjdump==13.2.*"
DEBIAN_CUDA = "12.4"
DEBIAN_SOURCES = (
    "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
    "http://deb.debian.org/debian trixie main contrib non-free\n"
)
# nvcc's profile for the unpacked tree: Debian's names /usr paths; nvcc sets _HERE_ to its
# own folder, usr/lib/nvidia-cuda-toolkit/bin, where its g++ wrapper picks a supported g++.
DEBIAN_NVCC_PROFILE = """\
TOP = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH += $(_HERE_):
INCLUDES += "-I$(TOP)/include" $(_SPACE_)
LIBRARIES =+ $(_SPACE_) "-L$(TOP)/lib64/stubs" "-L$(TOP)/lib64"
"""
# What nvcc, its headers and the libraries ggml-cuda links need (Debian's package names).
DEBIAN_PACKAGES = (
    "nvidia-cuda-toolkit",
    "nvidia-cuda-dev",
    "libcudart12",
    "libcublas12",
    "libcublaslt12",
    "libnvvm4",
    "libthrust-dev",
    "libcub-dev",
    "libcu++-dev",
)


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit laid out as CMake's FindCUDAToolkit expects (bin/nvcc, include, lib)."""

    source: str  # "pypi" | "debian" | "local"
    version: str  # nvcc's "release 13.0, V13.0.88"
    root: Path
    nvcc: Path
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildTools:
    """A venv with what the compile needs besides the toolkit: scikit-build-core, CMake,
    ninja (PyPI's, new enough to know CUDA 13) and cuobjdump."""

    python: Path
    bin: Path
    cuobjdump: Path


@dataclass
class BuildReport:
    gpu: str
    archs: list[str]
    cmake_args: str
    llama_cpp_version: str
    toolkit_source: str = ""
    toolkit_version: str = ""
    jobs: int = 0
    wall_s: float | None = None
    cpu_s: float | None = None
    load_average: list[float] = field(default_factory=list)
    wheel: str = ""
    wheel_bytes: int | None = None
    library_bytes: int | None = None
    cuobjdump: list[str] = field(default_factory=list)
    archs_found: list[str] = field(default_factory=list)
    host_cpu_flags: list[str] = field(default_factory=list)
    error: str = ""


# --- the GPU and its flags ---------------------------------------------------------------------


def gpus_of_fixture(name: str) -> list[GpuTarget]:
    """The GPUs of a recorded probe fixture, as `hearthside engine rebuild` passes them on."""
    from hearthside.app.engine_cli import gpu_target
    from hearthside.core.probe.profile import HardwareProfile

    path = GPU_FIXTURES / name / "golden.json"
    if not path.is_file():
        known = ", ".join(sorted(p.parent.name for p in GPU_FIXTURES.glob("*/golden.json")))
        raise SystemExit(f"No GPU fixture {name!r}. Recorded ones: {known}")
    profile = HardwareProfile.from_json(path.read_text())
    return [gpu_target(gpu) for gpu in profile.gpus if gpu.vendor == "nvidia"]


def gpus_of_arch(arch: str) -> list[GpuTarget]:
    return [GpuTarget("nvidia", arch, f"an NVIDIA GPU ({arch})")]


def ladder_build(gpus: Sequence[GpuTarget]) -> EngineBuild:
    """The first rung of the ladder on a Linux x86-64 machine with these GPUs."""
    build = build_ladder(gpus, platform="linux", machine="x86_64")[0]
    if build.backend != "cuda":
        raise SystemExit(f"The ladder chose {build.summary}, not CUDA, for these GPUs.")
    return build


def archs_of(build: EngineBuild) -> list[str]:
    """CMAKE_CUDA_ARCHITECTURES from the flags: ["90"]."""
    for arg in build.cmake_args:
        if arg.startswith("-DCMAKE_CUDA_ARCHITECTURES="):
            return arg.split("=", 1)[1].split(";")
    return []


# --- the toolkit ---------------------------------------------------------------------------------


def toolkit_for(archs: Sequence[str], cuda_home: Path | None) -> Toolkit:
    """The toolkit the ladder's range allows: `cuda_home` if given, else PyPI's CUDA 13 or,
    where CUDA 13 dropped an architecture, Debian's CUDA 12.4."""
    if cuda_home is not None:
        return local_toolkit(cuda_home)
    allowed = cuda_toolkit_range(archs)
    if allowed.needs_cuda_12:
        if allowed.first > DEBIAN_CUDA:
            raise SystemExit(
                f"These GPUs need CUDA {allowed.first}–{allowed.last}; Debian has "
                f"{DEBIAN_CUDA}. Pass --cuda-home with such a toolkit."
            )
        return debian_toolkit()
    return pypi_toolkit()


def build_tools() -> BuildTools:
    venv = TOOLKITS / "build-tools"
    python = venv / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(python), "-m", "pip", "install", "-q"]
        run([*pip, "scikit-build-core", "cmake", "ninja"])
        run([*pip, "--no-deps", PYPI_CUOBJDUMP])
    found = sorted(venv.glob("lib/python3*/site-packages/nvidia/cu13/bin/cuobjdump"))
    if not found:
        raise SystemExit(f"{PYPI_CUOBJDUMP} installed no cuobjdump into {venv}.")
    return BuildTools(python, venv / "bin", found[0])


def pypi_toolkit() -> Toolkit:
    venv = TOOLKITS / f"pypi-{PYPI_CUDA}"
    if not (venv / "bin" / "python").exists():
        run([sys.executable, "-m", "venv", str(venv)])
    root = _pypi_root(venv)
    if root is None or not (root / "bin" / "nvcc").exists():
        run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *PYPI_TOOLKIT])
        root = _pypi_root(venv)
    if root is None:
        raise SystemExit(f"The CUDA {PYPI_CUDA} wheels installed no nvidia/cu13 folder.")
    lib = root / "lib"
    _link(root / "lib64", "lib")  # where nvcc.profile looks (the wheels unpack into lib/)
    for name in ("cudart", "cublas", "cublasLt"):
        _link(lib / f"lib{name}.so", f"lib{name}.so.13")
    make_libcuda_stub(root / "include" / "cuda.h", lib / "stubs" / "libcuda.so")
    return _toolkit("pypi", root)


def _pypi_root(venv: Path) -> Path | None:
    found = sorted(venv.glob("lib/python3*/site-packages/nvidia/cu13"))
    return found[0] if found else None


def debian_toolkit() -> Toolkit:
    """Debian's CUDA 12.4 packages, downloaded with a private apt state and unpacked into the
    cache (dpkg -x): nothing is installed into the system."""
    base = TOOLKITS / f"debian-{DEBIAN_CUDA}"
    root = base / "root"
    if not (root / "usr" / "bin" / "nvcc").exists():
        debs = download_debian_packages(base)
        for deb in debs:
            run(["dpkg-deb", "-x", str(deb), str(root)])
    cuda = root / "usr" / "lib" / "nvidia-cuda-toolkit"
    _debian_layout(root, cuda)
    return _toolkit("debian", cuda)


def download_debian_packages(base: Path) -> list[Path]:
    state = base / "apt"
    for folder in ("lists/partial", "archives/partial"):
        (state / folder).mkdir(parents=True, exist_ok=True)
    (state / "sources.list").write_text(DEBIAN_SOURCES)
    options = [
        f"-oDir::Etc::SourceList={state / 'sources.list'}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::Cache={state}",
        "-oAPT::Architecture=amd64",
    ]
    run(["apt-get", *options, "update", "-q"])
    debs = base / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    run(["apt-get", *options, "download", *DEBIAN_PACKAGES], cwd=debs)
    return sorted(debs.glob("*.deb"))


def _debian_layout(root: Path, cuda: Path) -> None:
    """Debian spreads the toolkit over /usr/bin, /usr/include and the multiarch lib folder;
    FindCUDAToolkit wants one root, so the pieces are linked under the toolkit's own folder."""
    multiarch = root / "usr" / "lib" / "x86_64-linux-gnu"
    _link(cuda / "include", root / "usr" / "include")
    # CMake takes the toolkit's library root from nvcc's NVVMIR_LIBRARY_DIR ending in
    # nvvm/libdevice; Debian's is usr/lib/nvidia-cuda-toolkit/libdevice
    _link(cuda / "nvvm" / "libdevice", cuda / "libdevice")
    for tool in (root / "usr" / "bin").iterdir():  # ptxas, fatbinary, nvlink, cudafe++, …
        _link(cuda / "bin" / tool.name, tool)
    profile = cuda / "bin" / "nvcc.profile"  # Debian's is a link to /etc/nvcc.profile
    if profile.is_symlink() or profile.read_text() != DEBIAN_NVCC_PROFILE:
        profile.unlink()
        profile.write_text(DEBIAN_NVCC_PROFILE)
    (cuda / "lib64").mkdir(parents=True, exist_ok=True)
    for library in multiarch.glob("lib*"):  # shared and static (cudart_static, cudadevrt)
        if library.is_file():
            _link(cuda / "lib64" / library.name, library)
    for name in ("cudart", "cublas", "cublasLt"):
        versions = sorted(multiarch.glob(f"lib{name}.so.12*"))
        if versions:
            _link(cuda / "lib64" / f"lib{name}.so", versions[0])
    make_libcuda_stub(root / "usr" / "include" / "cuda.h", cuda / "lib64" / "stubs" / "libcuda.so")


def local_toolkit(cuda_home: Path) -> Toolkit:
    stub = cuda_home / "lib64" / "stubs" / "libcuda.so"
    if not stub.exists():
        make_libcuda_stub(cuda_home / "include" / "cuda.h", stub)
    return _toolkit("local", cuda_home)


def _toolkit(source: str, root: Path) -> Toolkit:
    nvcc = root / "bin" / "nvcc"
    if not nvcc.exists():
        raise SystemExit(f"No nvcc in {root / 'bin'}.")
    env = {"CUDACXX": str(nvcc), "CUDAToolkit_ROOT": str(root)}
    return Toolkit(source, nvcc_version(nvcc), root, nvcc, env)


def nvcc_version(nvcc: Path) -> str:
    text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    found = re.search(r"release [\d.]+, V[\d.]+", text)
    return found.group(0) if found else text.strip().splitlines()[-1:][0] if text else ""


def make_libcuda_stub(cuda_h: Path, target: Path) -> None:
    """A `libcuda.so` (soname libcuda.so.1) that defines every driver function `cuda.h`
    declares. It exists only for the linker, as the toolkit's own stub does: at run time the
    driver's libcuda.so.1 is loaded in its place."""
    if target.exists():
        return
    preprocessed = subprocess.run(
        ["gcc", "-E", "-P", "-x", "c", str(cuda_h)], capture_output=True, text=True, check=True
    ).stdout
    names = sorted(set(re.findall(r"\bCUresult\s+(cu\w+)\s*\(", preprocessed)))
    if not names:
        raise SystemExit(f"Found no driver functions in {cuda_h}.")
    target.parent.mkdir(parents=True, exist_ok=True)
    source = target.with_suffix(".c")
    source.write_text("".join(f"int {name}(void) {{ return 100; }}\n" for name in names))
    run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(target), str(source)])


def _link(link: Path, to: Path | str) -> None:
    if link.is_symlink() or link.exists():
        return
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(to)


# --- the build -----------------------------------------------------------------------------------


def llama_cpp_version() -> str:
    from importlib.metadata import version

    return version(PACKAGE)


def unpacked_sdist(version: str) -> Path:
    """llama-cpp-python's sdist (through pip's cache), unpacked once per version."""
    source = BUILDS / f"src-{version}"
    if (source / "pyproject.toml").exists():
        return source
    with tempfile.TemporaryDirectory(prefix="hearthside-sdist-") as scratch:
        run([
            sys.executable, "-m", "pip", "download", "-q", "--no-deps",
            "--no-binary", ":all:", f"{PACKAGE}=={version}", "-d", scratch,
        ])  # fmt: skip
        archive = next(Path(scratch).glob("*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(scratch, filter="data")
        unpacked = next(p for p in Path(scratch).iterdir() if p.is_dir())
        source.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(unpacked), source)
    return source


def compile_wheel(
    build: EngineBuild,
    source: Path,
    toolkit: Toolkit,
    tools: BuildTools,
    jobs: int,
    build_dir: Path,
    out: Path,
) -> tuple[Path, float, float]:
    """pip wheel of the unpacked sdist with the ladder's CMAKE_ARGS: (wheel, wall s, CPU s).
    The build folder stays, so a second run after a stop compiles only what is left."""
    env = {
        **os.environ,
        **toolkit.env,
        "PATH": os.pathsep.join([str(tools.bin), str(toolkit.root / "bin"), os.environ["PATH"]]),
        "CMAKE_ARGS": build.env.get("CMAKE_ARGS", ""),
        "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
    }
    command = [
        str(tools.python), "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
        "-C", f"build-dir={build_dir}", "-w", str(out), str(source),
    ]  # fmt: skip
    before = _children_cpu_s()
    started = time.perf_counter()
    print(f"$ CMAKE_ARGS={env['CMAKE_ARGS']!r} {' '.join(command)}", flush=True)
    if subprocess.call(command, env=env) != 0:
        raise BuildFailed(f"pip wheel failed (its log is above; the build folder {build_dir})")
    wall = time.perf_counter() - started
    wheels = sorted(out.glob("*.whl"))
    if not wheels:
        raise BuildFailed("pip wheel wrote no wheel")
    return wheels[-1], wall, _children_cpu_s() - before


class BuildFailed(RuntimeError):
    pass


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- the check -----------------------------------------------------------------------------------


def list_elf(wheel: Path, cuobjdump: Path) -> tuple[list[str], int]:
    """cuobjdump --list-elf of the wheel's libggml-cuda.so: (lines, the library's bytes)."""
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as scratch:
        members = [n for n in archive.namelist() if Path(n).name.startswith("libggml-cuda.so")]
        if not members:
            return [], 0
        library = Path(archive.extract(members[0], scratch))
        done = subprocess.run(
            [str(cuobjdump), "--list-elf", str(library)], capture_output=True, text=True
        )
        lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
        return lines or [f"cuobjdump failed: {done.stderr.strip()}"], library.stat().st_size


def archs_in(lines: Sequence[str]) -> list[str]:
    """The sm_XX of each ELF cuobjdump lists ("ELF file 1: libggml-cuda.1.sm_90.cubin")."""
    found = {int(m) for line in lines for m in re.findall(r"\.sm_(\d+)[af]?\.cubin", line)}
    return [str(code) for code in sorted(found)]


def targets_of(result: Mapping[str, Any]) -> list[Target]:
    """Built, and an ELF in libggml-cuda.so for every architecture asked for."""
    archs = [str(a) for a in result.get("archs", [])]
    found = {str(a) for a in result.get("archs_found", [])}
    built = bool(result.get("wheel")) and not result.get("error")
    targets = [Target.holds("the CUDA wheel was built", built)]
    targets += [
        Target.holds(f"libggml-cuda.so holds sm_{arch} code", arch in found) for arch in archs
    ]
    return targets


# --- running -------------------------------------------------------------------------------------


def run(command: Sequence[str], cwd: Path | None = None) -> None:
    print(f"$ {' '.join(command)}", flush=True)
    subprocess.run(list(command), check=True, cwd=cwd)


def cpu_flags() -> list[str]:
    from hearthside.core.probe.engine_build import read_cpu_flags

    return sorted(read_cpu_flags())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--gpu", default="h200", help="a GPU fixture's name (h200, v100, …)")
    which.add_argument("--arch", help="an architecture instead of a fixture (sm_90)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs")
    parser.add_argument("--cuda-home", type=Path, help="a CUDA toolkit to use instead")
    parser.add_argument("--report", type=Path, help="also write the JSON report here")
    args = parser.parse_args(argv)

    gpus = gpus_of_arch(args.arch) if args.arch else gpus_of_fixture(args.gpu)
    build = ladder_build(gpus)
    archs = archs_of(build) or cuda_architectures(gpus)
    version = llama_cpp_version()
    result = BuildReport(
        gpu=args.arch or args.gpu,
        archs=archs,
        cmake_args=build.env.get("CMAKE_ARGS", ""),
        llama_cpp_version=version,
        jobs=args.jobs,
        host_cpu_flags=cpu_flags(),
    )
    for line in (*build.reasons, *(f"warning: {w}" for w in build.warnings)):
        print(line)
    tools = build_tools()
    toolkit = toolkit_for(archs, args.cuda_home)
    result.toolkit_source, result.toolkit_version = toolkit.source, toolkit.version
    print(f"toolkit: {toolkit.source}, nvcc {toolkit.version} ({toolkit.root})", flush=True)
    folder = wheel_folder(build, version)
    key = folder.name
    try:
        source = unpacked_sdist(version)
        with tempfile.TemporaryDirectory(prefix="hearthside-cuda-wheel-") as out:
            wheel, result.wall_s, result.cpu_s = compile_wheel(
                build, source, toolkit, tools, args.jobs, BUILDS / key, Path(out)
            )
            folder.mkdir(parents=True, exist_ok=True)
            for old in folder.glob("*.whl"):
                old.unlink()
            kept = folder / wheel.name
            shutil.move(str(wheel), kept)
        result.wheel, result.wheel_bytes = str(kept), kept.stat().st_size
        result.cuobjdump, result.library_bytes = list_elf(kept, tools.cuobjdump)
        result.archs_found = archs_in(result.cuobjdump)
    except (BuildFailed, subprocess.CalledProcessError) as exc:
        result.error = str(exc)
    result.load_average = [round(x, 2) for x in os.getloadavg()]
    return finish(result, folder, args.report)


def finish(result: BuildReport, folder: Path, extra: Path | None) -> int:
    payload = asdict(result)
    text = json.dumps(payload, indent=2)
    if result.wheel:
        (folder / REPORT_NAME).write_text(text)
    if extra is not None:
        extra.write_text(text)
    print(text)
    if result.wall_s is not None:
        print(
            f"cuda_build: {result.gpu} ({', '.join('sm_' + a for a in result.archs)}), "
            f"nvcc {result.toolkit_version} from {result.toolkit_source}, -j{result.jobs}: "
            f"{result.wall_s / 60:.1f} min wall, {(result.cpu_s or 0) / 60:.1f} min CPU"
        )
    for line in result.cuobjdump:
        print(f"  {line}")
    return report(targets_of(payload))


if __name__ == "__main__":
    sys.exit(main())
