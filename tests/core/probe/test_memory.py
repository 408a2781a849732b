"""Memory probe: recorded /proc/meminfo + cgroup files and Mac `sysctl -a` text, compared with
hand-checked goldens; cgroup limits honoured only when they bind; the parsers on their own."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.core.probe import memory
from hearthside.core.probe.base import ProbeContext, merge_results
from hearthside.core.probe.profile import HardwareProfile, MemoryInfo
from tests.core.probe.recorded import recorded_context

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "memory"
GIB = 1024**3
KIB = 1024

# fixture → (platform, machine) of the recorded machine
MACHINES = {
    "plain-host": ("linux", "x86_64"),
    "cgroup-v2-container": ("linux", "x86_64"),
    "cgroup-v1-container": ("linux", "x86_64"),
    "mac-m1-16gb": ("darwin", "arm64"),
}


def fixture_context(name: str) -> ProbeContext:
    platform, machine = MACHINES[name]
    return recorded_context(FIXTURES / name, platform, machine)


def fixture_profile(name: str) -> HardwareProfile:
    platform, machine = MACHINES[name]
    result = memory.probe(fixture_context(name))
    return merge_results([result], os=platform, machine=machine, source="fixture")


def write_tree(root: Path, files: dict[str, str]) -> ProbeContext:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return ProbeContext(root=root, platform="linux", machine="x86_64")


def test_every_fixture_directory_is_listed() -> None:
    assert {path.name for path in FIXTURES.iterdir() if path.is_dir()} == set(MACHINES)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_fixture_matches_its_golden_profile(name: str) -> None:
    golden = HardwareProfile.from_json((FIXTURES / name / "golden.json").read_text())
    profile = fixture_profile(name)
    assert profile.errors == ()
    assert profile == golden
    assert HardwareProfile.from_json(profile.to_json()) == profile


def test_plain_host_reads_meminfo_in_bytes_without_a_limit() -> None:
    info = fixture_profile("plain-host").memory
    assert info.total_bytes == 65781980 * KIB
    assert info.available_bytes == 57731364 * KIB
    assert (info.swap_total_bytes, info.swap_free_bytes) == (8388604 * KIB, 8388604 * KIB)
    assert info.cgroup_limit_bytes is None
    assert info.bandwidth_bytes_per_s is None


def test_cgroup_v2_limit_is_honoured() -> None:
    info = fixture_profile("cgroup-v2-container").memory
    assert info.cgroup_limit_bytes == 8 * GIB
    assert info.usable_bytes == 8 * GIB
    assert info.total_bytes is not None and info.total_bytes > 100 * GIB  # the host's RAM


def test_cgroup_v1_limit_is_honoured() -> None:
    info = fixture_profile("cgroup-v1-container").memory
    assert info.cgroup_limit_bytes == 4 * GIB
    assert info.usable_bytes == 4 * GIB


def test_mac_reads_memsize_and_swap_but_not_available_from_a_recording() -> None:
    info = fixture_profile("mac-m1-16gb").memory
    assert info.total_bytes == 16 * GIB
    assert info.available_bytes is None  # psutil would describe this machine, not the Mac
    assert info.swap_total_bytes == 2 * GIB


MEMINFO = "MemTotal:       16000000 kB\nMemAvailable:   12000000 kB\n"


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("sys/fs/cgroup/memory.max", "max\n"),
        ("sys/fs/cgroup/memory.max", "34359738368\n"),  # 32 GiB: above the 15 GiB of RAM
        ("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n"),
    ],
)
def test_a_limit_that_does_not_bind_is_not_reported(tmp_path: Path, path: str, text: str) -> None:
    ctx = write_tree(tmp_path, {"proc/meminfo": MEMINFO, path: text})
    info = memory.probe(ctx).memory
    assert info == MemoryInfo(total_bytes=16000000 * KIB, available_bytes=12000000 * KIB)


def test_missing_meminfo_is_an_error_not_an_exception(tmp_path: Path) -> None:
    result = memory.probe(ProbeContext(root=tmp_path, platform="linux"))
    assert result.memory == MemoryInfo()
    assert [error.source for error in result.errors] == ["memory"]


def test_parse_meminfo_ignores_lines_without_kb() -> None:
    parsed = memory.parse_meminfo("MemTotal:       24683656 kB\nHugePages_Total:       0\n")
    assert parsed.total_bytes == 24683656 * KIB and parsed.available_bytes is None


@pytest.mark.parametrize(
    ("text", "limit"),
    [("max\n", None), ("8589934592\n", 8 * GIB), ("9223372036854771712", None), ("", None)],
)
def test_parse_cgroup_limit(text: str, limit: int | None) -> None:
    assert memory.parse_cgroup_limit(text) == limit


def test_parse_swap_usage() -> None:
    line = "vm.swapusage: total = 2048.00M  used = 1035.25M  free = 1012.75M  (encrypted)"
    assert memory.parse_swap_usage(line) == (2 * GIB, round(1012.75 * 1024**2))


def test_other_systems_use_psutil_only_on_the_live_machine(tmp_path: Path) -> None:
    recorded = memory.probe(ProbeContext(root=tmp_path, platform="win32"))
    assert recorded.memory == MemoryInfo()
