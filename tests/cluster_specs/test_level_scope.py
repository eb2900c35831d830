"""Link levels whose scope is a number of nodes (a domain: a GB200 NVL72 rack of 18 trays).

Schema and loader (canonical forms, bad scopes refused in one paragraph), the ``racks=``
override, and the group queries at each scope, checked by hand against the formulas of
``cluster_specs/cluster.py``.
"""

from __future__ import annotations

import copy

import pytest

from fxplan.cluster_specs import Cluster, ClusterSpecError
from rack_spec import rack_spec


def test_canonical_scopes():
    spec = rack_spec()
    spec["levels"][0]["scope"] = 1
    spec["levels"][2]["scope"] = "all"
    cluster = Cluster.from_dict(spec)
    assert [lv.scope for lv in cluster.levels] == ["node", 2, "cluster"]
    assert [lv.name for lv in cluster.domain_levels] == ["rack"]
    # written either way, the same spec: the same fingerprint
    assert cluster.fingerprint() == Cluster.from_dict(rack_spec()).fingerprint()


def test_existing_specs_keep_their_canonical_form():
    for name in ("dgx-h100", "dgx-a100-80g", "hetero-v100-a100", "local-cpu"):
        cluster = Cluster.load(name)
        assert {lv.scope for lv in cluster.levels} <= {"node", "cluster"}
        assert cluster.domain_levels == ()


@pytest.mark.parametrize("scope,fragment", [
    (0, "found 0, expected node (or 1: the devices of one node), cluster (or all: every node), "
        "or a whole number of nodes from 2"),
    ("rack", "found 'rack' (a string), expected node (or 1"),
    (2.5, "found 2.5, expected node (or 1"),
    (True, "found true (a boolean), expected node (or 1"),
])
def test_bad_scope_values(scope, fragment):
    spec = rack_spec()
    spec["levels"][1]["scope"] = scope
    with pytest.raises(ClusterSpecError) as err:
        Cluster.from_dict(spec, source="bad.yaml")
    text = str(err.value)
    assert text.startswith("bad.yaml: levels[1].scope: ") and fragment in text, text
    assert "\n" not in text


def test_bad_scope_structures():
    # a domain level after the cluster level
    spec = rack_spec()
    spec["levels"][1], spec["levels"][2] = spec["levels"][2], spec["levels"][1]
    with pytest.raises(ClusterSpecError, match=r"levels\[2\].scope: found 2, expected domain-scope "
                                               r"levels before the cluster-scope level 'net'"):
        Cluster.from_dict(spec)
    # domains that do not nest
    spec = rack_spec(nodes=12)
    spec["levels"].insert(2, {**spec["levels"][1], "name": "row", "scope": 3})
    with pytest.raises(ClusterSpecError, match=r"levels\[2\].scope: found 3, expected a multiple of 2"):
        Cluster.from_dict(spec)
    # a node-scope kind only: PCIe cannot join a domain of nodes
    spec = rack_spec()
    spec["levels"][1]["kind"] = "pcie"
    with pytest.raises(ClusterSpecError, match=r"for scope: 2 \(a domain of nodes\) one of nvlink, "
                                               "nvswitch, infinity_fabric"):
        Cluster.from_dict(spec)
    # NICs belong to the cluster level
    spec = rack_spec()
    spec["levels"][1]["nics_per_node"] = 2
    with pytest.raises(ClusterSpecError, match="no nics_per_node on a scope: 2 level"):
        Cluster.from_dict(spec)
    # a domain counts the nodes of one device group
    spec = rack_spec()
    other = copy.deepcopy(spec["device_groups"][0])
    other["name"] = "h"
    spec["device_groups"].append(other)
    with pytest.raises(ClusterSpecError, match="a domain level only on a spec of one device group"):
        Cluster.from_dict(spec)


def test_cluster_level_needed_only_beyond_the_widest_domain():
    spec = rack_spec(nodes=2)
    del spec["levels"][2]
    assert Cluster.from_dict(spec).num_nodes == 2        # one domain holds both trays
    spec = rack_spec(nodes=3)
    del spec["levels"][2]
    with pytest.raises(ClusterSpecError, match="found only scope: node and 2-node domain levels "
                                               "but 3 \\(g\\) = 3 nodes"):
        Cluster.from_dict(spec)


def test_racks_override():
    assert Cluster.load("gb200-nvl72").num_devices == 72
    four = Cluster.load("gb200-nvl72:racks=4")
    assert (four.num_nodes, four.num_devices) == (72, 288)
    with pytest.raises(ClusterSpecError, match="racks= only on a spec with a level whose scope is "
                                               "a number of nodes"):
        Cluster.load("dgx-h100:racks=2")
    with pytest.raises(ClusterSpecError, match="one of racks= and nodes=, not both"):
        Cluster.load("gb200-nvl72:racks=2,nodes=36")
    with pytest.raises(ClusterSpecError, match="racks: found 0, expected an integer ≥ 1"):
        Cluster.load("gb200-nvl72:racks=0")


def test_group_links_at_each_scope():
    """By hand, on 4 trays of 2 in domains of 2 trays (ranks 0–3 domain 0, 4–7 domain 1):
    trays 200 × 0.5 per device, 1 µs; domains 100 × 0.5, 3 µs; one 10 GB/s NIC a tray, 9 µs."""
    c = Cluster.from_dict(rack_spec())
    tray, rack, net = c.levels
    # one node: the tray's 200 × 0.5
    assert c.group_links((0, 1)) == (tray, 100.0, 1.0)
    # two trays of one domain, one rank each: the domain's 100 × 0.5, its latency
    assert c.group_links((0, 2)) == (rack, 50.0, 3.0)
    # a whole domain: min(tray 100, domain 50), slowest hop 3
    assert c.group_links((0, 1, 2, 3)) == (rack, 50.0, 3.0)
    # across domains, one rank per tray: NIC share 10 × 1 / 2 = 5; latency 9
    assert c.group_links((0, 4)) == (net, 5.0, 9.0)
    # all 8: NIC share 10 × 2/2 = 10, the domain (two trays of each) 50, the tray 100 → 10
    assert c.group_links(range(8)) == (net, 10.0, 9.0)
    assert c.domain_of(3, rack) == 0 and c.domain_of(4, rack) == 1


def test_partial_last_domain():
    c = Cluster.from_dict(rack_spec(nodes=3))            # domains: trays {0, 1}, {2}
    _, rack, net = c.levels
    assert c.group_level((0, 2)).name == "rack"
    assert c.group_level((2, 4)).name == "net"            # tray 1 and tray 2: two domains


def test_gb200_rack_queries():
    c = Cluster.load("gb200-nvl72:racks=2")
    nvl72, ib = c.level("nvl72"), c.level("ib-ndr")
    # tp of 72 in a rack: NVLink at 900 × 0.82, no network
    assert c.group_links(range(72)) == (nvl72, pytest.approx(738.0), 2.0)
    # dp across the 2 racks, one rank per tray (rank r and r + 72): one NIC each of 4 → 48.5
    assert c.group_links((5, 77)) == (ib, pytest.approx(48.5), 8.0)
    summary = c.summary(width=200)
    assert "18 nodes (2 domains)" in summary and "nvl72" in summary


def test_resizing_drops_racks():
    from fxplan.cluster_specs.overrides import with_devices

    spec = with_devices("gb200-nvl72:racks=2", 64)
    assert spec == "gb200-nvl72:devices=64"
    cluster = Cluster.load(spec)                           # 16 trays: one partial rack
    assert (cluster.num_nodes, cluster.group_level(range(64)).name) == (16, "nvl72")
