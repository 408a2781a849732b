"""Choosing llama-cpp-python's build flags, the pip command, and the stdlib-only GPU scan."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from hearthside.core.probe.engine_build import (
    EngineBuild,
    GpuTarget,
    choose_build,
    cuda_toolkit_range,
    gfx_name,
    parse_apple_brand,
    parse_nvidia_smi,
    pip_command,
    quick_gpu_scan,
    shell_command,
)

pytestmark = pytest.mark.beside

REPO_ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30
RTX_3090 = GpuTarget("nvidia", "sm_86", "NVIDIA GeForce RTX 3090", 24 * GIB)
RTX_4090 = GpuTarget("nvidia", "sm_89", "NVIDIA GeForce RTX 4090", 24 * GIB)
V100 = GpuTarget("nvidia", "sm_70", "Tesla V100-SXM2-32GB", 32 * GIB)
GB10 = GpuTarget("nvidia", "sm_121", "NVIDIA GB10", 128 * GIB)
B200 = GpuTarget("nvidia", "sm_100", "NVIDIA B200", 180 * GIB)
MI50 = GpuTarget("amd", "gfx906", "AMD Instinct MI50", 32 * GIB)
XTX = GpuTarget("amd", "gfx1100", "Radeon RX 7900 XTX", 24 * GIB)


def linux(*gpus: GpuTarget, backend: str = "auto") -> EngineBuild:
    return choose_build(gpus, platform="linux", machine="x86_64", backend=backend)


def test_nvidia_archs_are_deduplicated_and_sorted() -> None:
    build = linux(RTX_4090, RTX_3090, RTX_3090)
    assert build.backend == "cuda"
    assert build.cmake_args == ("-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=86;89")
    assert build.env == {"CMAKE_ARGS": "-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86;89"}
    assert "Found 2× NVIDIA GeForce RTX 3090 (sm_86)." in build.reasons
    assert "Building CUDA kernels for sm_86, sm_89." in build.reasons
    assert build.warnings == ()


def test_blackwell_uses_plain_numbers_and_warns_about_the_toolkit() -> None:
    build = linux(GB10, B200)
    assert "-DCMAKE_CUDA_ARCHITECTURES=100;121" in build.cmake_args
    assert any("CUDA 12.9" in warning for warning in build.warnings)


def test_volta_needs_cuda_12() -> None:
    build = linux(V100)
    assert "-DCMAKE_CUDA_ARCHITECTURES=70" in build.cmake_args
    assert any("CUDA 12.x" in w and "CUDA 13" in w for w in build.warnings)


def test_volta_with_blackwell_narrows_the_toolkit_window() -> None:
    warnings = " ".join(linux(V100, B200).warnings)
    assert "CUDA 12.8–12.9" in warnings


def test_the_toolkit_range_is_what_nvcc_can_build_for() -> None:
    """benchmarks/cuda_build.py picks its toolkit from this: CUDA 13.0 (PyPI) built sm_90,
    Debian's CUDA 12.4 built sm_70 (docs/gpu.md)."""
    hopper = cuda_toolkit_range(["90"])
    assert (hopper.first, hopper.last, hopper.needs_cuda_12) == ("12.0", None, False)
    volta = cuda_toolkit_range(["70"])
    assert (volta.first, volta.last, volta.needs_cuda_12) == ("12.0", "12.9", True)
    assert cuda_toolkit_range(["100"]).first == "12.8"
    assert cuda_toolkit_range(["100", "121"]).first == "12.9"
    both = cuda_toolkit_range(["70", "100"])
    assert (both.first, both.last) == ("12.8", "12.9")


def test_amd_uses_gpu_targets_and_warns_about_gfx906() -> None:
    build = linux(XTX, MI50)
    assert build.backend == "hip"
    assert build.cmake_args == ("-DGGML_HIP=on", "-DGPU_TARGETS=gfx1100;gfx906")
    assert any("ROCm 6.4" in w and "6.3" in w for w in build.warnings)


def test_mixed_vendors_follow_the_memory() -> None:
    nvidia_wins = linux(RTX_3090, XTX)
    assert nvidia_wins.backend == "cuda"
    assert "NVIDIA and AMD" in nvidia_wins.reasons[0]
    amd_wins = linux(RTX_3090, MI50, XTX)
    assert amd_wins.backend == "hip"
    assert "more memory (56 GiB vs 24 GiB)" in amd_wins.reasons[0]
    assert any("Vulkan" in w for w in amd_wins.warnings)


def test_apple_silicon_builds_metal_and_intel_macs_build_cpu() -> None:
    apple = GpuTarget("apple", "apple-m3", "Apple M3 Ultra")
    metal = choose_build([apple], platform="darwin", machine="arm64")
    assert metal.cmake_args == ("-DGGML_METAL=on",)
    intel_mac = choose_build([], platform="darwin", machine="x86_64")
    assert intel_mac.backend == "cpu"


