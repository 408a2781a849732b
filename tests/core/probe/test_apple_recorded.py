"""The Apple probe on `system_profiler SPDisplaysDataType -json` as a MacBook Air M1 printed it
(tests/fixtures/probe/gpu/README.md): the real output names the GPU "kHW_AppleM1Item", which
must not become its name, and has the 7-core GPU of that machine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from hearthside.core.probe.apple import SYSCTL_COMMAND, SYSTEM_PROFILER_COMMAND, probe
from hearthside.core.probe.base import ProbeContext

pytestmark = pytest.mark.beside

M1 = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu" / "apple-m1"
# `sysctl hw.memsize machdep.cpu.brand_string` in sysctl's own format; 8 GiB, the memory of
# the 7-core-GPU MacBook Air M1 (the recording above did not include sysctl)
SYSCTL = "hw.memsize: 8589934592\nmachdep.cpu.brand_string: Apple M1\n"


def recorded_m1(command: Sequence[str]) -> str | None:
    if tuple(command) == SYSCTL_COMMAND:
        return SYSCTL
    if tuple(command) == SYSTEM_PROFILER_COMMAND:
        return (M1 / "system_profiler-recorded.json").read_text()
    return None  # `sysctl iogpu.wired_limit_mb` fails on macOS 13 and older: that is allowed


def test_a_recorded_m1_is_one_unified_gpu_with_its_cores() -> None:
    result = probe(ProbeContext(platform="darwin", machine="arm64", run_command=recorded_m1))
    (gpu,) = result.gpus
    assert (gpu.vendor, gpu.name, gpu.arch) == ("apple", "Apple M1", "apple-m1")
    assert gpu.compute_units == 7 and gpu.runtime_version == "Metal 3"
    assert gpu.unified_memory and gpu.vram_total_bytes == 8 * 2**30
    assert gpu.recommended_working_set_bytes == 8 * 2**30 * 2 // 3  # Metal's default below 32 GB
    assert gpu.memory_bandwidth_bytes_per_s == 68_250_000_000
    assert result.errors == ()
