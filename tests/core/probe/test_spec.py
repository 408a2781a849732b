"""What-if hardware specs: the catalog, expansion into a HardwareProfile, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hearthside.core.probe.profile import HardwareProfile
from hearthside.core.probe.spec import SpecError, expand_spec, load_catalog, load_spec

pytestmark = pytest.mark.beside

SPECS = Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "specs"
GIB = 2**30
REQUIRED_SLUGS = {
    "v100-32gb", "t4", "a100-40gb", "a100-80gb", "rtx-3090", "rtx-4090", "h100-sxm", "h200",
    "b200", "rtx-5090", "gb10", "gh200", "mi50-32gb", "radeon-vii", "mi300x", "rx-7900-xtx",
    "radeon-ai-pro-r9700", "strix-halo-395", "apple-m1", "apple-m2-max", "apple-m3-ultra",
    "apple-m4-pro",
}  # fmt: skip


def test_catalog_has_the_required_gpus_with_sane_numbers() -> None:
    catalog = load_catalog()
    assert not REQUIRED_SLUGS - set(catalog)
    for entry in catalog.values():
        assert entry.vram_bytes >= 16 * GIB
        assert 50e9 < entry.memory_bandwidth_bytes_per_s < 10e12
        assert entry.vendor in ("nvidia", "amd", "apple")
    assert catalog["h100-sxm"].arch == "sm_90"
    assert catalog["gb10"].arch == "sm_121" and catalog["gb10"].unified_memory
    assert catalog["mi50-32gb"].arch == "gfx906"
    assert catalog["mi300x"].vram_bytes == 192 * GIB


def test_two_rtx_3090s() -> None:
    profile = load_spec(SPECS / "two-rtx-3090.json")
    assert profile.source == "spec"
    assert [gpu.index for gpu in profile.gpus] == [0, 1]
    for gpu in profile.gpus:
        assert gpu.arch == "sm_86"
        assert gpu.vram_total_bytes == gpu.vram_free_bytes == 24 * GIB
        assert gpu.memory_bandwidth_bytes_per_s == 936_000_000_000
    assert profile.memory.total_bytes == 64 * GIB
    assert profile.cpu.physical_cores == 6 and profile.cpu.logical_cores == 12
    assert profile.cpu.has("avx2")
    assert profile.disks[0].read_bytes_per_s == 3_500_000_000
    assert profile.engine is not None
    assert profile.engine.backends == ("CUDA", "CPU")
    assert [d.name for d in profile.engine.devices] == ["CUDA0", "CUDA1", "CPU"]


@pytest.mark.parametrize("name", sorted(p.name for p in SPECS.glob("*.json")))
def test_expansions_match_their_goldens(name: str) -> None:
    profile = load_spec(SPECS / name)
    golden = HardwareProfile.from_json((SPECS / "expanded" / name).read_text())
    assert profile == golden
    assert HardwareProfile.from_json(profile.to_json()) == profile


def test_unified_memory_machines_take_their_memory_from_the_spec() -> None:
    mac = load_spec(SPECS / "mac-m3-ultra.json")
    (gpu,) = mac.gpus
    assert mac.os == "darwin" and mac.cpu.arch == "arm64"
    assert gpu.vram_total_bytes == 256 * GIB and gpu.unified_memory
    assert gpu.recommended_working_set_bytes == 192 * GIB
    spark = load_spec(SPECS / "dgx-spark-gb10.json")
    assert spark.memory.total_bytes == 128 * GIB  # the catalog's size when the spec omits it
    assert spark.cpu.arch == "aarch64"


def _error_for(spec: Any) -> str:
    with pytest.raises(SpecError) as caught:
        expand_spec(spec)
    return caught.value.user_text()


def test_an_unknown_gpu_lists_close_matches() -> None:
    message = _error_for({"gpus": [{"model": "rtx3090", "count": 2}], "memory_gb": 64})
    assert "unknown GPU model 'rtx3090'" in message
    assert "Did you mean rtx-3090" in message


def test_every_problem_is_reported_at_once() -> None:
    message = _error_for(
        {
            "schema": 2,
            "gpus": [{"model": "h100-sxm", "count": 0}],
            "cpu": {"cores": "six", "flags": ["avx3"]},
            "os": "beos",
            "colour": "red",
        }
    )
    for expected in (
        "Unknown key 'colour'",
        "Unsupported spec schema 2",
        "'count' must be a whole number",
        "'memory_gb' is required",
        "cpu: 'cores' must be a whole number",
        "unknown flag 'avx3'",
        "'os' must be one of",
    ):
        assert expected in message


def test_not_an_object_and_soc_counts() -> None:
    assert "must be a JSON object" in _error_for([1, 2])
    assert "'count' must be 1" in _error_for({"gpus": [{"model": "apple-m4-pro", "count": 2}]})


def test_load_spec_reports_bad_json(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"gpus": [')
    with pytest.raises(SpecError, match="not valid JSON"):
        load_spec(broken)
    with pytest.raises(SpecError, match="Cannot read"):
        load_spec(tmp_path / "missing.json")


def test_golden_files_are_plain_json() -> None:
    for path in (SPECS / "expanded").glob("*.json"):
        assert json.loads(path.read_text())["source"] == "spec"