def test_no_gpu_builds_for_this_cpu() -> None:
    build = linux()
    assert build.backend == "cpu"
    assert build.cmake_args == ("-DGGML_NATIVE=on",)
    intel = linux(GpuTarget("intel", None, "Intel Arc A770"))
    assert intel.backend == "cpu"
    assert "Intel Arc A770" in intel.reasons[0]


def test_a_forced_backend_wins() -> None:
    assert linux(RTX_3090, backend="vulkan").cmake_args == ("-DGGML_VULKAN=on",)
    cuda_without_gpu = linux(backend="cuda")
    assert cuda_without_gpu.cmake_args == ("-DGGML_CUDA=on",)
    assert cuda_without_gpu.warnings
    assert linux(RTX_3090, backend="cpu").backend == "cpu"
    assert linux(backend="metal").warnings
    with pytest.raises(ValueError):
        linux(backend="opencl")


def test_pip_command_is_exact() -> None:
    build = linux(RTX_3090)
    assert pip_command(build, "/venv/bin/python", "0.3.36") == [
        "/venv/bin/python",
        "-m",
        "pip",
        "install",
        "--force-reinstall",
        "--no-cache-dir",
        "--no-deps",
        "--no-binary=llama-cpp-python",
        "llama-cpp-python==0.3.36",
    ]
    assert shell_command(build, "/venv/bin/python", "0.3.36").startswith(
        "CMAKE_ARGS='-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=86' /venv/bin/python -m pip"
    )


def test_nvidia_smi_lines() -> None:
    text = "NVIDIA GeForce RTX 3090, 8.6, 24576\nNVIDIA GB10, 12.1, [N/A]\nOld card, [N/A], 4096\n"
    assert parse_nvidia_smi(text) == [
        GpuTarget("nvidia", "sm_86", "NVIDIA GeForce RTX 3090", 24 * GIB),
        GpuTarget("nvidia", "sm_121", "NVIDIA GB10", None),
        GpuTarget("nvidia", None, "Old card", 4 * GIB),
    ]


def test_gfx_target_versions() -> None:
    assert gfx_name(90006) == "gfx906"
    assert gfx_name(90010) == "gfx90a"
    assert gfx_name(90402) == "gfx942"
    assert gfx_name(110000) == "gfx1100"
    assert gfx_name(110501) == "gfx1151"
    assert gfx_name(0) is None


def _write_kfd_node(root: Path, node: int, gfx_version: int, vram_bytes: int = 0) -> None:
    folder = root / f"sys/class/kfd/kfd/topology/nodes/{node}"
    (folder / "mem_banks/0").mkdir(parents=True)
    (folder / "properties").write_text(f"cpu_cores_count 0\ngfx_target_version {gfx_version}\n")
    heap = 1 if vram_bytes else 0
    (folder / "mem_banks/0/properties").write_text(
        f"heap_type {heap}\nsize_in_bytes {vram_bytes}\n"
    )


def test_quick_scan_reads_a_fake_kfd_tree_and_nvidia_smi(tmp_path: Path) -> None:
    _write_kfd_node(tmp_path, 0, 0)  # the CPU node
    _write_kfd_node(tmp_path, 1, 90006, 32 * GIB)
    _write_kfd_node(tmp_path, 2, 110000, 24 * GIB)

    def run(command: Sequence[str]) -> str | None:
        return "NVIDIA GeForce RTX 3090, 8.6, 24576\n" if command[0] == "nvidia-smi" else None

    gpus = quick_gpu_scan(run, tmp_path, "linux")
    assert [(g.vendor, g.arch, g.vram_bytes) for g in gpus] == [
        ("nvidia", "sm_86", 24 * GIB),
        ("amd", "gfx906", 32 * GIB),
        ("amd", "gfx1100", 24 * GIB),
    ]


def test_quick_scan_on_a_mac() -> None:
    def run(command: Sequence[str]) -> str | None:
        return "Apple M3 Ultra\n" if command[0] == "sysctl" else None

    assert quick_gpu_scan(run, Path("/nonexistent"), "darwin") == [
        GpuTarget("apple", "apple-m3", "Apple M3 Ultra")
    ]
    assert parse_apple_brand("Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz") == []


def test_runs_as_a_plain_script_without_hearthside() -> None:
    """bootstrap.py runs it before anything is installed: stdlib only, no package imports."""
    script = REPO_ROOT / "core" / "probe" / "engine_build.py"
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(script), "--json"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    payload = json.loads(result.stdout)
    assert payload["backend"] == "cpu"  # this machine has no GPU
    if platform.machine() in ("x86_64", "AMD64"):  # this CPU's own flags, AMX never
        assert payload["rung"] == "cpu-features"
        assert "-DGGML_NATIVE=OFF" in payload["env"]["CMAKE_ARGS"]
        assert "-DGGML_AMX_INT8=OFF" in payload["env"]["CMAKE_ARGS"]
    else:
        assert payload["env"] == {"CMAKE_ARGS": "-DGGML_NATIVE=on"}
    assert payload["pip_command"][-1].startswith("llama-cpp-python==")
