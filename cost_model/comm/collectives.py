"""α-β time of a collective over a group of ranks of a :class:`~cluster_specs.Cluster`.

Sizes follow nccl-tests: ``S`` = ``nbytes`` is the all-reduce/broadcast buffer, the
*gathered* output of an all-gather, the *input* of a reduce-scatter, each rank's whole send
buffer of an all-to-all, the message of a send/recv.

The group: ``n`` ranks on ``m`` nodes, at most ``k`` per node. From the cluster:

    B    ring bus bandwidth of the group, ``Cluster.group_bandwidth_gb_per_s`` (min of the
         intra-node bandwidth and the group's fair share of its nodes' NICs)
    B_i  intra-node bandwidth (the slowest node's ranks of the group)
    B_r  rail bandwidth: a group of one rank per node (that rank's share of the NICs)
    h_i  intra-node hop latency; h_e network hop latency (``latency_us`` of the levels)
    α_a  base latency of algorithm ``a`` (``cost_model/data/collectives.json``)

Ring (NCCL's latency model: steps inside nodes cost ``h_i``, steps between nodes ``h_e``),
with ``s(x) = 2(x−1)`` for all-reduce and ``x−1`` for all-gather, reduce-scatter, broadcast:

    t = α + (s(n) − s(m))·h_i + s(m)·h_e + c·S/B
    c = 2(n−1)/n all-reduce · (n−1)/n all-gather, reduce-scatter · 1 broadcast

Tree (all-reduce; NCCL's double binary tree: chains inside nodes, a tree across them):

    t = α + 2((k−1)·h_i + ⌈log₂ m⌉·h_e) + 2·S/(φ·B)          φ = tree_bandwidth_factor

Hierarchical (all-reduce, all-gather, reduce-scatter; m ≥ 2 nodes with k ≥ 2 ranks each):
rings inside the nodes and rings of ``m`` ranks across them on ``S/k`` each, one after the
other: all-reduce = RS_k(S) + AR_m(S/k) + AG_k(S); all-gather = AG_m(S/k) + AG_k(S);
reduce-scatter = RS_k(S) + RS_m(S/k). It moves 2(m−1)/m·S per node over the network instead
of the flat ring's 2(n−1)/n·S, so it wins where the network is much slower than the node.

NVLS (all-reduce inside one node, or inside one domain of a domain-scope level — a GB200
NVL72 rack —, whose level lists ``allreduce_bandwidth_gb_per_s``, the measured NVLink-SHARP
bus bandwidth ``B_s``): ``t = α_nvls + 2(n−1)/n · S/B_s``.

**Scopes.** ``B``, ``B_r`` and ``h_e`` come from the cluster's group queries, which follow the
level scopes (:mod:`cluster_specs.cluster`): inside one domain the hops between nodes are the
domain's (its per-device bandwidth and latency, no NIC share), across domains the network's.
So the formulas above hold at every scope, with "between nodes" priced at the level the
group reaches.

**CPU per step** (``step_cpu_us`` of the intra-node level, ``c_K`` for kind ``K``; 0 on GPU
links): where the collective's algorithm runs on the ranks' own cores (gloo over loopback),
each rank's CPU per message — its copies, syscalls and hand-offs between gloo's threads —
is part of every step inside a node: a ring adds ``(s(n) − s(m))·c_K``, a tree
``2(k−1)·c_K``, the direct all-to-all ``(n − m)·c_K``, a send/recv ``c_K`` inside a node.
(``local-cpu`` gives ``c_K`` and the bandwidth at the ranks' core share: the per-message and
the per-byte work need the cores the time-shared ranks compute on.) An all-reduce's ``c_K``
is that of a step of full segments: gloo's ring cuts its input into ``2n`` segments and a
step sends and receives only the non-empty ones, so an input of ``e < 2n`` elements (4-byte;
the trainer's loss and norm scalars) costs ``e/2n`` of it per step (measured on 2 and 4
ranks: 1-element all-reduces ≈ 0.2–0.3 of the CPU of those of ≥ 2n elements, which is flat
from 2n elements to 64 KiB).

A reduce-scatter over a level with ``reduce_scatter_as_all_reduce`` (gloo, which runs
``_reduce_scatter_base`` as an all-reduce of the whole input and keeps its own shard) is
priced as that all-reduce of ``S``: ``2(n−1)`` hops and ``2(n−1)/n·S/B`` (and the
all-reduce's CPU per step: measured, the same).

All-to-all (direct: n−1 pairwise transfers at once): ``t = α + (n−m)·h_i + (m−1)·h_e +
max((k−1)/n · S/B_i, (n−k)/n · S/B_r)``. Send/recv: ``t = α + h + S/B`` over the pair.

``algorithm="auto"`` picks the fastest applicable algorithm, as NCCL's tuner does from its
own model. Groups are priced with their sibling groups active (the Cluster's fair NIC share):
a mesh axis runs its collective in all its groups at once.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Mapping

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["CollectiveCost", "KINDS", "ALGORITHMS", "collective_cost", "collective_time_s",
           "normalise_kind", "bus_factor"]

KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                          "send_recv")
#: Algorithms that can run each collective (``auto`` chooses among them).
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("ring", "tree", "hierarchical", "nvls"),
    "all_gather": ("ring", "hierarchical"),
    "reduce_scatter": ("ring", "hierarchical"),
    "broadcast": ("ring",),
    "all_to_all": ("direct",),
    "send_recv": ("p2p",),
}
DATA_FILE = Path(__file__).parents[1] / "data" / "collectives.json"


@dataclass(frozen=True)
class CollectiveCost:
    """Seconds, the algorithm chosen, the nccl-tests bus bandwidth it reaches
    (``S/t × bus_factor``, GB/s) and its latency term α (seconds)."""

    time_s: float
    algorithm: str
    bus_bandwidth_gb_per_s: float
    latency_s: float


def normalise_kind(kind: str) -> str:
    """``"allreduce"``, ``"all-reduce"``, ``"AllReduce"`` → ``"all_reduce"``; ``send``, ``recv``
    → ``"send_recv"``."""
    compact = kind.lower().replace("_", "").replace("-", "")
    table = {k.replace("_", ""): k for k in KINDS} | {"send": "send_recv", "recv": "send_recv",
                                                     "alltoallv": "all_to_all", "bcast": "broadcast"}
    if compact not in table:
        raise ValueError(f"unknown collective {kind!r}; expected one of {', '.join(KINDS)}")
    return table[compact]


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw × this."""
    kind = normalise_kind(kind)
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@lru_cache(maxsize=1)
def _constants() -> dict[str, Any]:
    return json.loads(DATA_FILE.read_text())


