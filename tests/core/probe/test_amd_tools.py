"""The AMD probe reads what amd-smi and rocm-smi really print (tests/fixtures/probe/gpu/README.md
says where each recording comes from), and the hand-written sysfs fixtures agree with them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from hearthside.app.engine_cli import gpu_target
from hearthside.core.probe.amd import (
    AMD_SMI_COMMAND,
    ROCM_SMI_COMMAND,
    gfx_name,
    gfx_target_version,
    parse_rocm_smi,
    probe,
    read_amd_sysfs,
)
from hearthside.core.probe.base import ProbeContext, ProbeResult
from hearthside.core.probe.engine_build import choose_build

pytestmark = pytest.mark.beside

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu"
MIB = 2**20


def replaying(tmp_path: Path, outputs: dict[tuple[str, ...], Path]) -> ProbeContext:
    """A Linux machine whose /sys shows no KFD topology (tmp_path is an empty root) and whose
    tools print the recorded files."""

    def run(command: Sequence[str]) -> str | None:
        path = outputs.get(tuple(command))
        return path.read_text() if path else None

    return ProbeContext(root=tmp_path, platform="linux", run_command=run)


def probe_with(tmp_path: Path, **files: Path) -> ProbeResult:
    commands = {"amd_smi": AMD_SMI_COMMAND, "rocm_smi": ROCM_SMI_COMMAND}
    return probe(replaying(tmp_path, {commands[tool]: path for tool, path in files.items()}))


def test_an_mi300x_from_amd_smi(tmp_path: Path) -> None:
    result = probe_with(tmp_path, amd_smi=FIXTURES / "mi300x" / "amd-smi-static.json")
    (gpu,) = result.gpus
    assert (gpu.vendor, gpu.name, gpu.arch) == ("amd", "AMD Instinct MI300X", "gfx942")
    assert gpu.vram_total_bytes == 196592 * MIB and gpu.compute_units == 304
    assert (gpu.pcie_generation, gpu.pcie_width, gpu.pci_bus_id) == (5, 16, "0000:05:00.0")
    assert gpu.memory_bandwidth_bytes_per_s == 5_300_000_000_000  # the part table, by device id
    assert not gpu.unified_memory and result.errors == ()


def test_the_ladder_builds_hip_for_what_amd_smi_reported(tmp_path: Path) -> None:
    result = probe_with(tmp_path, amd_smi=FIXTURES / "mi300x" / "amd-smi-static.json")
    build = choose_build(
        [gpu_target(gpu) for gpu in result.gpus], platform="linux", machine="x86_64"
    )
    assert build.backend == "hip" and "-DGPU_TARGETS=gfx942" in build.cmake_args


def test_an_amd_smi_without_gfx_targets_gives_way_to_rocm_smi(tmp_path: Path) -> None:
    """`amd-smi static -B -b` on an MI50 names the board ("deon Instinct MI50 32GB", as
    printed) but no gfx target; rocm-smi's "GFX Version" does."""
    result = probe_with(
        tmp_path,
        amd_smi=FIXTURES / "mi50" / "amd-smi-static-bus-board.json",
        rocm_smi=FIXTURES / "mi50" / "rocm-smi.json",
    )
    (gpu,) = result.gpus
    assert (gpu.name, gpu.arch, gpu.pci_bus_id) == ("AMD Instinct MI50", "gfx906", "0000:c5:00.0")
    assert gpu.vram_total_bytes is None  # that recording did not ask for memory
    build = choose_build([gpu_target(gpu)], platform="linux", machine="x86_64")
    assert "-DGPU_TARGETS=gfx906" in build.cmake_args
    assert any("6.3" in warning for warning in build.warnings)


def test_output_that_is_not_json_is_an_error_naming_the_tool(tmp_path: Path) -> None:
    noise = tmp_path / "noise.txt"
    noise.write_text("WARNING: AMD GPU device(s) is/are in a low-power state\n")
    result = probe_with(tmp_path / "root", amd_smi=noise)
    assert result.gpus == () and "amd-smi output" in result.errors[0].message


def test_no_tools_and_no_kfd_is_no_amd_gpu(tmp_path: Path) -> None:
    assert probe_with(tmp_path) == ProbeResult()


@pytest.mark.parametrize(
    ("file", "arch", "name", "vram_bytes"),
    [
        # older rocm-smi spells KFD's number in decimal: gfx9010 is the MI250X's gfx90a
        ("rocm-smi-mi250x.json", "gfx90a", "AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2", None),
        ("rocm-smi-rx7900xt.json", "gfx1100", "Radeon RX 7900 XT", 21458059264),
    ],
)
def test_real_rocm_smi_outputs(file: str, arch: str, name: str, vram_bytes: int | None) -> None:
    (record,) = parse_rocm_smi((FIXTURES / "amd-tool-output" / file).read_text())
    assert gfx_name(record["gfx_target_version"]) == arch
    assert record["product_name"] == name and record.get("vram_total_bytes") == vram_bytes


@pytest.mark.parametrize(
    ("spelled", "arch"),
    [
        ("gfx906", "gfx906"),
        ("gfx942", "gfx942"),
        ("gfx90a", "gfx90a"),
        ("gfx1100", "gfx1100"),
        ("gfx1151", "gfx1151"),
        ("gfx9010", "gfx90a"),  # rocm-smi 6.x, an MI250X
        ("gfx11001", "gfx1101"),  # rocm-smi 6.2, an RX 7800 XT
        ("gfx9006", "gfx906"),
    ],
)
def test_gfx_spellings(spelled: str, arch: str) -> None:
    version = gfx_target_version(spelled)
    assert version is not None and gfx_name(version) == arch


def test_the_sysfs_fixtures_agree_with_the_real_tools() -> None:
    """The sysfs trees were written by hand; the tools' figures come from real machines."""
    (mi300x,) = read_amd_sysfs(FIXTURES / "mi300x")
    assert mi300x["vram_total_bytes"] == 196592 * MIB  # amd-smi's (and rocminfo's) 196592 MiB
    assert (mi300x["device_id"], gfx_name(mi300x["gfx_target_version"])) == (0x74A1, "gfx942")
    (mi50,) = read_amd_sysfs(FIXTURES / "mi50")
    (recorded,) = parse_rocm_smi((FIXTURES / "mi50" / "rocm-smi.json").read_text())
    assert (mi50["device_id"], mi50["gfx_target_version"]) == (
        recorded["device_id"],
        recorded["gfx_target_version"],
    )
