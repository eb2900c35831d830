"""Rank layout and group queries (level, ring bandwidth, latency) on a two-level cluster, the
heterogeneous built-in, and a 3072-GPU cluster (built once, queries cached)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cluster_specs import cluster as cluster_module


@pytest.fixture
def two(two_level) -> Cluster:
    return Cluster.from_dict(two_level, source="two-level")


def test_rank_layout(two):
    assert (two.num_devices, two.num_nodes) == (8, 2)
    assert [two.node_of(r) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert two.ranks_of_node(1) == [4, 5, 6, 7]
    assert two.devices_per_node() == 4 and two.devices_per_node(1) == 4
    assert two.device(5).name == "gpu" and two.device(5).usable_memory_gib == 78
    with pytest.raises(IndexError, match="rank 8 is out of range: two-level has ranks 0–7"):
        two.device(8)
    with pytest.raises(IndexError, match="node 2 is out of range"):
        two.ranks_of_node(2)


def test_inside_one_node_uses_the_node_level(two):
    # 100 GB/s × 0.5 efficiency
    assert two.group_bandwidth_gb_per_s([0, 1]) == 50
    assert two.group_bandwidth_gb_per_s(range(4)) == 50
    assert two.group_level([2, 3]).name == "nvswitch"
    assert two.group_latency_us([0, 3]) == 2


def test_across_nodes_the_nics_are_shared(two):
    # Per node: 2 NICs × 10 GB/s × 0.5 = 10 GB/s, shared by the node's 4 devices in proportion
    # k_n / 4 to the ranks the group has there.
    assert two.group_bandwidth_gb_per_s(range(8)) == 10  # min(50, 10 × 4/4)
    assert two.group_bandwidth_gb_per_s([0, 1, 4, 5]) == 5  # min(50, 10 × 2/4)
    assert two.group_bandwidth_gb_per_s([0, 4]) == 2.5  # 10 × 1/4: one rail
    assert two.group_bandwidth_gb_per_s([0, 1, 2, 4]) == 2.5  # the node with one rank binds
    assert two.group_level([0, 4]).name == "ib"
    assert two.group_latency_us([0, 4]) == 8  # network hop, slowest


def test_fast_network_leaves_the_intra_node_link_binding(two_level):
    two_level["levels"][1]["bandwidth_gb_per_s"] = 1000  # 2 × 1000 × 0.5 = 1000 GB/s per node
    cluster = Cluster.from_dict(two_level)
    assert cluster.group_bandwidth_gb_per_s(range(8)) == 50
    assert cluster.group_bandwidth_gb_per_s([0, 4]) == 250  # one rank per node: no intra hop


def test_single_rank_and_bad_groups(two):
    assert two.group_bandwidth_gb_per_s([3]) == math.inf
    assert two.group_latency_us([3]) == 0.0
    assert two.group_level([3]).name == "nvswitch"
    with pytest.raises(ValueError, match="at least one rank"):
        two.group_bandwidth_gb_per_s([])
    with pytest.raises(ValueError, match=r"more than once: \[1\]"):
        two.group_bandwidth_gb_per_s([1, 1, 2])
    with pytest.raises(IndexError, match="rank 9"):
        two.group_level([0, 9])
    with pytest.raises(IndexError, match="rank -1"):
        two.group_level([-1, 0])


def test_order_does_not_matter_and_results_are_cached(two):
    assert two.group_links([5, 0, 4, 1]) == two.group_links((0, 1, 4, 5))
    assert two.group_links([0, 4]) is two.group_links([0, 4])


def test_graph_holds_devices_switches_nics_and_fabric(two):
    graph = two.graph
    kinds = [data["kind"] for _, data in graph.nodes(data=True)]
    assert (kinds.count("device"), kinds.count("switch"), kinds.count("nic"), kinds.count("fabric")) == (8, 2, 4, 1)
    edge = graph.edges[("device", 5), ("switch", 1)]
    assert (edge["level"], edge["bandwidth_gb_per_s"], edge["effective_gb_per_s"]) == ("nvswitch", 100, 50)
    assert graph.edges[("nic", 1, 0), ("fabric", "ib")]["level"] == "ib"
    import networkx as nx

    assert nx.shortest_path_length(graph, ("device", 0), ("device", 7)) == 6


# -- heterogeneous: V100 nodes 0–1 (ranks 0–15), A100 nodes 2–3 (ranks 16–31) -----------------
# v100: NVLink 150 × 0.77 = 115.5 per GPU, 4 NICs × 25 × 0.96 = 96 per node
# a100: NVSwitch 300 × 0.77 = 231 per GPU, 8 NICs × 25 × 0.96 = 192 per node


@pytest.fixture(scope="module")
def hetero() -> Cluster:
    return Cluster.load("hetero-v100-a100")


def test_hetero_inside_each_kind_of_node(hetero):
    assert hetero.group_level(range(8)).name == "nvlink-v100"
    assert hetero.group_bandwidth_gb_per_s(range(8)) == pytest.approx(115.5)
    assert hetero.group_level(range(16, 24)).name == "nvswitch-a100"
    assert hetero.group_bandwidth_gb_per_s(range(16, 24)) == pytest.approx(231)
    assert hetero.device(3).model == "V100-SXM2-32GB" and hetero.device(20).model == "A100-SXM4-80GB"


def test_hetero_group_spanning_both_is_limited_by_the_slower_side(hetero):
    a100_only = hetero.group_bandwidth_gb_per_s(range(16, 32))  # min(231, 192)
    mixed = hetero.group_bandwidth_gb_per_s(range(32))  # min(115.5, 96, 231, 192): V100 NICs
    assert a100_only == pytest.approx(192)
    assert mixed == pytest.approx(96)
    assert hetero.group_level(range(32)).name == "ib-hdr"
    # two ranks on each of a V100 and an A100 node: V100 share 96 × 2/8 = 24, A100's 48
    assert hetero.group_bandwidth_gb_per_s([0, 1, 16, 17]) == pytest.approx(24)


def test_hetero_with_a_fast_network_the_v100_nvlink_binds():
    cluster = Cluster.load("hetero-v100-a100:ib-hdr.bandwidth_gb_per_s=100")
    assert cluster.group_bandwidth_gb_per_s(range(32)) == pytest.approx(115.5)  # V100 NVLink
    assert cluster.group_bandwidth_gb_per_s(range(16, 32)) == pytest.approx(231)  # A100 NVSwitch


def test_huge_cluster_builds_once_and_caches_group_queries(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A 3072-GPU cluster stays cheap by construction: loading builds nothing, the graph and
    the per-node summaries are built once, on first use, and a repeated group query is a
    cache hit. Counted, not timed (``benchmarks/cluster_queries.py`` prints the times)."""
    calls: Counter[str] = Counter()

    def counted(name: str, fn):  # type: ignore[no-untyped-def]
        def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(cluster_module, "build_graph", counted("graph", cluster_module.build_graph))
    monkeypatch.setattr(cluster_module, "node_links", counted("node_links", cluster_module.node_links))
    monkeypatch.setattr(Cluster, "_compute_group_links", counted("group", Cluster._compute_group_links))
    cluster = Cluster.load("dgx-a100-80g:nodes=384")
    assert cluster.num_devices == 3072 and not calls
    assert cluster.graph.number_of_nodes() == 3072 + 384 + 3072 + 1
    assert cluster.group_bandwidth_gb_per_s(range(3072)) == pytest.approx(192)
    assert cluster.group_bandwidth_gb_per_s(range(0, 3072, 8)) == pytest.approx(24)
    for _ in range(1000):
        assert cluster.group_links(range(0, 3072, 8)).bandwidth_gb_per_s == pytest.approx(24)
    assert calls == {"graph": 1, "node_links": 1, "group": 2}