@dataclass(frozen=True)
class _Group:
    """What the formulas need to know about a group (module docstring)."""

    n: int
    m: int
    k: int
    uniform: bool
    ring_gb_per_s: float
    intra_gb_per_s: float
    rail_gb_per_s: float
    intra_hop_us: float
    net_hop_us: float
    nvls_gb_per_s: float | None
    reduce_scatter_as_all_reduce: bool = False
    step_cpu_us: Mapping[str, float] = field(default_factory=dict)


@lru_cache(maxsize=4096)
def _describe(ranks: tuple[int, ...], cluster: Cluster) -> _Group:
    by_node: dict[int, list[int]] = {}
    for rank in ranks:
        by_node.setdefault(cluster.node_of(rank), []).append(rank)
    counts = Counter(len(v) for v in by_node.values())
    intra = [cluster.group_links(v) for v in by_node.values() if len(v) > 1]
    rail = cluster.group_links([v[0] for v in by_node.values()]) if len(by_node) > 1 else None
    links = cluster.group_links(ranks)
    return _Group(
        n=len(ranks), m=len(by_node), k=max(counts), uniform=len(counts) == 1,
        ring_gb_per_s=links.bandwidth_gb_per_s,
        intra_gb_per_s=min((g.bandwidth_gb_per_s for g in intra), default=math.inf),
        rail_gb_per_s=rail.bandwidth_gb_per_s if rail else math.inf,
        intra_hop_us=max((g.latency_us for g in intra), default=0.0),
        net_hop_us=rail.latency_us if rail else 0.0,
        nvls_gb_per_s=(None if links.level.is_cluster_scope
                       else links.level.allreduce_bandwidth_gb_per_s),
        reduce_scatter_as_all_reduce=links.level.reduce_scatter_as_all_reduce,
        # per-step CPU inside a node: the intra-node level's (none without a step inside one)
        step_cpu_us=intra[0].level.step_cpu_us if intra else {},
    )


def _filled_segments(nbytes: float, n: int) -> float:
    """Fraction of a ring all-reduce's ``2n`` segments that hold data: ``min(1, e/2n)`` for
    ``e = ⌈S/4⌉`` (4-byte) elements (module docstring)."""
    return min(1.0, math.ceil(nbytes / 4) / (2 * n))


def _steps(kind: str, x: int) -> int:
    return 2 * (x - 1) if kind == "all_reduce" else x - 1


def _ring(kind: str, size: float, n: int, m: int, gb_per_s: float, h_i: float, h_e: float,
          base_us: float) -> tuple[float, float]:
    """(latency s, bandwidth term s) of a ring over n ranks on m nodes (module docstring)."""
    if n <= 1:
        return 0.0, 0.0
    latency_us = base_us + (_steps(kind, n) - _steps(kind, m)) * h_i + _steps(kind, m) * h_e
    c = 1.0 if kind == "broadcast" else bus_factor(kind, n)
    return latency_us * 1e-6, c * size / (gb_per_s * 1e9)


