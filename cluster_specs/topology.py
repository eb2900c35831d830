"""The cluster as a ``networkx`` graph, and what each node's links offer a ring.

Graph vertices (tuples, first item the kind)::

    ("device", rank)      one per rank            attrs: rank, node, group, model
    ("switch", node)      one per node            attrs: node, level (the intra-node level)
    ("nic", node, i)      nics_per_node per node  attrs: node
    ("fabric", level)     one, if a cluster-scope level exists
    ("domain", level, i)  one per domain of each domain-scope level (scope: s nodes; domain i
                          holds nodes i·s … i·s + s − 1): the rack's switch system

Edges ``device—switch`` carry the node's intra-node level, ``switch—domain`` a domain level
(per device, as its bandwidth is), ``switch—nic`` and ``nic—fabric`` the cluster-scope level; every edge has ``level, kind, bandwidth_gb_per_s,
efficiency, effective_gb_per_s (= bandwidth × efficiency), latency_us``.

:func:`node_links` reads, for every node, what a ring over some of its devices can use:
the slowest device—switch edge (per-device bandwidth inside the node) and the sum of its
NIC—fabric edges (the node's share of the network). The group queries of ``Cluster`` are
arithmetic on these per-node summaries, so heterogeneous parks, mixed intra-node levels and
per-group NIC counts need no special case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from fxplan.cluster_specs.devices import DeviceGroup
from fxplan.cluster_specs.links import LinkLevel

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx


@dataclass(frozen=True)
class NodeLinks:
    """What one node offers a ring: effective GB/s and µs, read off the graph."""

    node: int
    devices: int
    intra_level: str
    intra_gb_per_s: float
    intra_latency_us: float
    nic_gb_per_s: float  # all NICs of the node together, efficiency applied; 0 without NICs
    nic_latency_us: float


def _edge_attrs(level: LinkLevel) -> dict:
    return {
        "level": level.name,
        "kind": level.kind,
        "bandwidth_gb_per_s": level.bandwidth_gb_per_s,
        "efficiency": level.efficiency,
        "effective_gb_per_s": level.effective_bandwidth_gb_per_s,
        "latency_us": level.latency_us,
    }


def build_graph(groups: Sequence[DeviceGroup], levels: Sequence[LinkLevel]) -> "nx.Graph":
    """Devices, node switches, NICs and the fabric, with the level attributes on each edge."""
    import networkx as nx

    by_name = {level.name: level for level in levels}
    network = next((level for level in levels if level.is_cluster_scope), None)
    domains = [level for level in levels if level.domain_nodes]
    graph = nx.Graph()
    vertices: list[tuple] = []
    edges: list[tuple] = []
    if network is not None:
        fabric = ("fabric", network.name)
        vertices.append((fabric, {"kind": "fabric", "level": network.name}))
        net_attrs = _edge_attrs(network)
    for group in groups:
        intra = by_name[group.intra_node_level]
        intra_attrs = _edge_attrs(intra)
        for node in group.node_indices:
            switch = ("switch", node)
            vertices.append((switch, {"kind": "switch", "node": node, "level": intra.name}))
            first = group.first_rank + (node - group.first_node) * group.devices_per_node
            for rank in range(first, first + group.devices_per_node):
                vertices.append(
                    (("device", rank), {"kind": "device", "rank": rank, "node": node,
                                        "group": group.name, "model": group.model})
                )
                edges.append((("device", rank), switch, intra_attrs))
            for domain in domains:
                vertex = ("domain", domain.name, node // domain.domain_nodes)
                vertices.append((vertex, {"kind": "domain", "level": domain.name}))
                edges.append((switch, vertex, _edge_attrs(domain)))
            if network is None:
                continue
            for i in range(group.nics_per_node or network.nics_per_node or 0):
                nic = ("nic", node, i)
                vertices.append((nic, {"kind": "nic", "node": node}))
                edges.append((switch, nic, net_attrs))
                edges.append((nic, fabric, net_attrs))
    graph.add_nodes_from(vertices)
    graph.add_edges_from(edges)
    return graph


def node_links(graph: "nx.Graph", num_nodes: int) -> tuple[NodeLinks, ...]:
    """Per node: slowest device link, summed NIC bandwidth, and their latencies."""
    out = []
    adjacency = graph.adj
    for node in range(num_nodes):
        switch = ("switch", node)
        intra_bw, intra_lat, nic_bw, nic_lat, devices = float("inf"), 0.0, 0.0, 0.0, 0
        for neighbour, data in adjacency[switch].items():
            if neighbour[0] == "device":
                devices += 1
                intra_bw = min(intra_bw, data["effective_gb_per_s"])
                intra_lat = max(intra_lat, data["latency_us"])
            elif neighbour[0] == "nic":
                for far, far_data in adjacency[neighbour].items():
                    if far[0] == "fabric":
                        nic_bw += far_data["effective_gb_per_s"]
                        nic_lat = max(nic_lat, far_data["latency_us"])
        out.append(
            NodeLinks(node, devices, graph.nodes[switch]["level"], intra_bw, intra_lat, nic_bw, nic_lat)
        )
    return tuple(out)
