"""CPU probe: recorded /proc + /sys trees and `sysctl -a` text from real machines, parsed and
compared with hand-checked goldens; the parsers on their own; the live machine."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from hearthside.core.probe import cpu, disks, memory
from hearthside.core.probe.base import ProbeContext, merge_results
from hearthside.core.probe.profile import CpuInfo, HardwareProfile
from tests.core.probe.recorded import recorded_context

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "cpu"
GIB = 1024**3
MIB = 1024**2

# fixture → (platform, machine) of the recorded machine
MACHINES = {
    "desktop-avx2-6core": ("linux", "x86_64"),
    "server-avx512": ("linux", "x86_64"),
    "sapphire-rapids-amx": ("linux", "x86_64"),
    "hybrid-alder-lake": ("linux", "x86_64"),
    "arm-sve-server": ("linux", "aarch64"),
    "two-socket-numa": ("linux", "x86_64"),
    "apple-m1": ("darwin", "arm64"),
    "apple-m2-max": ("darwin", "arm64"),
    "apple-m3-ultra": ("darwin", "arm64"),
    "apple-m4-pro": ("darwin", "arm64"),
}


def fixture_context(name: str) -> ProbeContext:
    platform, machine = MACHINES[name]
    return recorded_context(FIXTURES / name, platform, machine)


def fixture_profile(name: str) -> HardwareProfile:
    platform, machine = MACHINES[name]
    result = cpu.probe(fixture_context(name))
    return merge_results([result], os=platform, machine=machine, source="fixture")


def fixture_cpu(name: str) -> CpuInfo:
    return fixture_profile(name).cpu


def test_every_fixture_directory_is_listed() -> None:
    on_disk = {path.name for path in FIXTURES.iterdir() if path.is_dir()}
    assert on_disk == set(MACHINES)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_fixture_matches_its_golden_profile(name: str) -> None:
    golden = HardwareProfile.from_json((FIXTURES / name / "golden.json").read_text())
    profile = fixture_profile(name)
    assert profile.errors == ()
    assert profile == golden


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_profile_round_trips_through_json(name: str) -> None:
    profile = fixture_profile(name)
    assert HardwareProfile.from_json(profile.to_json()) == profile


def test_hybrid_alder_lake_splits_performance_and_efficiency_cores() -> None:
    info = fixture_cpu("hybrid-alder-lake")
    assert (info.performance_cores, info.efficiency_cores) == (8, 8)
    assert (info.physical_cores, info.logical_cores) == (16, 24)
    assert info.has("avx_vnni") and not info.has("avx512f")
    # 8 P cores × 1.25 MiB + 2 E clusters × 2 MiB; the shared L3 counted once
    assert info.l2_cache_bytes == 14 * MIB
    assert info.l3_cache_bytes == 30 * MIB


def test_desktop_ryzen_counts_cores_despite_gaps_in_core_ids() -> None:
    info = fixture_cpu("desktop-avx2-6core")
    assert (info.physical_cores, info.logical_cores, info.sockets) == (6, 12, 1)
    assert info.performance_cores == 6 and info.efficiency_cores == 0
    assert info.has("avx2") and info.has("fma") and not info.has("avx512f")
    assert info.l3_cache_bytes == 32 * MIB  # two CCXs of 16 MiB, not 12 × 16 MiB
    assert info.max_frequency_hz == 3_600_000_000


def test_avx512_server_has_vnni_but_no_bf16_or_amx() -> None:
    info = fixture_cpu("server-avx512")
    assert {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= set(info.flags)
    assert not info.has("avx512_bf16") and not info.has("amx_tile")
    assert (info.physical_cores, info.logical_cores) == (40, 80)


def test_sapphire_rapids_has_amx_and_avx512_bf16() -> None:
    info = fixture_cpu("sapphire-rapids-amx")
    assert {"amx_tile", "amx_int8", "amx_bf16", "avx512_bf16", "avx_vnni"} <= set(info.flags)
    assert info.l2_cache_bytes == 56 * 2 * MIB
    assert info.l3_cache_bytes == 105 * MIB


def test_graviton3_has_sve_but_not_sve2() -> None:
    info = fixture_cpu("arm-sve-server")
    assert info.arch == "arm64"
    assert (info.vendor, info.model) == ("ARM", "Neoverse-V1")
    assert info.flags == ("bf16", "dotprod", "i8mm", "neon", "sve")
    assert (info.physical_cores, info.logical_cores) == (64, 64)
    assert info.max_frequency_hz is None  # EC2 exposes no cpufreq: unknown, not zero


def test_two_socket_machine_reports_sockets_and_numa_nodes() -> None:
    info = fixture_cpu("two-socket-numa")
    assert (info.sockets, info.numa_nodes) == (2, 2)
    assert (info.physical_cores, info.logical_cores) == (24, 48)
    assert info.l3_cache_bytes == 2 * 16896 * 1024


@pytest.mark.parametrize(
    ("name", "performance", "efficiency", "l2_mib"),
    [
        ("apple-m1", 4, 4, 12 + 4),
        ("apple-m2-max", 8, 4, 2 * 16 + 4),
        ("apple-m3-ultra", 24, 8, 4 * 16 + 2 * 4),
        ("apple-m4-pro", 10, 4, 2 * 16 + 4),
    ],
)
def test_apple_core_split_and_l2_clusters(
    name: str, performance: int, efficiency: int, l2_mib: int
) -> None:
    info = fixture_cpu(name)
    assert (info.performance_cores, info.efficiency_cores) == (performance, efficiency)
    assert info.physical_cores == info.logical_cores == performance + efficiency
    assert info.l2_cache_bytes == l2_mib * MIB
    assert info.vendor == "Apple" and info.arch == "arm64"


def test_m1_lacks_i8mm_and_bf16_that_m2_has() -> None:
    assert fixture_cpu("apple-m1").flags == ("dotprod", "neon")
    assert fixture_cpu("apple-m2-max").flags == ("bf16", "dotprod", "i8mm", "neon")


# --- pure parsers ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "cpus"),
    [("0-3,8\n", {0, 1, 2, 3, 8}), ("0-15,17", set(range(16)) | {17}), ("5", {5}), ("\n", set())],
)
def test_parse_cpu_list(text: str, cpus: set[int]) -> None:
    assert cpu.parse_cpu_list(text) == cpus


@pytest.mark.parametrize(("text", "size"), [("32768K\n", 32 * MIB), ("1M", MIB), ("512", 512)])
def test_parse_cache_size(text: str, size: int) -> None:
    assert cpu.parse_cache_size(text) == size


def test_parse_cache_size_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        cpu.parse_cache_size("lots")


def test_translate_flags_keeps_known_flags_in_linux_spelling() -> None:
    raw = ["fp", "asimd", "asimddp", "svei8mm", "sve2", "avx512_vnni", "sha_ni"]
    assert cpu.translate_flags(raw) == ("avx512_vnni", "dotprod", "neon", "sve2")


def test_parse_proc_cpuinfo_arm_block_maps_part_to_core_name() -> None:
    text = (
        "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm sve2 i8mm\n"
        "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\n"
        "CPU part\t: 0xd4f\nCPU revision\t: 0\n"
    )
    summary = cpu.parse_proc_cpuinfo(text)
    assert (summary.vendor, summary.model) == ("ARM", "Neoverse-V2")
    assert summary.flags == ("i8mm", "neon", "sve2")
    assert summary.processors == 1 and summary.physical_cores is None


def test_parse_proc_cpuinfo_counts_cores_without_sysfs() -> None:
    block = "processor\t: {n}\nphysical id\t: 0\ncore id\t\t: {core}\nflags\t\t: avx2\n"
    text = "\n".join(block.format(n=n, core=n % 2) for n in range(4))
    summary = cpu.parse_proc_cpuinfo(text)
    assert (summary.processors, summary.physical_cores, summary.sockets) == (4, 2, 1)


def test_parse_sysctl_keeps_values_with_colons() -> None:
    values = cpu.parse_sysctl("kern.version: Darwin Kernel Version 24.1.0: Thu\nhw.ncpu: 8\n")
    assert values == {"kern.version": "Darwin Kernel Version 24.1.0: Thu", "hw.ncpu": "8"}


# --- what the probe does when inputs are missing ----------------------------------------------


def test_linux_probe_on_an_empty_root_reports_an_error_instead_of_raising(tmp_path: Path) -> None:
    result = cpu.probe(ProbeContext(root=tmp_path, platform="linux", machine="x86_64"))
    assert result.cpu == CpuInfo(arch="x86_64")
    assert [error.source for error in result.errors] == ["cpu"]


def test_linux_probe_falls_back_to_cpuinfo_when_sysfs_is_hidden(tmp_path: Path) -> None:
    source = FIXTURES / "desktop-avx2-6core" / "proc" / "cpuinfo"
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(source.read_text())
    info = cpu.probe(ProbeContext(root=tmp_path, platform="linux", machine="x86_64")).cpu
    assert info is not None
    assert (info.physical_cores, info.logical_cores, info.sockets) == (6, 12, 1)
    assert info.l3_cache_bytes is None and info.numa_nodes is None


def test_darwin_probe_without_sysctl_reports_an_error() -> None:
    ctx = ProbeContext(platform="darwin", machine="arm64", run_command=lambda command: None)
    result = cpu.probe(ctx)
    assert result.cpu == CpuInfo(arch="arm64") and result.errors


def test_other_systems_fall_back_to_psutil() -> None:
    info = cpu.probe(ProbeContext(platform="win32", machine="AMD64")).cpu
    assert info is not None and info.arch == "x86_64"
    assert info.logical_cores == psutil.cpu_count(logical=True)


# --- the live machine -----------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads this Linux box's /proc")
def test_live_machine_probe_agrees_with_the_os_and_is_fast(tmp_path: Path) -> None:
    """On the dev box: 2 logical cores, avx2, ~23.5 GiB, one ext4 disk."""
    ctx = ProbeContext(models_dir=tmp_path)
    started = time.perf_counter()
    results = [module.probe(ctx) for module in (cpu, memory, disks)]
    elapsed_s = time.perf_counter() - started
    profile = merge_results(results, os="linux", machine=ctx.machine)

    assert elapsed_s < 1.0
    assert profile.errors == ()
    assert profile.cpu.logical_cores == os.cpu_count()
    cpuinfo_words = Path("/proc/cpuinfo").read_text().split()
    assert profile.cpu.has("avx2") == ("avx2" in cpuinfo_words)
    assert profile.memory.total_bytes == psutil.virtual_memory().total
    assert [disk.path for disk in profile.disks] == [str(tmp_path)]
    assert profile.disks[0].free_bytes is not None and profile.disks[0].mount_point is not None