def _hierarchical(kind: str, size: float, g: _Group, base_us: float) -> tuple[float, float]:
    intra = ("reduce_scatter", "all_gather") if kind == "all_reduce" else (kind,)
    phases = [_ring(k, size, g.k, 1, g.intra_gb_per_s, g.intra_hop_us, 0.0, base_us) for k in intra]
    phases.append(_ring(kind, size / g.k, g.m, g.m, g.rail_gb_per_s, 0.0, g.net_hop_us, base_us))
    return sum(p[0] for p in phases), sum(p[1] for p in phases)


def _algorithm_time(kind: str, algorithm: str, size: float, g: _Group) -> tuple[float, float] | None:
    """(latency s, bandwidth term s) of one algorithm, or ``None`` where it does not apply."""
    consts = _constants()
    base = consts["base_latency_us"][algorithm]
    if algorithm == "ring":
        return _ring(kind, size, g.n, g.m, g.ring_gb_per_s, g.intra_hop_us, g.net_hop_us, base)
    if algorithm == "tree":
        latency_us = base + 2 * ((g.k - 1) * g.intra_hop_us + math.ceil(math.log2(g.m)) * g.net_hop_us)
        return latency_us * 1e-6, 2 * size / (consts["tree_bandwidth_factor"] * g.ring_gb_per_s * 1e9)
    if algorithm == "hierarchical":
        return _hierarchical(kind, size, g, base) if g.m >= 2 and g.k >= 2 and g.uniform else None
    if algorithm == "nvls":
        if not g.nvls_gb_per_s:
            return None
        return base * 1e-6, bus_factor(kind, g.n) * size / (g.nvls_gb_per_s * 1e9)
    if algorithm == "direct":
        latency_us = base + (g.n - g.m) * g.intra_hop_us + (g.m - 1) * g.net_hop_us
        intra_s = (g.k - 1) / g.n * size / (g.intra_gb_per_s * 1e9)
        net_s = (g.n - g.k) / g.n * size / (g.rail_gb_per_s * 1e9)
        return latency_us * 1e-6, max(intra_s, net_s)
    if algorithm == "p2p":
        hop = g.net_hop_us if g.m > 1 else g.intra_hop_us
        return (base + hop) * 1e-6, size / (g.ring_gb_per_s * 1e9)
    raise ValueError(f"unknown algorithm {algorithm!r}")


def collective_cost(kind: str, nbytes: float, ranks: Iterable[int], cluster: Cluster, *,
                    algorithm: str = "auto") -> CollectiveCost:
    """Cost of collective ``kind`` on ``nbytes`` (nccl-tests size) over ``ranks`` of ``cluster``.

    ``algorithm`` is ``"auto"`` (the fastest applicable) or one of :data:`ALGORITHMS`
    ``[kind]``; an algorithm that does not apply to this group (hierarchical on one node, NVLS
    without in-network reduction) raises ``ValueError``. A single rank or an empty message
    costs nothing.
    """
    kind = normalise_kind(kind)
    group = tuple(ranks)
    if kind == "send_recv" and len(group) != 2:
        raise ValueError(f"send_recv takes the (source, destination) pair, got {len(group)} ranks")
    return _cost(kind, float(nbytes), group, cluster, algorithm)


@lru_cache(maxsize=65536)
def _cost(kind: str, nbytes: float, group: tuple[int, ...], cluster: Cluster,
          algorithm: str) -> CollectiveCost:
    if len(group) <= 1 or nbytes <= 0:
        return CollectiveCost(0.0, "none", math.inf, 0.0)
    g = _describe(group, cluster)
    if kind == "reduce_scatter" and g.reduce_scatter_as_all_reduce:
        kind = "all_reduce"              # gloo (module docstring)
    # every step inside a node also costs the ranks' CPU per step (module docstring)
    cpu_us = g.step_cpu_us.get(kind, 0.0) * (
        _filled_segments(nbytes, g.n) if kind == "all_reduce" else 1.0)
    if cpu_us:
        g = replace(g, intra_hop_us=g.intra_hop_us + cpu_us)
    names = ALGORITHMS[kind] if algorithm == "auto" else (algorithm,)
    if algorithm != "auto" and algorithm not in ALGORITHMS[kind]:
        raise ValueError(f"{kind} cannot run as {algorithm!r}; algorithms: {', '.join(ALGORITHMS[kind])}")
    priced = [(name, t) for name in names if (t := _algorithm_time(kind, name, nbytes, g)) is not None]
    if not priced:
        raise ValueError(f"{algorithm!r} {kind} does not apply to {g.n} ranks on {g.m} node(s) "
                         f"({g.k} per node{'' if g.uniform else ', uneven'})")
    name, (latency, transfer) = min(priced, key=lambda item: sum(item[1]))
    time_s = latency + transfer
    busbw = nbytes / time_s * bus_factor(kind, g.n) / 1e9
    return CollectiveCost(time_s, name, busbw, latency)


def collective_time_s(kind: str, nbytes: float, ranks: Iterable[int], cluster: Cluster, *,
                      algorithm: str = "auto") -> float:
    """Seconds of :func:`collective_cost`."""
    return collective_cost(kind, nbytes, ranks, cluster, algorithm=algorithm).time_s
