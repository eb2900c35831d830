"""Collectives and the mesh at each level scope: node, domain (a rack of trays), cluster.

The α-β formulas of ``cost_model/comm/collectives.py`` evaluated by hand with the bandwidth and
latency of the level the group reaches, and the mesh mapping that keeps tensor parallelism
inside a domain (``cost_model.comm.mesh.domain_straddle``, pruned by the search).
"""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.comm.collectives import _constants, collective_cost
from fxplan.cost_model.comm.mesh import LogicalMesh, domain_straddle
from fxplan.inter_op.space import Family
from fxplan.inter_op.stage_devices import straddle_reason
from rack_spec import rack_spec


def racks(nodes: int, *, per_node: int = 1, scope: int = 2, nvls: float | None = None) -> Cluster:
    """``nodes`` trays of ``per_node`` devices, racks of ``scope`` (``rack_spec``'s numbers:
    trays 100 GB/s effective, 1 µs; racks 50, 3 µs; one 10 GB/s NIC a tray, 9 µs)."""
    return Cluster.from_dict(rack_spec(nodes=nodes, per_node=per_node, scope=scope, nvls=nvls))


S = 1e9  # bytes


def ring_s(kind: str, n: int, m: int, gb_per_s: float, h_i: float, h_e: float) -> float:
    """The ring formula by hand: α + (s(n) − s(m))·h_i + s(m)·h_e + c·S/B."""
    steps = (lambda x: 2 * (x - 1)) if kind == "all_reduce" else (lambda x: x - 1)
    c = 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n
    alpha = _constants()["base_latency_us"]["ring"]
    return (alpha + (steps(n) - steps(m)) * h_i + steps(m) * h_e) * 1e-6 + c * S / (gb_per_s * 1e9)


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_ring_inside_a_domain_uses_the_domain(kind):
    c = racks(4, per_node=2)
    # ranks 0–3: trays 0 and 1, domain 0; B = min(tray 100, domain 50) = 50, h_i 1, h_e 3
    got = collective_cost(kind, S, range(4), c, algorithm="ring").time_s
    assert got == pytest.approx(ring_s(kind, 4, 2, 50.0, 1.0, 3.0))


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather"])
def test_ring_across_domains_uses_the_network(kind):
    c = racks(4, per_node=2)
    # all 8 ranks: NIC share 10 × 2/2 = 10 GB/s, the network's hop 9 µs between trays
    got = collective_cost(kind, S, range(8), c, algorithm="ring").time_s
    assert got == pytest.approx(ring_s(kind, 8, 4, 10.0, 1.0, 9.0))


def test_node_scope_unchanged_by_domains():
    c = racks(4, per_node=2)
    got = collective_cost("all_reduce", S, (0, 1), c, algorithm="ring").time_s
    assert got == pytest.approx(ring_s("all_reduce", 2, 1, 100.0, 1.0, 0.0))


def test_nvls_inside_a_domain_only():
    c = racks(4, nvls=80.0)
    alpha = _constants()["base_latency_us"]["nvls"]
    inside = collective_cost("all_reduce", S, (0, 1), c, algorithm="nvls")
    assert inside.time_s == pytest.approx(alpha * 1e-6 + 2 * (2 - 1) / 2 * S / 80e9)
    with pytest.raises(ValueError, match="does not apply"):
        collective_cost("all_reduce", S, (1, 2), c, algorithm="nvls")   # trays 1 and 2: two racks


def test_all_to_all_inside_and_across_domains():
    c = racks(4, per_node=2)
    alpha = _constants()["base_latency_us"]["direct"]
    # inside domain 0 (n 4, m 2, k 2): rail = the domain's 50 GB/s, h_e its 3 µs
    inside = collective_cost("all_to_all", S, range(4), c).time_s
    expect = (alpha + (4 - 2) * 1.0 + (2 - 1) * 3.0) * 1e-6 + max(1 / 4 * S / 100e9, 2 / 4 * S / 50e9)
    assert inside == pytest.approx(expect)
    # one rank per tray across the racks: rail = one NIC of 10 GB/s shared by 2 devices → 5
    across = collective_cost("all_to_all", S, (0, 2, 4, 6), c).time_s
    expect = (alpha + 3 * 9.0) * 1e-6 + max(0.0, 3 / 4 * S / 5e9)
    assert across == pytest.approx(expect)


def test_gb200_tp_inside_the_rack_never_across():
    two = Cluster.load("gb200-nvl72:racks=2")
    assert domain_straddle(two, 72) is None
    assert domain_straddle(two, 8) is None and domain_straddle(two, 36) is None
    level, block = domain_straddle(two, 16)                 # 72 = 4·16 + 8: block 4 crosses
    assert (level.name, block) == ("nvl72", 4)
    assert domain_straddle(two, 144)[0].name == "nvl72"     # tp of two racks: across
    # a rack of 16 trays (64 GPUs) holds tp = 16 and tp = 64
    one = Cluster.load("gb200-nvl72:nodes=16")
    assert domain_straddle(one, 16) is None and domain_straddle(one, 64) is None
    # existing specs have no domains: nothing is pruned
    assert domain_straddle(Cluster.load("dgx-h100:nodes=4"), 16) is None


def test_search_prunes_tp_across_a_rack():
    two = Cluster.load("gb200-nvl72:racks=2")
    reason = straddle_reason(two, Family(tp=16, pp=1, dp=9))
    assert reason is not None and reason.kind == "degree does not divide"
    assert str(reason) == ("tp=16, pp=1, dp=9: tensor-parallel group 4 (ranks 64–79) crosses a "
                           "nvl72 domain of 18 nodes (72 devices); tensor parallelism stays "
                           "inside a domain")
    assert straddle_reason(two, Family(tp=72, pp=1, dp=2)) is None
    # the tp groups of 72 are priced on NVLink, the dp groups across racks on InfiniBand
    mesh = LogicalMesh(two, (1, 2, 72), ("pp", "dp", "tp"))
    assert mesh.axis_level("tp").name == "nvl72" and mesh.axis_level("dp").name == "ib-ndr"


def test_representative_groups_tell_domains_apart():
    c = racks(6)                                           # one device per tray, racks of 2
    mesh = LogicalMesh(c, (2, 2), ("a", "b"), ranks=(0, 1, 3, 4))
    # b's groups (0, 1) and (3, 4) have one node pattern; the second crosses racks 1 and 2
    assert len(mesh.representative_groups("b")) == 2
    assert mesh.axis_level("b").name == "net"
