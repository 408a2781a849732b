#!/usr/bin/env python3
"""Which llama-cpp-python build fits this machine's GPUs, as CMake flags and a pip command.

Standard library only: bootstrap.py runs this file as a plain script before anything is
installed (`python3 core/probe/engine_build.py --json`), and `hearthside engine rebuild`
imports it with GPUs from the full probes. `choose_build` is pure; `quick_gpu_scan` is the
small stdlib-only discovery used when the full probes are not available.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

BACKENDS = ("cpu", "cuda", "hip", "metal", "vulkan")
PINNED_LLAMA_CPP_VERSION = "0.3.36"
PACKAGE = "llama-cpp-python"
COMMAND_TIMEOUT_S = 5.0

CommandRunner = Callable[[Sequence[str]], str | None]


@dataclass(frozen=True)
class GpuTarget:
    vendor: str  # "nvidia" | "amd" | "apple" | "intel" | "other"
    arch: str | None  # "sm_86", "gfx906", "apple-m3"; None when unknown
    name: str
    vram_bytes: int | None = None


@dataclass(frozen=True)
class EngineBuild:
    backend: str  # one of BACKENDS
    cmake_args: tuple[str, ...]
    env: dict[str, str]  # extra environment for pip (CMAKE_ARGS)
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    # the rung of the fallback ladder this build is ("cpu-features", "avx2", "no-simd",
    # "native", "generic", or the GPU backend's name) and a few words for messages
    rung: str = ""
    summary: str = ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> EngineBuild:
        return cls(
            backend=str(data["backend"]),
            cmake_args=tuple(data.get("cmake_args", ())),
            env=dict(data.get("env", {})),
            reasons=tuple(data.get("reasons", ())),
            warnings=tuple(data.get("warnings", ())),
            rung=str(data.get("rung", "")),
            summary=str(data.get("summary", "")),
        )


# --- choosing ---------------------------------------------------------------------------------


def choose_build(
    gpus: Sequence[GpuTarget],
    *,
    platform: str,
    machine: str,
    backend: str = "auto",
    cpu_flags: frozenset[str] = frozenset(),
) -> EngineBuild:
    """The build for these GPUs on this OS/CPU; `backend` other than "auto" forces one.
    `cpu_flags` (/proc/cpuinfo's) choose a CPU build's instruction sets."""
    return build_ladder(
        gpus, platform=platform, machine=machine, backend=backend, cpu_flags=cpu_flags
    )[0]


def build_ladder(
    gpus: Sequence[GpuTarget],
    *,
    platform: str,
    machine: str,
    backend: str = "auto",
    cpu_flags: frozenset[str] = frozenset(),
) -> tuple[EngineBuild, ...]:
    """The builds to try in order, each safer than the one before: the chosen build first,
    then (for a GPU build) the CPU ladder. A build whose self-test crashes gives way to the
    next (core/probe/engine_ladder.py)."""
    if backend not in ("auto", *BACKENDS):
        raise ValueError(f"unknown backend {backend!r}; choose auto or one of {BACKENDS}")
    cpu = cpu_build_ladder(cpu_flags, machine)
    if backend == "auto":
        first = _auto_build(gpus, platform=platform, machine=machine)
    else:
        first = _forced_build(backend, gpus, platform=platform, machine=machine)
    if first.backend == "cpu":
        return (_with(cpu[0], reasons_before=first.reasons), *cpu[1:])
    return (first, *cpu)


def _auto_build(gpus: Sequence[GpuTarget], *, platform: str, machine: str) -> EngineBuild:
    if _is_apple_silicon(platform, machine):
        return _metal_build(("This is an Apple Silicon Mac: building the Metal backend.",))
    nvidia = [gpu for gpu in gpus if gpu.vendor == "nvidia"]
    amd = [gpu for gpu in gpus if gpu.vendor == "amd"]
    if nvidia and amd:
        return _mixed_vendor_build(nvidia, amd)
    if nvidia:
        return _cuda_build(nvidia)
    if amd:
        return _hip_build(amd)
    return _cpu_build(_no_gpu_reasons(gpus))


def _forced_build(
    backend: str, gpus: Sequence[GpuTarget], *, platform: str, machine: str
) -> EngineBuild:
    forced = f"Building the {backend} backend because it was asked for."
    if backend == "cuda":
        return _with(_cuda_build([g for g in gpus if g.vendor == "nvidia"]), reason=forced)
    if backend == "hip":
        return _with(_hip_build([g for g in gpus if g.vendor == "amd"]), reason=forced)
    if backend == "metal":
        build = _metal_build((forced,))
        if not _is_apple_silicon(platform, machine):
            return _with(build, warning="Metal builds only work on Apple Silicon Macs.")
        return build
    if backend == "vulkan":
        return _make("vulkan", ("-DGGML_VULKAN=on",), (forced,), _vulkan_warnings())
    return _cpu_build((forced,))


def _mixed_vendor_build(nvidia: list[GpuTarget], amd: list[GpuTarget]) -> EngineBuild:
    nvidia_vram, amd_vram = _total_vram(nvidia), _total_vram(amd)
    skipped = "A Vulkan build (--backend vulkan) can drive both vendors, usually more slowly."
    if amd_vram > nvidia_vram:
        why = (
            f"Found NVIDIA and AMD GPUs: building HIP because the AMD cards have more memory "
            f"({_gib(amd_vram)} vs {_gib(nvidia_vram)}); the NVIDIA cards stay unused."
        )
        return _with(_with(_hip_build(amd), reason=why, first=True), warning=skipped)
    why = (
        f"Found NVIDIA and AMD GPUs: building CUDA because the NVIDIA cards have at least as "
        f"much memory ({_gib(nvidia_vram)} vs {_gib(amd_vram)}) and CUDA is the most mature "
        f"backend; the AMD cards stay unused."
    )
    return _with(_with(_cuda_build(nvidia), reason=why, first=True), warning=skipped)


def _cuda_build(gpus: Sequence[GpuTarget]) -> EngineBuild:
    archs = cuda_architectures(gpus)
    args = ["-DGGML_CUDA=on"]
    reasons = [f"Found {_describe(group)}." for group in _grouped(gpus)]
    warnings = list(cuda_toolkit_warnings(archs))
    if archs and all(gpu.arch for gpu in gpus):
        # Plain numbers on purpose: the vendored CMake rewrites 12X to 12Xa itself, and sm_100
        # has no arch-specific ggml kernels, so "100" keeps forward-compatible PTX.
        args.append(f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(archs)}")
        listed = ", ".join(f"sm_{arch}" for arch in archs)
        reasons.append(f"Building CUDA kernels for {listed}.")
    else:
        reasons.append("Building CUDA kernels for the GPUs CMake finds at build time.")
        if gpus:
            warnings.append("Some NVIDIA GPUs report no compute capability; CMake will detect.")
        else:
            warnings.append("No NVIDIA GPU was found; the CUDA build may not be usable here.")
    return _make("cuda", tuple(args), tuple(reasons), tuple(warnings))


def _hip_build(gpus: Sequence[GpuTarget]) -> EngineBuild:
    targets = sorted({gpu.arch for gpu in gpus if gpu.arch and gpu.arch.startswith("gfx")})
    args = ["-DGGML_HIP=on"]
    reasons = [f"Found {_describe(group)}." for group in _grouped(gpus)]
    warnings = list(rocm_warnings(targets))
    if targets:
        # GPU_TARGETS is the name the vendored docs/build.md uses; AMDGPU_TARGETS is legacy.
        args.append(f"-DGPU_TARGETS={';'.join(targets)}")
        reasons.append(f"Building HIP kernels for {', '.join(targets)}.")
    else:
        reasons.append("Building HIP kernels for the GPUs ROCm finds at build time.")
        warnings.append("No AMD GPU architecture was found; the HIP build may not be usable.")
    return _make("hip", tuple(args), tuple(reasons), tuple(warnings))


def _metal_build(reasons: tuple[str, ...]) -> EngineBuild:
    return _make("metal", ("-DGGML_METAL=on",), reasons, ())


def _cpu_build(reasons: tuple[str, ...]) -> EngineBuild:
    """A placeholder for "the CPU": `build_ladder` puts the CPU ladder's first rung in its place."""
    return _make("cpu", (), reasons, ())


# --- the CPU ladder ---------------------------------------------------------------------------

# /proc/cpuinfo flag → ggml's CMake option, in ggml's own order (ggml/CMakeLists.txt).
X86_FLAG_OPTIONS = (
    ("sse4_2", "SSE42"),
    ("avx", "AVX"),
    ("avx2", "AVX2"),
    ("bmi2", "BMI2"),
    ("fma", "FMA"),
    ("f16c", "F16C"),
    ("avx_vnni", "AVX_VNNI"),
    ("avx512f", "AVX512"),
    ("avx512vbmi", "AVX512_VBMI"),
    ("avx512_vnni", "AVX512_VNNI"),
    ("avx512_bf16", "AVX512_BF16"),
)
# ggml's AMX matmul segfaults at the first decode on some Sapphire Rapids CPUs (llama.cpp
# #20824, Ollama #17006), and GGML_NATIVE turns it on wherever the CPU has AMX.
AMX_OFF = ("-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")
AVX2_BASELINE = frozenset({"sse4_2", "avx", "avx2", "bmi2", "fma", "f16c"})
X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")


def cpu_build_ladder(cpu_flags: frozenset[str], machine: str) -> tuple[EngineBuild, ...]:
    """CPU builds from the fastest to the safest. On x86: this CPU's own instruction sets
    without AMX, then an AVX2 baseline, then no SIMD at all; elsewhere GGML_NATIVE, then the
    compiler's generic target."""
    if machine.lower() not in X86_MACHINES:
        return (
            _rung("native", "the instruction sets of this CPU", ("-DGGML_NATIVE=on",)),
            _rung("generic", "the compiler's generic target", ("-DGGML_NATIVE=off",)),
        )
    own = frozenset(cpu_flags) & {flag for flag, _ in X86_FLAG_OPTIONS}
    safest = _x86_rung(
        "no-simd", "the x86-64 baseline without AVX (slow, runs anywhere)", frozenset()
    )
    if not own:  # flags unknown (not Linux): let the compiler look
        native = _rung("native", "the instruction sets of this CPU", ("-DGGML_NATIVE=on",))
        return (native, safest)
    listed = ", ".join(_ISA_NAMES[flag] for flag, _ in X86_FLAG_OPTIONS if flag in own)
    rungs = [_x86_rung("cpu-features", f"this CPU's instruction sets ({listed}), no AMX", own)]
    if own > AVX2_BASELINE:
        rungs.append(_x86_rung("avx2", "an AVX2 baseline", AVX2_BASELINE))
    return (*rungs, safest)


_ISA_NAMES = {
    "sse4_2": "SSE4.2",
    "avx": "AVX",
    "avx2": "AVX2",
    "bmi2": "BMI2",
    "fma": "FMA",
    "f16c": "F16C",
    "avx_vnni": "AVX-VNNI",
    "avx512f": "AVX-512",
    "avx512vbmi": "AVX-512 VBMI",
    "avx512_vnni": "AVX-512 VNNI",
    "avx512_bf16": "AVX-512 BF16",
}


def _x86_rung(rung: str, summary: str, flags: frozenset[str]) -> EngineBuild:
    switches = tuple(
        f"-DGGML_{option}={'ON' if flag in flags else 'OFF'}" for flag, option in X86_FLAG_OPTIONS
    )
    return _rung(rung, summary, ("-DGGML_NATIVE=OFF", *switches, *AMX_OFF))


def _rung(rung: str, summary: str, args: tuple[str, ...]) -> EngineBuild:
    why = f"Building the CPU backend for {summary}."
    return replace(_make("cpu", args, (why,), ()), rung=rung, summary=summary)


def read_cpu_flags(root: Path = Path("/")) -> frozenset[str]:
    """The first CPU's flags in /proc/cpuinfo (x86 "flags", Arm "Features"); empty elsewhere."""
    try:
        text = (root / "proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def _no_gpu_reasons(gpus: Sequence[GpuTarget]) -> tuple[str, ...]:
    others = [gpu for gpu in gpus if gpu.vendor not in ("nvidia", "amd", "apple")]
    if not others:
        return ("No NVIDIA, AMD or Apple GPU found.",)
    names = ", ".join(gpu.name for gpu in others)
    return (f"Found {names}: no dedicated backend; `--backend vulkan` may drive it.",)


def cuda_architectures(gpus: Sequence[GpuTarget]) -> list[str]:
    """CMake's architecture numbers, deduplicated and in numeric order: sm_86 → "86"."""
    codes = {_sm_number(gpu.arch) for gpu in gpus}
    return [str(code) for code in sorted(code for code in codes if code is not None)]


def _sm_number(arch: str | None) -> int | None:
    if not arch or not arch.startswith("sm_"):
        return None
    digits = arch[3:].rstrip("af")
    return int(digits) if digits.isdigit() else None


def cuda_toolkit_warnings(archs: Sequence[str]) -> tuple[str, ...]:
    """What the CUDA toolkit must be for these architectures (CUDA 13 supports sm_75 and up;
    sm_100/sm_120 arrived in 12.8, sm_103/sm_121 in 12.9)."""
    codes = [int(arch) for arch in archs]
    warnings = []
    old = [code for code in codes if code < 75]
    if any(code < 50 for code in codes):
        warnings.append("GPUs older than sm_50 are not supported by CUDA 12 or llama.cpp.")
    if old:
        listed = ", ".join(f"sm_{code}" for code in old)
        warnings.append(
            f"{listed} needs a CUDA 12.x toolkit: CUDA 13 dropped Maxwell, Pascal and Volta "
            f"(sm_70). Point CUDACXX at a 12.x nvcc if a newer one is installed (PyPI's CUDA 12 "
            f"wheels hold no nvcc; a distribution's CUDA 12 package does)."
        )
    needed = [version for version in map(_toolkit_for_blackwell, codes) if version]
    newest_needed = max(needed, default=None)
    if newest_needed:
        warnings.append(f"Blackwell GPUs need CUDA {newest_needed} or newer.")
    if old and newest_needed:
        window = "12.9" if newest_needed == "12.9" else f"{newest_needed}–12.9"
        warnings.append(f"Both old and Blackwell GPUs: only CUDA {window} builds for all of them.")
    return tuple(warnings)


@dataclass(frozen=True)
class CudaToolkitRange:
    """The CUDA toolkit releases whose nvcc builds for every one of a set of architectures:
    `first` ("12.0", "12.8", "12.9") to `last` (None: up to the newest; "12.9": CUDA 13
    dropped an architecture in the set)."""

    first: str
    last: str | None

    @property
    def needs_cuda_12(self) -> bool:
        return self.last is not None and self.last.startswith("12.")


def cuda_toolkit_range(archs: Sequence[str]) -> CudaToolkitRange:
    """Which toolkits can build for `archs` (CMake numbers: "70", "90", "121")."""
    codes = [int(arch) for arch in archs]
    needed = [version for version in map(_toolkit_for_blackwell, codes) if version]
    first = max(needed, default="12.0")
    last = "12.9" if any(code < 75 for code in codes) else None
    return CudaToolkitRange(first, last)


def _toolkit_for_blackwell(code: int) -> str | None:
    if code in (103, 121):
        return "12.9"
    if code >= 100:
        return "12.8"
    return None


def rocm_warnings(targets: Sequence[str]) -> tuple[str, ...]:
    if "gfx906" in targets:
        return (
            "gfx906 (MI50/MI60/Radeon VII) was dropped from ROCm 6.4: build with ROCm 6.3 or "
            "older (or a community llama.cpp fork tuned for GCN).",
        )
    return ()


def _vulkan_warnings() -> tuple[str, ...]:
    return ("Vulkan builds need the Vulkan SDK (glslc) and usually run slower than CUDA/HIP.",)


def _make(
    backend: str, args: tuple[str, ...], reasons: tuple[str, ...], warnings: tuple[str, ...]
) -> EngineBuild:
    summary = f"the {backend.upper()} backend" if backend != "cpu" else "the CPU"
    env = {"CMAKE_ARGS": " ".join(args)} if args else {}
    return EngineBuild(backend, args, env, reasons, warnings, rung=backend, summary=summary)


def _with(
    build: EngineBuild,
    *,
    reason: str | None = None,
    warning: str | None = None,
    first: bool = False,
    reasons_before: tuple[str, ...] = (),
) -> EngineBuild:
    reasons = build.reasons
    if reason:
        reasons = (reason, *reasons) if first else (*reasons, reason)
    warnings = (*build.warnings, warning) if warning else build.warnings
    reasons = (*reasons_before, *reasons)
    return replace(build, env=dict(build.env), reasons=reasons, warnings=warnings)


def _grouped(gpus: Sequence[GpuTarget]) -> list[tuple[int, GpuTarget]]:
    counts = Counter((gpu.name, gpu.arch) for gpu in gpus)
    first = {(gpu.name, gpu.arch): gpu for gpu in reversed(gpus)}
    return [(count, first[key]) for key, count in counts.items()]


def _describe(group: tuple[int, GpuTarget]) -> str:
    count, gpu = group
    label = f"{count}× {gpu.name}" if count > 1 else gpu.name
    return f"{label} ({gpu.arch})" if gpu.arch else label


def _total_vram(gpus: Sequence[GpuTarget]) -> int:
    return sum(gpu.vram_bytes or 0 for gpu in gpus)


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.0f} GiB"


def _is_apple_silicon(platform: str, machine: str) -> bool:
    return platform == "darwin" and machine in ("arm64", "aarch64")


# --- the pip command --------------------------------------------------------------------------


def installed_llama_cpp_version() -> str:
    """The llama-cpp-python version this interpreter has, else the version Hearthside pins."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return PINNED_LLAMA_CPP_VERSION


def pip_command(build: EngineBuild, python: str, version: str | None = None) -> list[str]:
    """pip's argv that recompiles llama-cpp-python; run it with `build.env` added.
    --no-binary keeps pip from taking a prebuilt wheel (which would ignore CMAKE_ARGS);
    --no-deps leaves numpy and friends as they are."""
    del build  # the flags travel in the environment (CMAKE_ARGS), not on the command line
    pinned = version or installed_llama_cpp_version()
    return [
        python,
        "-m",
        "pip",
        "install",
        "--force-reinstall",
        "--no-cache-dir",
        "--no-deps",
        f"--no-binary={PACKAGE}",
        f"{PACKAGE}=={pinned}",
    ]


def shell_command(build: EngineBuild, python: str, version: str | None = None) -> str:
    """The command as one line to paste into a POSIX shell, environment first."""
    env = " ".join(f"{key}={shlex.quote(value)}" for key, value in sorted(build.env.items()))
    return f"{env} {shlex.join(pip_command(build, python, version))}".strip()


# --- quick, stdlib-only discovery -------------------------------------------------------------


def run_command(command: Sequence[str]) -> str | None:
    """stdout of `command`, or None when the tool is missing, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        completed = subprocess.run(
            list(command), capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout if completed.returncode == 0 else None


NVIDIA_SMI_QUERY = (
    "nvidia-smi",
    "--query-gpu=name,compute_cap,memory.total",
    "--format=csv,noheader,nounits",
)


def quick_gpu_scan(
    run: CommandRunner = run_command,
    sys_root: Path = Path("/"),
    platform: str = sys.platform,
) -> list[GpuTarget]:
    """GPUs found with nvidia-smi, the KFD topology (AMD on Linux) and sysctl (macOS)."""
    gpus = parse_nvidia_smi(run(NVIDIA_SMI_QUERY) or "")
    if platform.startswith("linux"):
        gpus += scan_kfd_topology(sys_root)
    if platform == "darwin":
        gpus += parse_apple_brand(run(("sysctl", "-n", "machdep.cpu.brand_string")) or "")
    return gpus


def parse_nvidia_smi(text: str) -> list[GpuTarget]:
    """Lines like "NVIDIA GeForce RTX 3090, 8.6, 24576" (name, compute_cap, MiB)."""
    gpus = []
    for line in text.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 2 or not fields[0]:
            continue
        vram_mib = fields[2] if len(fields) > 2 else ""
        gpus.append(
            GpuTarget(
                vendor="nvidia",
                arch=_sm_arch(fields[1]),
                name=fields[0],
                vram_bytes=int(vram_mib) * 2**20 if vram_mib.isdigit() else None,
            )
        )
    return gpus


def _sm_arch(compute_cap: str) -> str | None:
    """ "8.6" → "sm_86", "12.1" → "sm_121"; None for "[N/A]" and other surprises."""
    major, _, minor = compute_cap.partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return f"sm_{int(major)}{int(minor)}"


def gfx_name(target_version: int) -> str | None:
    """KFD's gfx_target_version (major*10000 + minor*100 + stepping) → "gfx906", "gfx90a"."""
    if target_version <= 0:
        return None
    major, rest = divmod(target_version, 10000)
    minor, stepping = divmod(rest, 100)
    return f"gfx{major}{minor:x}{stepping:x}"


def scan_kfd_topology(sys_root: Path) -> list[GpuTarget]:
    """AMD GPUs from /sys/class/kfd/kfd/topology/nodes/*/properties (CPU nodes report 0)."""
    nodes = sys_root / "sys/class/kfd/kfd/topology/nodes"
    if not nodes.is_dir():
        return []
    gpus = []
    for node in sorted(nodes.iterdir(), key=lambda path: _node_number(path.name)):
        properties = _read_properties(node / "properties")
        arch = gfx_name(properties.get("gfx_target_version", 0))
        if arch is not None:
            gpus.append(GpuTarget("amd", arch, _kfd_name(node, arch), _kfd_vram_bytes(node)))
    return gpus


def _node_number(name: str) -> int:
    return int(name) if name.isdigit() else sys.maxsize


def _read_properties(path: Path) -> dict[str, int]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    values = {}
    for line in lines:
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value.strip())
    return values


def _kfd_name(node: Path, arch: str) -> str:
    try:
        name = (node / "name").read_text().strip()
    except OSError:
        name = ""
    return name if name and name != arch else f"AMD GPU ({arch})"


def _kfd_vram_bytes(node: Path) -> int | None:
    """Local memory banks (heap_type 1 public / 2 private VRAM; 0 is system memory)."""
    banks = sorted((node / "mem_banks").glob("*/properties"))
    sizes = [
        props.get("size_in_bytes", 0)
        for props in map(_read_properties, banks)
        if props.get("heap_type", 0) in (1, 2)
    ]
    return sum(sizes) or None


def parse_apple_brand(text: str) -> list[GpuTarget]:
    """ "Apple M3 Ultra" → one Apple GPU of arch "apple-m3"; Intel Macs → none."""
    brand = text.strip()
    words = brand.split()
    if len(words) < 2 or words[0] != "Apple" or not words[1].startswith("M"):
        return []
    return [GpuTarget("apple", f"apple-{words[1].lower()}", brand)]


# --- running as a script ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Choose llama-cpp-python's build flags.")
    parser.add_argument("--json", action="store_true", help="print the build as JSON")
    parser.add_argument("--backend", choices=("auto", *BACKENDS), default="auto")
    parser.add_argument("--python", default=sys.executable, help="interpreter pip runs in")
    args = parser.parse_args(argv)
    import platform as platform_module

    gpus = quick_gpu_scan()
    build = choose_build(
        gpus,
        platform=sys.platform,
        machine=platform_module.machine(),
        backend=args.backend,
        cpu_flags=read_cpu_flags(),
    )
    if args.json:
        payload = {
            **build.to_dict(),
            "gpus": [asdict(gpu) for gpu in gpus],
            "pip_command": pip_command(build, args.python),
        }
        print(json.dumps(payload, indent=2))
        return 0
    for line in (*build.reasons, *(f"warning: {w}" for w in build.warnings)):
        print(line)
    print(shell_command(build, args.python))
    return 0


if __name__ == "__main__":
    sys.exit(main())
