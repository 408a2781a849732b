"""AMD probe: recorded amdgpu sysfs trees (KFD topology + DRM cards) → GpuInfo."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthside.core.probe.amd import (
    gfx_name,
    parse_amd_records,
    parse_kfd_properties,
    probe,
    read_amd_sysfs,
)
from hearthside.core.probe.base import ProbeContext, ProbeResult, merge_results
from hearthside.core.probe.profile import GpuInfo, HardwareProfile

pytestmark = pytest.mark.beside

FIXTURES = Path(__file__).parents[2] / "fixtures" / "probe" / "gpu"
GIB = 1024**3

# fixture → [(arch, compute units, datasheet bandwidth in GB/s or None)] per GPU, in order
EXPECTED: dict[str, list[tuple[str, int, int | None]]] = {
    "mi50": [("gfx906", 60, 1024)],
    "mi300x": [("gfx942", 304, 5300)],
    "rx-7900-xtx": [("gfx1100", 96, 960)],
    "radeon-ai-pro-r9700": [("gfx1201", 64, 640)],
    "strix-halo": [("gfx1151", 40, 256)],
    "igpu-plus-dgpu": [("gfx1100", 96, 960), ("gfx1103", 12, None)],
}


def fixture_context(name: str) -> ProbeContext:
    return ProbeContext(root=FIXTURES / name, platform="linux")


def gpus(name: str) -> tuple[GpuInfo, ...]:
    return probe(fixture_context(name)).gpus


GOLDEN_FIXTURES = tuple(EXPECTED)  # rewritten only by hand: `python -m tests.update_goldens`


def golden_profile(name: str) -> HardwareProfile:
    """The profile a fixture's golden.json holds (tests/update_goldens.py writes it)."""
    return merge_results([probe(fixture_context(name))], os="linux", source="fixture")


@pytest.mark.parametrize("name", GOLDEN_FIXTURES)
def test_probe_matches_golden(name: str) -> None:
    result = probe(fixture_context(name))
    golden = FIXTURES / name / "golden.json"
    assert HardwareProfile.from_json(golden.read_text()) == golden_profile(name)
    assert result.errors == () and result.unsupported == ()


@pytest.mark.parametrize("name", EXPECTED)
def test_arch_compute_units_and_bandwidth(name: str) -> None:
    found = gpus(name)
    assert [(gpu.arch, gpu.compute_units) for gpu in found] == [
        (arch, cus) for arch, cus, _ in EXPECTED[name]
    ]
    for gpu, (_, _, datasheet_gb_s) in zip(found, EXPECTED[name], strict=True):
        if datasheet_gb_s is None:
            assert gpu.memory_bandwidth_bytes_per_s is None
        else:
            assert gpu.memory_bandwidth_bytes_per_s is not None
            assert gpu.memory_bandwidth_bytes_per_s / 1e9 == pytest.approx(datasheet_gb_s, rel=0.05)


def test_gfx906_stays_usable() -> None:
    (mi50,) = gpus("mi50")
    assert mi50.name == "AMD Instinct MI50"
    assert mi50.vram_total_bytes is not None and 31 * GIB < mi50.vram_total_bytes <= 32 * GIB


def test_mi300x_has_192_gb() -> None:
    (mi300x,) = gpus("mi300x")
    assert mi300x.vram_total_bytes is not None and 190 * GIB < mi300x.vram_total_bytes <= 192 * GIB
    assert (mi300x.pcie_generation, mi300x.pcie_width) == (5, 16)


def test_discrete_cards_are_not_unified() -> None:
    for name in ("mi50", "mi300x", "rx-7900-xtx", "radeon-ai-pro-r9700"):
        assert all(not gpu.unified_memory and not gpu.integrated for gpu in gpus(name))


def test_strix_halo_is_unified_and_counts_gtt() -> None:
    (halo,) = gpus("strix-halo")
    assert halo.unified_memory and halo.integrated
    # 512 MiB carve-out + the GTT the kernel allows, not the carve-out alone
    assert halo.vram_total_bytes is not None and halo.vram_total_bytes > 60 * GIB
    assert halo.pcie_generation is None


def test_igpu_plus_dgpu() -> None:
    dgpu, igpu = gpus("igpu-plus-dgpu")
    assert (dgpu.index, igpu.index) == (0, 1)
    assert not dgpu.integrated and not dgpu.unified_memory
    assert igpu.integrated and igpu.unified_memory
    assert dgpu.name == "AMD Radeon RX 7900 XTX"
    assert (dgpu.pci_bus_id, igpu.pci_bus_id) == ("0000:03:00.0", "0000:0e:00.0")


@pytest.mark.parametrize(
    ("version", "name"),
    [
        (80003, "gfx803"),
        (90006, "gfx906"),
        (90010, "gfx90a"),
        (90012, "gfx90c"),
        (90402, "gfx942"),
        (110000, "gfx1100"),
        (110003, "gfx1103"),
        (110501, "gfx1151"),
        (120001, "gfx1201"),
    ],
)
def test_gfx_name(version: int, name: str) -> None:
    assert gfx_name(version) == name


def test_kfd_properties_parse() -> None:
    text = "cpu_cores_count 0\nsimd_count 192\nunique_id 2812683464735458911\nbogus\n"
    assert parse_kfd_properties(text) == {
        "cpu_cores_count": 0,
        "simd_count": 192,
        "unique_id": 2812683464735458911,
    }


def test_cpu_nodes_are_skipped() -> None:
    records = read_amd_sysfs(FIXTURES / "rx-7900-xtx")
    assert [record["gfx_target_version"] for record in records] == [110000]


def test_gcn4_and_older_are_unsupported_with_a_reason(tmp_path: Path) -> None:
    node = tmp_path / "sys/class/kfd/kfd/topology/nodes/1"
    node.mkdir(parents=True)
    (node / "properties").write_text(
        "simd_count 144\nsimd_per_cu 4\ngfx_target_version 80003\nvendor_id 4098\n"
        "device_id 26591\ndrm_render_minor 128\n"
    )
    result = probe(ProbeContext(root=tmp_path, platform="linux"))
    assert result.gpus == ()
    (rx580,) = result.unsupported
    assert "gfx803" in rx580.reason and "0x67df" in rx580.name


def test_unknown_part_gets_a_descriptive_name() -> None:
    record = {
        "gfx_target_version": 110001,
        "simd_count": 120,
        "simd_per_cu": 2,
        "device_id": 0x7448,
    }
    (gpu,) = parse_amd_records([record]).gpus
    assert gpu.name == "AMD GPU gfx1101 (device 0x7448)"
    assert gpu.vram_total_bytes is None and gpu.memory_bandwidth_bytes_per_s is None


def test_unreadable_topology_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "sys/class/kfd/kfd/topology/nodes/1").mkdir(parents=True)
    result = probe(ProbeContext(root=tmp_path, platform="linux"))
    assert [error.source for error in result.errors] == ["amd"]


def test_other_platforms_and_machines_without_kfd_are_empty(tmp_path: Path) -> None:
    assert probe(ProbeContext(root=FIXTURES / "mi50", platform="darwin")) == ProbeResult()
    assert probe(ProbeContext(root=tmp_path, platform="linux")) == ProbeResult()


def test_live_probe_here_is_empty() -> None:
    if Path("/sys/class/kfd/kfd/topology/nodes").is_dir():
        pytest.skip("this machine has an amdgpu KFD")
    assert probe(ProbeContext(platform="linux")) == ProbeResult()
