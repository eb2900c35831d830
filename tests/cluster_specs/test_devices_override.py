"""``devices=N`` on any one-group spec: part of a node, or whole nodes."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster, ClusterSpecError


def test_part_of_a_node_keeps_the_node_links() -> None:
    part = Cluster.load("aws-p3-v100:devices=4")
    full = Cluster.load("aws-p3-v100")
    assert part.num_devices == 4 and part.num_nodes == 1
    assert part.devices_per_node() == 4
    assert part.group_level(range(4)).name == full.group_level(range(4)).name == "nvlink"
    assert part.group_bandwidth_gb_per_s(range(4)) == full.group_bandwidth_gb_per_s(range(4))
    assert part.group_bandwidth_gb_per_s(range(4)) == full.group_bandwidth_gb_per_s(range(8))
    assert part.group_latency_us(range(4)) == full.group_latency_us(range(4))
    assert part.device(0).memory_gib == full.device(0).memory_gib
    assert part.name == "aws-p3-v100:devices=4"


def test_whole_nodes_is_the_nodes_override() -> None:
    two = Cluster.load("dgx-a100-80g:devices=16")
    assert two.num_devices == 16 and two.num_nodes == 2
    assert two.fingerprint() == Cluster.load("dgx-a100-80g:nodes=2").fingerprint()
    # the whole node is the spec itself
    assert Cluster.load("dgx-a100-80g:devices=8").fingerprint() == \
        Cluster.load("dgx-a100-80g").fingerprint()
    assert Cluster.load("dgx-a100-80g:nodes=2,devices=16").num_devices == 16


def test_a_count_that_is_neither_part_nor_whole_nodes_is_refused() -> None:
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load("dgx-a100-80g:devices=12")
    text = str(err.value)
    assert "devices: found 12" in text
    assert "at most 8 (part of one node) or a multiple of the 8 devices per node" in text
    assert "12 = 1·8 + 4" in text


@pytest.mark.parametrize("spec, fragments", [
    ("dgx-a100-80g:nodes=3,devices=16", ["agrees with nodes=3", "is 2 nodes of 8, not 3"]),
    ("aws-p3-v100:nodes=2,devices=4", ["agrees with nodes=2", "is 1 node of 4, not 2"]),
    ("hetero-v100-a100:devices=8", ["2 device groups (v100, a100)", "GROUP.nodes=N"]),
    ("aws-p3-v100:devices=0", ["devices: found 0, expected an integer ≥ 1"]),
])
def test_contradictions_are_refused(spec: str, fragments: list[str]) -> None:
    with pytest.raises(ClusterSpecError) as err:
        Cluster.load(spec)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_local_cpu_keeps_its_own_devices_key() -> None:
    """``local-cpu`` generates its spec from ``devices`` (ranks), as before."""
    assert Cluster.load("local-cpu:devices=3").num_devices == 3
