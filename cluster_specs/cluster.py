"""``Cluster``: device groups, link levels, their graph, and the queries the planner asks.

Ranks are numbered group by group, node by node; nodes likewise (group 0's nodes first).

Group queries. For a group ``G`` of ranks, let ``k_n`` be the number of its ranks on node
``n`` and ``d_n`` the devices of node ``n``. Per node (read off the graph, see
:mod:`cluster_specs.topology`)::

    intra_n = bandwidth_gb_per_s × efficiency of n's intra-node level    (per device)
    nic_n   = Σ over n's NICs of bandwidth_gb_per_s × efficiency          (per node)

The per-rank bandwidth of a ring over ``G`` (its bus bandwidth) is::

    one node:     B = intra_n
    many nodes:   B = min over nodes n of G:  min(intra_n if k_n ≥ 2, nic_n × k_n / d_n)

``nic_n × k_n / d_n`` is the group's share of the node's NICs, assuming — as along an axis
of a device mesh — that every device of the node takes part in a group of the same shape at
the same time (the other ``d_n − k_n`` devices run sibling groups over the other rails of a
rail-optimised node). A ring crosses each node boundary once per direction, so the node's
ranks of one group do not divide the NICs among themselves further. Checks against
``benchmarks/data/hardware.md``: a full-node ring over 2 DGX A100 nodes gets
8 × 25 × 0.96 = 192 GB/s, the measured cross-node all-reduce bus bandwidth; one rank per node
gets one rail, 24 GB/s. A single-rank group has no link: ``B = inf``, latency 0.

**Domains.** A level of integer scope ``s`` (:mod:`cluster_specs.links`) joins the nodes
``[i·s, (i+1)·s)`` into domain ``i``, every device on its own links to the domain's switches
(a GB200 NVL72 rack). A group whose nodes all lie in one domain of level ``D`` (the innermost
such level) does not touch the network::

    one domain:   B = min(D.bandwidth × D.efficiency, min over nodes n with k_n ≥ 2 of intra_n)

with latency the slowest of ``D``'s and those nodes' hops. A group spanning domains is priced
as across nodes (above), also bounded by the bandwidth and latency of every domain level of
which some domain holds two or more of the group's nodes. Without domain levels (every spec
before them) the formulas above are unchanged.

``group_latency_us`` is the latency of the slowest hop (the network's across nodes, else the
domain's or the intra-node level's), and ``group_level`` the outermost level the group spans. Results are
cached per tuple of ranks; the graph and the per-node summaries are built on first use.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from collections import Counter
from functools import cached_property
from typing import TYPE_CHECKING, Any, Iterable, Mapping, NamedTuple

from fxplan.cluster_specs.devices import DeviceGroup
from fxplan.cluster_specs.host_costs import split_host
from fxplan.cluster_specs.links import LinkLevel
from fxplan.cluster_specs.schema import validate
from fxplan.cluster_specs.topology import NodeLinks, build_graph, node_links

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

_CACHE_LIMIT = 1 << 16
#: Keys of the canonical spec that do not affect planning (left out of the fingerprint).
_NOT_FINGERPRINTED = ("name", "description")


class GroupLinks(NamedTuple):
    """The answer to the three group queries at once."""

    level: LinkLevel
    bandwidth_gb_per_s: float
    latency_us: float


class Cluster:
    """A park of devices and the links between them; built from a spec (see ``schema``)."""

    def __init__(self, spec: Mapping[str, Any], *, source: str = "<dict>") -> None:
        canonical = validate(dict(spec) if isinstance(spec, Mapping) else spec, source)
        self._spec = canonical
        self.source = source
        self.name: str = canonical["name"]
        self.description: str = canonical["description"]
        self.levels: tuple[LinkLevel, ...] = tuple(LinkLevel(**level) for level in canonical["levels"])
        groups, rank, node = [], 0, 0
        for entry in canonical["device_groups"]:
            fields, host = split_host(entry)
            group = DeviceGroup(**fields, host=host, first_rank=rank, first_node=node)
            groups.append(group)
            rank, node = rank + group.num_devices, node + group.nodes
        self.device_groups: tuple[DeviceGroup, ...] = tuple(groups)
        self.num_devices: int = rank
        self.num_nodes: int = node
        self.cluster_level: LinkLevel | None = next((lv for lv in self.levels if lv.is_cluster_scope), None)
        #: Domain-scope levels (integer scope), innermost (fewest nodes) first.
        self.domain_levels: tuple[LinkLevel, ...] = tuple(lv for lv in self.levels if lv.domain_nodes)
        self._levels_by_name = {level.name: level for level in self.levels}
        self._first_nodes = [group.first_node for group in groups]
        self._first_ranks = [group.first_rank for group in groups]
        self._cache: dict[tuple, GroupLinks] = {}

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def load(cls, spec: "str | os.PathLike[str] | Cluster") -> "Cluster":
        """A built-in name, a path (YAML, or Paddle JSON), or ``name:key=value,...``
        (:mod:`fxplan.cluster_specs.loader`); a ``Cluster`` is returned as it is."""
        if isinstance(spec, Cluster):
            return spec
        from fxplan.cluster_specs.loader import load_spec

        canonical, source = load_spec(spec)
        return cls(canonical, source=source)

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any], *, source: str = "<dict>") -> "Cluster":
        """Validate ``spec`` (schema v1) and build the cluster."""
        return cls(spec, source=source)

    @classmethod
    def from_paddle_json(cls, path: "str | os.PathLike[str]") -> "Cluster":
        """Import a PaddlePaddle auto-parallel cluster JSON file."""
        from fxplan.cluster_specs.paddle_import import read_paddle_json

        source = os.fspath(path)
        return cls(read_paddle_json(source), source=source)

    # -- ranks and nodes ------------------------------------------------------------------
    def _check_rank(self, rank: int) -> int:
        if not 0 <= rank < self.num_devices:
            raise IndexError(f"rank {rank} is out of range: {self.name} has ranks 0–{self.num_devices - 1}")
        return rank

    def _check_node(self, node: int) -> int:
        if not 0 <= node < self.num_nodes:
            raise IndexError(f"node {node} is out of range: {self.name} has nodes 0–{self.num_nodes - 1}")
        return node

    def device(self, rank: int) -> DeviceGroup:
        """The device group ``rank`` belongs to."""
        return self.device_groups[bisect.bisect_right(self._first_ranks, self._check_rank(rank)) - 1]

    def group_of_node(self, node: int) -> DeviceGroup:
        """The device group whose nodes include ``node``."""
        return self.device_groups[bisect.bisect_right(self._first_nodes, self._check_node(node)) - 1]

    def node_of(self, rank: int) -> int:
        """The node index of ``rank``."""
        group = self.device(rank)
        return group.first_node + (rank - group.first_rank) // group.devices_per_node

    def ranks_of_node(self, node: int) -> list[int]:
        """The ranks on ``node``, ascending."""
        group = self.group_of_node(node)
        first = group.first_rank + (node - group.first_node) * group.devices_per_node
        return list(range(first, first + group.devices_per_node))

    def devices_per_node(self, node: int = 0) -> int:
        """Devices on ``node`` (node 0 by default)."""
        return self.group_of_node(node).devices_per_node

    def domain_of(self, rank: int, level: LinkLevel) -> int:
        """The index of the domain of domain-scope ``level`` that holds ``rank``'s node."""
        if not level.domain_nodes:
            raise ValueError(f"level {level.name!r} has scope {level.scope!r}, not a domain of nodes")
        return self.node_of(rank) // level.domain_nodes

    def level(self, name: str) -> LinkLevel:
        """The link level called ``name``."""
        try:
            return self._levels_by_name[name]
        except KeyError:
            known = ", ".join(self._levels_by_name)
            raise KeyError(f"{self.name} has no level {name!r} (it has {known})") from None

    def node_level(self, node: int) -> LinkLevel:
        """The intra-node level of ``node``."""
        return self._levels_by_name[self.group_of_node(node).intra_node_level]

    # -- graph and group queries ----------------------------------------------------------
    @cached_property
    def graph(self) -> "nx.Graph":
        """Devices, node switches, NICs and fabric (see :mod:`cluster_specs.topology`)."""
        return build_graph(self.device_groups, self.levels)

    @cached_property
    def _node_links(self) -> tuple[NodeLinks, ...]:
        return node_links(self.graph, self.num_nodes)

    @cached_property
    def _rank_node(self) -> tuple[int, ...]:
        out: list[int] = []
        for group in self.device_groups:
            for node in group.node_indices:
                out.extend([node] * group.devices_per_node)
        return tuple(out)

    def group_links(self, ranks: Iterable[int]) -> GroupLinks:
        """Level, ring bandwidth (GB/s per rank) and slowest-hop latency (µs) of a group."""
        key = tuple(ranks)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._compute_group_links(key)
            if len(self._cache) >= _CACHE_LIMIT:
                self._cache.clear()
            self._cache[key] = hit
        return hit

    def _compute_group_links(self, ranks: tuple[int, ...]) -> GroupLinks:
        if not ranks:
            raise ValueError("a group needs at least one rank")
        low, high = min(ranks), max(ranks)
        self._check_rank(low if low < 0 else high)
        if len(set(ranks)) != len(ranks):
            twice = sorted(r for r, n in Counter(ranks).items() if n > 1)
            raise ValueError(f"a group lists ranks more than once: {twice[:16]}")
        per_node = Counter(map(self._rank_node.__getitem__, ranks))
        links = self._node_links
        if len(per_node) == 1:
            node_links_ = links[next(iter(per_node))]
            level = self._levels_by_name[node_links_.intra_level]
            if len(ranks) == 1:
                return GroupLinks(level, float("inf"), 0.0)
            return GroupLinks(level, node_links_.intra_gb_per_s, node_links_.intra_latency_us)
        bandwidth, latency = float("inf"), 0.0
        for node, k in per_node.items():
            if k >= 2:
                bandwidth = min(bandwidth, links[node].intra_gb_per_s)
                latency = max(latency, links[node].intra_latency_us)
        for domain in self.domain_levels:   # innermost first (module docstring: Domains)
            size = domain.domain_nodes
            held = Counter(node // size for node in per_node)
            if len(held) == 1:
                return GroupLinks(domain, min(bandwidth, domain.effective_bandwidth_gb_per_s),
                                  max(latency, domain.latency_us))
            if max(held.values()) >= 2:
                bandwidth = min(bandwidth, domain.effective_bandwidth_gb_per_s)
                latency = max(latency, domain.latency_us)
        for node, k in per_node.items():
            nl = links[node]
            bandwidth = min(bandwidth, nl.nic_gb_per_s * k / nl.devices)
            latency = max(latency, nl.nic_latency_us)
        assert self.cluster_level is not None  # validated: nodes beyond every domain ⇒ a cluster level
        return GroupLinks(self.cluster_level, bandwidth, latency)

    def group_level(self, ranks: Iterable[int]) -> LinkLevel:
        """The outermost level the group spans (its node's intra-node level if on one node)."""
        return self.group_links(ranks).level

    def group_bandwidth_gb_per_s(self, ranks: Iterable[int]) -> float:
        """Per-rank bottleneck bandwidth of a ring over the group, GB/s, efficiency applied."""
        return self.group_links(ranks).bandwidth_gb_per_s

    def group_latency_us(self, ranks: Iterable[int]) -> float:
        """One-hop latency of the group's slowest hop, µs (0 for a single rank)."""
        return self.group_links(ranks).latency_us

    # -- identity and display -------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The canonical validated spec (a fresh copy; round-trips through YAML)."""
        return json.loads(json.dumps(self._spec))

    @cached_property
    def _fingerprint(self) -> str:
        planning = {k: v for k, v in self._spec.items() if k not in _NOT_FINGERPRINTED}
        text = json.dumps(planning, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hashlib.sha256(text.encode()).hexdigest()

    def fingerprint(self) -> str:
        """sha256 (hex) of the canonical spec without ``name`` and ``description``."""
        return self._fingerprint

    def summary(self, width: int = 120) -> str:
        """A readable description: device groups and levels as tables."""
        from fxplan.cluster_specs.summary import render

        return render(self, width=width)

    def __rich__(self) -> Any:
        from fxplan.cluster_specs.summary import renderable

        return renderable(self)

    def __repr__(self) -> str:
        return f"Cluster({self.name!r}, {self.num_devices} devices, {self.num_nodes} nodes)"
