"""Advice names the problem and the command that fixes it."""

from __future__ import annotations

import pytest

from hearthside.core.probe.advice import advise
from hearthside.core.probe.profile import (
    CpuInfo,
    DiskInfo,
    EngineInfo,
    GpuInfo,
    HardwareProfile,
    MemoryInfo,
    UnsupportedDevice,
)

pytestmark = pytest.mark.beside

GIB = 1024**3
CPU_ENGINE = EngineInfo(package_version="0.3.36", backends=("CPU",), gpu_offload=False)


def profile(**fields: object) -> HardwareProfile:
    base: dict[str, object] = {
        "cpu": CpuInfo(arch="x86_64"),
        "memory": MemoryInfo(total_bytes=64 * GIB, available_bytes=60 * GIB),
        "os": "linux",
        "engine": CPU_ENGINE,
    }
    base.update(fields)
    return HardwareProfile(**base)  # type: ignore[arg-type]


RTX_3090 = GpuInfo(vendor="nvidia", name="NVIDIA GeForce RTX 3090", arch="sm_86", index=0)


def test_a_gpu_the_cpu_only_engine_cannot_drive_gets_the_rebuild_command() -> None:
    (advice,) = advise(profile(gpus=(RTX_3090,)))
    assert "RTX 3090 is present" in advice.message
    assert "built for the CPU only" in advice.message
    assert "CUDA for sm_86" in advice.message
    assert advice.fix == "hearthside engine rebuild"


def test_no_rebuild_advice_when_the_engine_has_the_backend() -> None:
    cuda = EngineInfo(package_version="0.3.36", backends=("CPU", "CUDA"), gpu_offload=True)
    assert advise(profile(gpus=(RTX_3090,), engine=cuda)) == ()


def test_volta_and_gfx906_get_their_toolkit_advice() -> None:
    v100 = GpuInfo(vendor="nvidia", name="Tesla V100-SXM2-32GB", arch="sm_70")
    mi50 = GpuInfo(vendor="amd", name="AMD Instinct MI50", arch="gfx906")
    vulkan = EngineInfo(backends=("CPU", "Vulkan"), gpu_offload=True)
    messages = [advice.message for advice in advise(profile(gpus=(v100, mi50), engine=vulkan))]
    assert any("CUDA 13 dropped Volta" in message for message in messages)
    assert any("ROCm 6.4 dropped gfx906" in message for message in messages)


def test_container_limit_low_memory_and_spinning_disk() -> None:
    memory = MemoryInfo(total_bytes=64 * GIB, available_bytes=1 * GIB, cgroup_limit_bytes=8 * GIB)
    disk = DiskInfo(path="/data/models", rotational=True)
    text = " ".join(advice.message for advice in advise(profile(memory=memory, disks=(disk,))))
    assert "may use 8.0 GiB of the machine's 64.0 GiB" in text
    assert "Only 1.0 GiB of memory is free" in text
    assert "spinning disk" in text


def test_unsupported_devices_are_explained() -> None:
    old = UnsupportedDevice(name="GeForce GTX 1080", reason="compute capability 6.1 < 7.0")
    (advice,) = advise(profile(unsupported=(old,)))
    assert "GTX 1080 cannot be used: compute capability 6.1" in advice.message


def test_a_healthy_cpu_machine_gets_no_advice() -> None:
    assert advise(profile(disks=(DiskInfo(path="/m", rotational=False),))) == ()
