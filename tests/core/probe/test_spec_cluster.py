"""Cluster specs: several identical nodes and their links, backward compatible with plain specs."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from hearthside.core.probe.spec import (
    SpecError,
    expand_cluster_spec,
    expand_spec,
    load_cluster_spec,
    load_spec,
)

pytestmark = pytest.mark.beside

ASSETS = Path(str(resources.files("hearthside.assets")))
SPECS = Path(__file__).resolve().parents[2] / "fixtures" / "probe" / "specs"
GIB = 2**30


def test_a_plain_spec_is_one_node_over_pcie() -> None:
    cluster = load_cluster_spec(SPECS / "two-rtx-3090.json")
    assert cluster.nodes == 1 and cluster.gpus_per_node == 2
    assert cluster.gpu_link == "pcie" and cluster.network is None
    assert cluster.node == load_spec(SPECS / "two-rtx-3090.json")


def test_a_system_on_chip_defaults_to_a_unified_link() -> None:
    assert load_cluster_spec(SPECS / "dgx-spark-gb10.json").gpu_link == "unified"


def test_the_dgx_spark_pair_is_two_nodes_over_200_gbe() -> None:
    cluster = load_cluster_spec(ASSETS / "hardware-example-2x-dgx-spark.json")
    assert cluster.nodes == 2 and cluster.gpus_per_node == 1
    assert cluster.network_bytes_per_s == 25_000_000_000
    assert cluster.network is not None and "200" in cluster.network
    gpu = cluster.node.gpus[0]
    assert gpu.arch == "sm_121" and gpu.unified_memory
    assert gpu.vram_total_bytes == cluster.node.memory.total_bytes == 128 * GIB


@pytest.mark.parametrize("name", ["2x-rtx-3090", "8x-h100", "2x-dgx-spark"])
def test_the_shipped_examples_load_as_plain_profiles_too(name: str) -> None:
    path = ASSETS / f"hardware-example-{name}.json"
    cluster = load_cluster_spec(path)
    assert load_spec(path) == cluster.node
    assert cluster.name  # each example says what it is


def test_the_h100_example_is_eight_gpus_over_nvlink() -> None:
    cluster = load_cluster_spec(ASSETS / "hardware-example-8x-h100.json")
    assert (cluster.nodes, cluster.gpus_per_node, cluster.gpu_link) == (1, 8, "nvlink")


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ({"nodes": 0}, "'nodes' must be a whole number"),
        ({"nodes": 1.5}, "'nodes' must be a whole number"),
        ({"interconnect": {"gpu_link": "infiniband"}}, "'gpu_link' must be one of"),
        ({"interconnect": {"speed": 25}}, "interconnect: unknown key 'speed'"),
        ({"interconnect": {"network_gb_s": 0}}, "'network_gb_s' must be a positive number"),
        ({"interconnect": "nvlink"}, "'interconnect' must look like"),
        ({"name": 3}, "'name' must be a string"),
    ],
)
def test_bad_cluster_keys_are_reported(extra: dict[str, Any], problem: str) -> None:
    spec = {"schema": 1, "gpus": [{"model": "h100-sxm", "count": 8}], "memory_gb": 1024, **extra}
    with pytest.raises(SpecError, match=problem):
        expand_cluster_spec(spec)
    with pytest.raises(SpecError, match=problem):
        expand_spec(spec)
