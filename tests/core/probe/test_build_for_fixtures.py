"""`hearthside engine rebuild --dry-run` picks the right build for every recorded GPU machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.app.engine_cli import gpu_target
from hearthside.core.probe.engine_build import choose_build
from hearthside.core.probe.profile import HardwareProfile

pytestmark = pytest.mark.beside

GPU_FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu"
FIXTURE_NAMES = sorted(path.parent.name for path in GPU_FIXTURES.glob("*/golden.json"))
PLATFORMS = {"linux": "linux", "darwin": "darwin", "windows": "win32"}


def load(name: str) -> HardwareProfile:
    return HardwareProfile.from_json((GPU_FIXTURES / name / "golden.json").read_text())


def cmake_value(args: tuple[str, ...], name: str) -> set[str]:
    values = [arg.split("=", 1)[1] for arg in args if arg.startswith(f"-D{name}=")]
    return set(values[0].split(";")) if values else set()


def test_every_gpu_fixture_is_covered() -> None:
    assert len(FIXTURE_NAMES) >= 20


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_dry_run_flags_match_the_fixture(name: str) -> None:
    profile = load(name)
    build = choose_build(
        [gpu_target(gpu) for gpu in profile.gpus],
        platform=PLATFORMS[profile.os],
        machine=profile.cpu.arch,
    )
    vendors = {gpu.vendor for gpu in profile.gpus}
    if vendors == {"nvidia"}:
        assert build.backend == "cuda" and "-DGGML_CUDA=on" in build.cmake_args
        wanted = {gpu.arch.removeprefix("sm_") for gpu in profile.gpus if gpu.arch}
        assert cmake_value(build.cmake_args, "CMAKE_CUDA_ARCHITECTURES") == wanted
    elif vendors == {"amd"}:
        assert build.backend == "hip" and "-DGGML_HIP=on" in build.cmake_args
        assert cmake_value(build.cmake_args, "GPU_TARGETS") == {g.arch for g in profile.gpus}
    elif vendors == {"apple"}:
        assert build.backend == "metal" and "-DGGML_METAL=on" in build.cmake_args
    else:
        assert build.backend == "cpu", f"{name}: no usable GPU should mean a CPU build"
    assert build.reasons, "every choice says why"


def test_volta_build_warns_about_cuda_13() -> None:
    build = choose_build(
        [gpu_target(gpu) for gpu in load("v100").gpus], platform="linux", machine="x86_64"
    )
    assert any("12" in warning for warning in build.warnings)


def test_gfx906_build_warns_about_rocm_6_4() -> None:
    build = choose_build(
        [gpu_target(gpu) for gpu in load("mi50").gpus], platform="linux", machine="x86_64"
    )
    assert any("6.3" in warning for warning in build.warnings)
