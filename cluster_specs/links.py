"""``LinkLevel``: one level of the interconnect hierarchy, one entry of ``levels``.

Levels are listed innermost (fastest) first. A level's **scope** is the number of nodes it
joins: ``node`` (1) joins the devices of one node (NVLink, NVSwitch, Infinity Fabric, PCIe,
loopback); an integer ``s ≥ 2`` joins the devices of each **domain** of ``s`` consecutive
nodes — nodes ``[i·s, (i+1)·s)``, the last domain holding what is left — through a switched
fabric every device reaches on its own links (a GB200 NVL72 rack: 18 trays of 4 GPUs on one
NVLink switch system); ``cluster`` (all) joins every node. A node or domain level's
``bandwidth_gb_per_s`` is per device and per direction. The cluster level joins nodes through
``nics_per_node`` NICs each; its ``bandwidth_gb_per_s`` is per NIC and per direction. Collectives reach
``bandwidth_gb_per_s × efficiency`` (their bus bandwidth); ``allreduce_bandwidth_gb_per_s``,
where present, is the all-reduce bus bandwidth reached with in-network reduction (NVLink
SHARP), as measured, so no efficiency is applied to it. ``reduce_scatter_as_all_reduce``
says that the backend runs a reduce-scatter as an all-reduce of its whole input (gloo:
``_reduce_scatter_base`` is a ``gloo:all_reduce``), and the cost model prices it so.
``step_cpu_us`` maps a collective kind to the CPU time each rank spends per step of its
algorithm beyond the hop's ``latency_us`` (gloo on CPU ranks: its threads' copies, syscalls
and wake-ups per message, measured; ``local-cpu`` gives it at the ranks' core share), which
the cost model adds to every step inside a node (absent: 0, as for GPU links).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from fxplan.cluster_specs.frozen import freeze

#: Level kinds allowed for each scope (``domain``: an integer scope of ``s ≥ 2`` nodes).
LEVEL_KINDS: dict[str, tuple[str, ...]] = {
    "node": ("nvlink", "nvswitch", "pcie", "loopback", "infinity_fabric"),
    "domain": ("nvlink", "nvswitch", "infinity_fabric"),
    "cluster": ("infiniband", "roce", "ethernet"),
}

#: Collective kinds a level may give a per-step CPU cost for (``step_cpu_us``): the cost
#: model's kinds (``cost_model.comm.collectives.KINDS``).
COLLECTIVE_KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter",
                                     "all_to_all", "broadcast", "send_recv")

#: Scopes written as words, innermost first; a domain scope is written as its number of nodes.
SCOPES: tuple[str, ...] = ("node", "cluster")


def scope_class(scope: str | int) -> str:
    """``"node"``, ``"domain"`` (an integer scope) or ``"cluster"``: the key of
    :data:`LEVEL_KINDS` for a canonical scope."""
    return scope if isinstance(scope, str) else "domain"


@dataclass(frozen=True, kw_only=True)
class LinkLevel:
    """A link level: bandwidth in GB/s per direction, latency in µs per hop."""

    name: str
    kind: str
    scope: str | int
    bandwidth_gb_per_s: float
    latency_us: float
    efficiency: float
    nics_per_node: int | None = None
    allreduce_bandwidth_gb_per_s: float | None = None
    reduce_scatter_as_all_reduce: bool = False
    step_cpu_us: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_cpu_us", freeze(self.step_cpu_us))

    @property
    def effective_bandwidth_gb_per_s(self) -> float:
        """``bandwidth_gb_per_s × efficiency``: the bus bandwidth collectives reach."""
        return self.bandwidth_gb_per_s * self.efficiency

    @property
    def is_node_scope(self) -> bool:
        return self.scope == "node"

    @property
    def is_cluster_scope(self) -> bool:
        return self.scope == "cluster"

    @property
    def domain_nodes(self) -> int | None:
        """The nodes of one domain of a domain-scope level (its integer scope), else ``None``."""
        return self.scope if isinstance(self.scope, int) else None

    def scope_text(self) -> str:
        """``node``, ``cluster``, or ``18 nodes`` (a domain)."""
        return self.scope if isinstance(self.scope, str) else f"{self.scope} nodes"
