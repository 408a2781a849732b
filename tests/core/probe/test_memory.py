"""Memory probe: recorded /proc/meminfo + cgroup files and Mac `sysctl -a` text, compared with
hand-checked goldens; cgroup limits honoured only when they bind, found from the process's own
cgroup (v1, v2, hybrid, a container's mount) up to the top; the parsers on their own; and the
probe run inside a real cgroup with a memory limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hearthside.core.probe import memory
from hearthside.core.probe.base import ProbeContext, merge_results
from hearthside.core.probe.profile import HardwareProfile, MemoryInfo
from tests.cgroup_limit import memory_limited_cgroup
from tests.core.probe.recorded import recorded_context

pytestmark = pytest.mark.beside

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "memory"
GIB = 1024**3
MIB = 1024**2
KIB = 1024

# fixture → (platform, machine) of the recorded machine
MACHINES = {
    "plain-host": ("linux", "x86_64"),
    "cgroup-v2-container": ("linux", "x86_64"),
    "cgroup-v1-container": ("linux", "x86_64"),
    "cgroup-v1-nested": ("linux", "x86_64"),
    "cgroup-v2-nested": ("linux", "x86_64"),
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


def test_a_nested_v1_cgroup_is_bound_by_its_parents_smaller_limit() -> None:
    info = fixture_profile("cgroup-v1-nested").memory
    assert info.cgroup_limit_bytes == 1 * GIB  # /hs-fixture; its child /hs-fixture/inner has 1.5
    # what is left under the parent's limit: limit - usage + inactive file cache
    assert info.available_bytes == 1 * GIB - 269066240 + 100663296
    assert info.total_bytes == 24683584 * KIB  # MemAvailable (24 GB) is not what may be used


def test_a_nested_v2_cgroup_is_bound_by_its_slices_limit() -> None:
    info = fixture_profile("cgroup-v2-nested").memory
    assert info.cgroup_limit_bytes == 6 * GIB  # app.slice; the scope's own 12 GiB does not bind
    assert info.available_bytes == 6 * GIB - 2560 * MIB + 512 * MIB


V1_MOUNT = "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
V2_MOUNT = "30 23 0:26 / {point} rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw\n"


def test_a_container_mount_showing_its_own_cgroup_is_read_at_its_top(tmp_path: Path) -> None:
    # Docker on v1 without a cgroup namespace: /proc/self/cgroup names the host's path, the
    # mount shows that cgroup as its top
    ctx = write_tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "12:memory:/docker/3f2a9c\n",
            "proc/self/mountinfo": V1_MOUNT.format(root="/docker/3f2a9c"),
            "sys/fs/cgroup/memory/memory.limit_in_bytes": f"{2 * GIB}\n",
            "sys/fs/cgroup/memory/memory.usage_in_bytes": f"{GIB // 2}\n",
            "sys/fs/cgroup/memory/memory.stat": "inactive_file 0\ntotal_inactive_file 4096\n",
        },
    )
    info = memory.probe(ctx).memory
    assert info.cgroup_limit_bytes == 2 * GIB
    assert info.available_bytes == 2 * GIB - GIB // 2 + 4096


def test_a_cgroup_path_missing_under_the_mount_falls_back_to_its_top(tmp_path: Path) -> None:
    # a cgroup namespace: the path is the host's, the mount is the namespace's own cgroup
    ctx = write_tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "0::/system.slice/docker-3f2a9c.scope\n",
            "proc/self/mountinfo": V2_MOUNT.format(point="/sys/fs/cgroup"),
            "sys/fs/cgroup/memory.max": f"{3 * GIB}\n",
        },
    )
    info = memory.probe(ctx).memory
    assert info.cgroup_limit_bytes == 3 * GIB
    assert info.available_bytes == 12000000 * KIB  # no usage file: MemAvailable stands


def test_a_hybrid_machine_reads_v1s_memory_controller_not_the_unified_tree(
    tmp_path: Path,
) -> None:
    ctx = write_tree(
        tmp_path,
        {
            "proc/meminfo": MEMINFO,
            "proc/self/cgroup": "4:memory:/jobs/42\n0::/\n",
            "proc/self/mountinfo": V1_MOUNT.format(root="/")
            + V2_MOUNT.format(point="/sys/fs/cgroup/unified"),
            "sys/fs/cgroup/unified/cgroup.procs": "1\n",
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "sys/fs/cgroup/memory/jobs/42/memory.limit_in_bytes": f"{GIB}\n",
            "sys/fs/cgroup/memory/jobs/42/memory.usage_in_bytes": f"{GIB + 4096}\n",
        },
    )
    info = memory.probe(ctx).memory
    assert info.cgroup_limit_bytes == GIB
    assert info.available_bytes == 0  # v1 usage may run a page or so over the limit


def test_the_probe_reports_the_limit_of_the_cgroup_it_runs_in() -> None:
    limit = 1536 * MIB
    with memory_limited_cgroup(limit) as cgroup:
        result = cgroup.run([sys.executable, "-m", "hearthside.core.probe"], timeout=60)
    assert result.returncode == 0, result.stderr
    info = HardwareProfile.from_json(result.stdout).memory
    assert info.cgroup_limit_bytes == limit
    # the probe's own Python is charged to the cgroup, so less than the limit is left
    assert info.available_bytes is not None and 0 < info.available_bytes < limit


def test_a_child_probe_reports_the_limit_of_the_cgroup_it_shares_with_us() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hearthside.core.probe"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    info = HardwareProfile.from_json(result.stdout).memory
    ours = memory.read_cgroup_memory(ProbeContext()).limit_bytes
    assert info.cgroup_limit_bytes == memory.effective_cgroup_limit(ours, info.total_bytes)


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


def test_parse_proc_self_cgroup_finds_v2_and_v1_memory() -> None:
    text = (
        "12:memory,hugetlb:/docker/3f2a9c\n"
        "4:cpu,cpuacct:/docker/3f2a9c\n"
        "1:name=systemd:/docker/3f2a9c\n"
        "0::/system.slice/docker-3f2a9c.scope\n"
    )
    assert memory.parse_proc_self_cgroup(text) == {
        1: "/docker/3f2a9c",
        2: "/system.slice/docker-3f2a9c.scope",
    }
    assert memory.parse_proc_self_cgroup("0::/\n") == {2: "/"}
    assert memory.parse_proc_self_cgroup("garbage\n") == {}


def test_parse_cgroup_mounts_keeps_cgroup2_and_v1_memory_only() -> None:
    text = (
        "22 1 259:3 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p3 rw\n"
        "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
        "1290 1283 0:32 /docker/3f2a9c /sys/fs/cgroup/memory ro,nosuid,nodev,noexec,relatime "
        "master:15 - cgroup cgroup rw,memory\n"
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
        "50 31 0:40 / /mnt/my\\040cgroups rw - cgroup2 none rw\n"
    )
    assert memory.parse_cgroup_mounts(text) == (
        memory.CgroupMount(1, "/sys/fs/cgroup/memory", "/docker/3f2a9c"),
        memory.CgroupMount(2, "/sys/fs/cgroup/unified", "/"),
        memory.CgroupMount(2, "/mnt/my cgroups", "/"),
    )


@pytest.mark.parametrize(
    ("root", "path", "chain"),
    [
        ("/", "/", ["/sys/fs/cgroup"]),
        ("/", "/a/b", ["/sys/fs/cgroup/a/b", "/sys/fs/cgroup/a", "/sys/fs/cgroup"]),
        ("/docker/3f", "/docker/3f/x", ["/sys/fs/cgroup/x", "/sys/fs/cgroup"]),
        ("/docker/3f", "/system.slice", ["/sys/fs/cgroup"]),  # outside what the mount shows
    ],
)
def test_cgroup_chain_runs_from_the_process_up_to_the_mount(
    root: str, path: str, chain: list[str]
) -> None:
    assert memory.cgroup_chain(memory.CgroupMount(2, "/sys/fs/cgroup", root), path) == chain


def test_the_least_headroom_wins_not_the_smallest_limits() -> None:
    roomy_but_full = memory.CgroupLevel(4 * GIB, usage_bytes=4 * GIB - 100 * MIB)
    tight_but_empty = memory.CgroupLevel(2 * GIB, usage_bytes=0)
    combined = memory.combine_levels([roomy_but_full, tight_but_empty])
    assert combined == memory.CgroupMemory(limit_bytes=2 * GIB, available_bytes=100 * MIB)
    assert memory.combine_levels([]) == memory.CgroupMemory()


def test_parse_swap_usage() -> None:
    line = "vm.swapusage: total = 2048.00M  used = 1035.25M  free = 1012.75M  (encrypted)"
    assert memory.parse_swap_usage(line) == (2 * GIB, round(1012.75 * 1024**2))


def test_other_systems_use_psutil_only_on_the_live_machine(tmp_path: Path) -> None:
    recorded = memory.probe(ProbeContext(root=tmp_path, platform="win32"))
    assert recorded.memory == MemoryInfo()
