"""Apple probe: recorded sysctl and system_profiler output → one unified-memory GpuInfo."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from hearthside.core.probe.apple import (
    SYSCTL_COMMAND,
    SYSTEM_PROFILER_COMMAND,
    WIRED_LIMIT_COMMAND,
    parse_apple,
    probe,
    recommended_working_set_bytes,
)
from hearthside.core.probe.base import CommandRunner, ProbeContext, ProbeResult, merge_results
from hearthside.core.probe.profile import GpuInfo, HardwareProfile

pytestmark = pytest.mark.beside

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu"
GIB = 1024**3

# fixture → (arch, GPU cores, memory, datasheet bandwidth GB/s, expected working set)
EXPECTED = {
    "apple-m1": ("apple-m1", 8, 16 * GIB, 68.25, 16 * GIB * 2 // 3),
    "apple-m2-max": ("apple-m2", 38, 64 * GIB, 400, 48 * GIB),
    "apple-m3-ultra": ("apple-m3", 80, 256 * GIB, 819, 240 * GIB),  # iogpu.wired_limit_mb set
    "apple-m4-pro": ("apple-m4", 20, 48 * GIB, 273, 36 * GIB),
}


def parse_fixture(name: str) -> ProbeResult:
    folder = FIXTURES / name
    return parse_apple(
        (folder / "sysctl.txt").read_text(), (folder / "system_profiler.json").read_text()
    )


def only_gpu(name: str) -> GpuInfo:
    (gpu,) = parse_fixture(name).gpus
    return gpu


GOLDEN_FIXTURES = tuple(EXPECTED)  # rewritten only by hand: `python -m tests.update_goldens`


def golden_profile(name: str) -> HardwareProfile:
    """The profile a fixture's golden.json holds (tests/update_goldens.py writes it)."""
    return merge_results([parse_fixture(name)], os="darwin", machine="arm64", source="fixture")


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_parse_matches_golden(name: str) -> None:
    golden = FIXTURES / name / "golden.json"
    assert HardwareProfile.from_json(golden.read_text()) == golden_profile(name)


@pytest.mark.parametrize("name", EXPECTED)
def test_unified_gpu_with_real_numbers(name: str) -> None:
    arch, cores, memory, bandwidth_gb_s, working_set = EXPECTED[name]
    gpu = only_gpu(name)
    assert (gpu.vendor, gpu.arch, gpu.compute_units) == ("apple", arch, cores)
    assert gpu.unified_memory and gpu.integrated
    assert gpu.vram_total_bytes == memory
    assert gpu.recommended_working_set_bytes == working_set
    assert gpu.memory_bandwidth_bytes_per_s is not None
    assert gpu.memory_bandwidth_bytes_per_s / 1e9 == pytest.approx(bandwidth_gb_s, rel=0.05)
    assert gpu.runtime_version == "Metal 3"


@pytest.mark.parametrize(
    ("memory_gib", "expected_gib"), [(8, 16 / 3), (24, 16), (32, 64 / 3), (36, 27), (128, 96)]
)
def test_default_working_set(memory_gib: int, expected_gib: float) -> None:
    found = recommended_working_set_bytes(memory_gib * GIB, 0)
    assert found is not None and found / GIB == pytest.approx(expected_gib)


def test_binned_chips_pick_bandwidth_by_gpu_cores() -> None:
    sysctl = "hw.memsize: 38654705664\nmachdep.cpu.brand_string: Apple M3 Max\n"
    profiler = '{"SPDisplaysDataType": [{"sppci_model": "Apple M3 Max", "sppci_cores": "30"}]}'
    (gpu,) = parse_apple(sysctl, profiler).gpus
    assert gpu.memory_bandwidth_bytes_per_s == 300_000_000_000


def fake_runner(name: str) -> CommandRunner:
    folder = FIXTURES / name
    lines = (folder / "sysctl.txt").read_text().splitlines(keepends=True)
    outputs = {
        SYSCTL_COMMAND: "".join(line for line in lines if not line.startswith("iogpu.")),
        WIRED_LIMIT_COMMAND: "".join(line for line in lines if line.startswith("iogpu.")),
        SYSTEM_PROFILER_COMMAND: (folder / "system_profiler.json").read_text(),
    }

    def run(command: Sequence[str]) -> str | None:
        return outputs.get(tuple(command))

    return run


def test_probe_runs_the_tools_and_parses() -> None:
    ctx = ProbeContext(platform="darwin", run_command=fake_runner("apple-m3-ultra"))
    assert probe(ctx) == parse_fixture("apple-m3-ultra")


def test_only_on_macos() -> None:
    ctx = ProbeContext(platform="linux", run_command=fake_runner("apple-m1"))
    assert probe(ctx) == ProbeResult()


def test_missing_sysctl_is_an_error() -> None:
    result = probe(ProbeContext(platform="darwin", run_command=lambda command: None))
    assert [error.source for error in result.errors] == ["apple"]


def test_intel_mac_has_no_apple_gpu() -> None:
    sysctl = "hw.memsize: 34359738368\nmachdep.cpu.brand_string: Intel(R) Core(TM) i9-9880H\n"
    assert parse_apple(sysctl, None) == ProbeResult()


def test_broken_system_profiler_output_is_an_error() -> None:
    sysctl = "hw.memsize: 17179869184\nmachdep.cpu.brand_string: Apple M1\n"
    result = parse_apple(sysctl, "not json")
    assert result.gpus == () and [error.source for error in result.errors] == ["apple"]


def test_without_system_profiler_the_gpu_is_still_known() -> None:
    sysctl = "hw.memsize: 17179869184\nmachdep.cpu.brand_string: Apple M1\n"
    (gpu,) = parse_apple(sysctl, None).gpus
    assert (gpu.name, gpu.arch, gpu.compute_units) == ("Apple M1", "apple-m1", None)
