"""NVIDIA probe: recorded NVML values from real parts → GpuInfo; the live NVML seam."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pynvml
import pytest

from hearthside.core.probe.base import ProbeContext, ProbeResult, merge_results
from hearthside.core.probe.nvidia import (
    cuda_architecture,
    cuda_version_text,
    parse_meminfo_bytes,
    parse_nvml_records,
    probe,
)
from hearthside.core.probe.profile import GpuInfo, HardwareProfile

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu"
GIB = 1024**3

# fixture → (arch, datasheet memory bandwidth in GB/s)
EXPECTED = {
    "v100": ("sm_70", 900),
    "t4": ("sm_75", 320),
    "a100": ("sm_80", 1555),
    "rtx-3090": ("sm_86", 936),
    "2x-rtx-3090": ("sm_86", 936),
    "rtx-4090": ("sm_89", 1008),
    "h100": ("sm_90", 3350),
    "h200": ("sm_90", 4800),
    "gh200": ("sm_90", 4000),
    "b200": ("sm_100", 8000),
    "rtx-5090": ("sm_120", 1792),
    "gb10": ("sm_121", 273),
}
ARM_MACHINES = {"gb10", "gh200"}
ALL_FIXTURES = [*EXPECTED, "gtx-1080-ti"]


def parse_fixture(name: str) -> ProbeResult:
    return parse_nvml_records(json.loads((FIXTURES / name / "nvml.json").read_text()))


def gpus(name: str) -> tuple[GpuInfo, ...]:
    return parse_fixture(name).gpus


GOLDEN_FIXTURES = tuple(ALL_FIXTURES)  # rewritten only by hand: `python -m tests.update_goldens`


def golden_profile(name: str) -> HardwareProfile:
    """The profile a fixture's golden.json holds (tests/update_goldens.py writes it)."""
    machine = "aarch64" if name in ARM_MACHINES else "x86_64"
    return merge_results([parse_fixture(name)], os="linux", machine=machine, source="fixture")


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_parse_matches_golden(name: str) -> None:
    golden = FIXTURES / name / "golden.json"
    assert HardwareProfile.from_json(golden.read_text()) == golden_profile(name)


@pytest.mark.parametrize(("name", "arch"), [(name, arch) for name, (arch, _) in EXPECTED.items()])
def test_arch_from_compute_capability(name: str, arch: str) -> None:
    assert [gpu.arch for gpu in gpus(name)] == [arch] * len(gpus(name))


@pytest.mark.parametrize(("name", "datasheet_gb_s"), [(n, bw) for n, (_, bw) in EXPECTED.items()])
def test_bandwidth_within_5_percent_of_datasheet(name: str, datasheet_gb_s: int) -> None:
    for gpu in gpus(name):
        assert gpu.memory_bandwidth_bytes_per_s is not None
        assert gpu.memory_bandwidth_bytes_per_s / 1e9 == pytest.approx(datasheet_gb_s, rel=0.05)


@pytest.mark.parametrize("name", sorted(set(EXPECTED) - {"gb10", "gh200"}))
def test_discrete_cards_are_neither_unified_nor_integrated(name: str) -> None:
    assert all(not gpu.unified_memory and not gpu.integrated for gpu in gpus(name))


def test_gb10_is_unified_and_integrated_with_host_memory() -> None:
    (gb10,) = gpus("gb10")
    assert gb10.unified_memory and gb10.integrated
    assert gb10.vram_total_bytes is not None and 118 * GIB < gb10.vram_total_bytes < 128 * GIB
    assert gb10.compute_units == 48
    assert gb10.runtime_version == "13.0"


def test_gh200_reports_hbm_as_vram_but_is_unified() -> None:
    (gh200,) = gpus("gh200")
    assert gh200.unified_memory and not gh200.integrated
    assert gh200.vram_total_bytes is not None and 94 * GIB < gh200.vram_total_bytes < 97 * GIB


def test_real_vram_and_sm_counts() -> None:
    assert [(g.vram_total_bytes, g.compute_units) for g in gpus("h100")] == [(81559 * 2**20, 132)]
    assert gpus("v100")[0].vram_total_bytes == 32 * GIB
    assert gpus("rtx-5090")[0].compute_units == 170
    assert gpus("b200")[0].compute_units == 148


def test_two_rtx_3090_are_devices_0_and_1() -> None:
    two = gpus("2x-rtx-3090")
    assert [gpu.index for gpu in two] == [0, 1]
    assert len({gpu.pci_bus_id for gpu in two}) == 2


def test_volta_is_supported_and_pascal_is_not() -> None:
    assert gpus("v100")[0].arch == "sm_70"
    result = parse_fixture("gtx-1080-ti")
    assert result.gpus == ()
    (pascal,) = result.unsupported
    assert pascal.name == "NVIDIA GeForce GTX 1080 Ti" and "6.1" in pascal.reason


def test_runtime_version_from_nvml_integer() -> None:
    assert gpus("h100")[0].runtime_version == "12.4"
    assert cuda_version_text(12040) == "12.4"
    assert cuda_version_text(13000) == "13.0"
    assert cuda_version_text(None) is None


def test_cuda_architecture_for_the_engine_build() -> None:
    assert cuda_architecture("sm_86") == "86"
    assert cuda_architecture("sm_121") == "121"
    with pytest.raises(ValueError):
        cuda_architecture("gfx906")


def test_a_device_that_failed_becomes_an_error() -> None:
    result = parse_nvml_records([{"index": 1, "error": "GPU is lost"}])
    assert result.gpus == ()
    assert [(e.source, e.message) for e in result.errors] == [("nvidia", "GPU 1: GPU is lost")]


def test_meminfo_parse() -> None:
    text = "MemTotal:       127600748 kB\nMemAvailable:   118566368 kB\nHugePages_Total:       0\n"
    assert parse_meminfo_bytes(text) == {
        "MemTotal": 127600748 * 1024,
        "MemAvailable": 118566368 * 1024,
    }


# --- the live seam: a stand-in for the pynvml module, raising pynvml's real error classes ---


class FakeNvml:
    NVMLError = pynvml.NVMLError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    def __init__(self, devices: list[dict[str, Any]], init_error: Exception | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.126.09"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 13000

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.devices[index]

    def _value(self, handle: dict[str, Any], key: str) -> Any:
        value = handle[key]
        if isinstance(value, BaseException):
            raise value
        return value

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> bytes:
        return self._value(handle, "name")

    def nvmlDeviceGetUUID(self, handle: dict[str, Any]) -> str:
        return self._value(handle, "uuid")

    def nvmlDeviceGetPciInfo(self, handle: dict[str, Any]) -> Any:
        return type("PciInfo", (), {"busId": self._value(handle, "bus_id")})()

    def nvmlDeviceGetCudaComputeCapability(self, handle: dict[str, Any]) -> tuple[int, int]:
        return self._value(handle, "cc")

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> Any:
        total, free = self._value(handle, "memory")
        return type("Memory", (), {"total": total, "free": free})()

    def nvmlDeviceGetMemoryBusWidth(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "bus_width")

    def nvmlDeviceGetMaxClockInfo(self, handle: dict[str, Any], clock: int) -> int:
        assert clock == pynvml.NVML_CLOCK_MEM
        return self._value(handle, "mem_clock")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "pcie_gen")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "pcie_width")

    def nvmlDeviceGetAttributes(self, handle: dict[str, Any]) -> Any:
        return type("Attributes", (), {"multiprocessorCount": self._value(handle, "sms")})()

    def nvmlDeviceGetAddressingMode(self, handle: dict[str, Any]) -> int:
        return self._value(handle, "addressing")


def gb10_handle() -> dict[str, Any]:
    unsupported = pynvml.NVMLError_NotSupported()
    return {
        "name": b"NVIDIA GB10",
        "uuid": "GPU-2dee1e25-b3b5-007e-2b55-79f2d0f2ebe5",
        "bus_id": b"0000000F:01:00.0",
        "cc": (12, 1),
        "memory": unsupported,
        "bus_width": unsupported,
        "mem_clock": unsupported,
        "pcie_gen": unsupported,
        "pcie_width": unsupported,
        "sms": 48,
        "addressing": pynvml.NVML_DEVICE_ADDRESSING_MODE_ATS,
    }


def test_collects_records_like_the_gb10_fixture(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "meminfo").write_text(
        "MemTotal:       127600748 kB\nMemFree:        110000000 kB\nMemAvailable:   118566368 kB\n"
    )
    nvml = FakeNvml([gb10_handle()])
    result = probe(ProbeContext(root=tmp_path, platform="linux"), nvml=nvml)
    assert result == parse_fixture("gb10")
    assert nvml.shut_down


def test_one_lost_device_does_not_hide_the_others(tmp_path: Path) -> None:
    lost = gb10_handle() | {"name": pynvml.NVMLError_GpuIsLost()}
    result = probe(ProbeContext(root=tmp_path), nvml=FakeNvml([lost, gb10_handle()]))
    assert [gpu.index for gpu in result.gpus] == [1]
    assert [error.message for error in result.errors] == ["GPU 0: GPU is lost"]


def test_missing_library_is_an_empty_result() -> None:
    nvml = FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    assert probe(ProbeContext(), nvml=nvml) == ProbeResult()


def test_other_nvml_failures_become_probe_errors() -> None:
    nvml = FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())
    result = probe(ProbeContext(), nvml=nvml)
    assert result.gpus == ()
    assert [(e.source, e.message) for e in result.errors] == [
        ("nvidia", "NVML failed: Driver Not Loaded")
    ]


def test_live_probe_without_a_driver_is_empty_and_quick() -> None:
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    started = time.monotonic()
    assert probe(ProbeContext()) == ProbeResult()
    assert time.monotonic() - started < 2.0


@pytest.mark.gpu
def test_live_probe_on_an_nvidia_machine() -> None:
    if not Path("/dev/nvidiactl").exists():
        pytest.skip("no NVIDIA driver on this machine")
    result = probe(ProbeContext())
    assert result.errors == ()
    assert result.gpus and all(gpu.arch and gpu.arch.startswith("sm_") for gpu in result.gpus)
    assert all(gpu.vram_total_bytes and gpu.memory_bandwidth_bytes_per_s for gpu in result.gpus)
