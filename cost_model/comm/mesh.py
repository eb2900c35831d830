"""Logical device mesh: an n-D named view of a Cluster's ranks.

A mesh of shape ``(n_0, …, n_{k-1})`` with axis names ``(a_0, …, a_{k-1})`` lays the ranks
``ranks[0 … Πn−1]`` out in row-major order, the last axis varying fastest. The rank at mesh
coordinate ``(c_0, …, c_{k-1})`` is ``ranks[Σ_i c_i · stride_i]`` with
``stride_i = Π_{j>i} n_j``. So with ranks numbered node by node, the innermost axis (``tp`` in
``pp × dp × tp``) takes consecutive ranks and stays inside a node whenever it is no larger
than a node, and outer axes stride across nodes.

The groups of axis ``i`` are the sets of ranks whose coordinates agree on every axis but
``i``; a collective over axis ``i`` runs in each of them at once. An axis is priced by its
slowest group: the outermost link level any group spans, the lowest per-rank bandwidth and
the highest latency (these differ only on heterogeneous clusters or axes that straddle
node boundaries unevenly).

**Domains** (levels whose scope is a number of nodes, :mod:`cluster_specs.links`): a group of
``t`` consecutive ranks starting at a multiple of ``t`` — the layout of the innermost axis —
lies inside one domain of ``D`` devices exactly when no domain boundary falls strictly inside
it. :func:`domain_straddle` finds the first that does: on a GB200 NVL72 (``D = 72``) tp of 8,
24, 36 or 72 stays in a rack and tp of 16 would cross one (72 = 4·16 + 8), unless the racks hold
64 devices (16 trays). The search prunes such a family (tensor parallelism never crosses a
rack); outer axes (data, pipeline) stride across domains and are priced by the group queries.
"""

from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, LinkLevel

__all__ = ["LogicalMesh", "domain_straddle"]


def domain_straddle(cluster: "Cluster", size: int) -> "tuple[LinkLevel, int] | None":
    """The outermost domain level and the first block of ``size`` consecutive ranks (block
    ``b``: ranks ``[b·size, (b+1)·size)``) that crosses one of its domains' boundaries; ``None``
    when every block lies in one domain of every domain level (or the cluster has none, or the
    blocks lie on single nodes)."""
    if size <= 1:
        return None
    for level in reversed(cluster.domain_levels):
        for block in range(cluster.num_devices // size):
            first, last = block * size, (block + 1) * size - 1
            if cluster.domain_of(first, level) != cluster.domain_of(last, level):
                return level, block
    return None


class LogicalMesh:
    """Named n-D mesh over (a subset of) a cluster's ranks; see the module docstring."""

    def __init__(
        self,
        cluster: "Cluster",
        shape: Sequence[int],
        axis_names: Sequence[str],
        ranks: Sequence[int] | None = None,
    ) -> None:
        self.cluster = cluster
        self.shape = tuple(int(n) for n in shape)
        self.axis_names = tuple(axis_names)
        size = math.prod(self.shape)
        self.ranks = tuple(range(size)) if ranks is None else tuple(ranks)
        if len(self.shape) != len(self.axis_names):
            raise ValueError(
                f"mesh shape {self.shape} has {len(self.shape)} axes but {len(self.axis_names)} "
                f"names {self.axis_names} were given"
            )
        if len(set(self.axis_names)) != len(self.axis_names):
            raise ValueError(f"mesh axis names must be distinct, got {self.axis_names}")
        if any(n < 1 for n in self.shape):
            raise ValueError(f"mesh axis sizes must be ≥ 1, got {self.shape}")
        if size != len(self.ranks):
            raise ValueError(
                f"mesh shape {'×'.join(map(str, self.shape))} = {size} ranks, but "
                f"{len(self.ranks)} ranks were given"
            )
        self._representatives: dict[int, list[tuple[int, ...]]] = {}
        if max(self.ranks, default=0) >= cluster.num_devices:
            raise ValueError(
                f"mesh uses rank {max(self.ranks)} but cluster {cluster.name!r} has only "
                f"{cluster.num_devices} devices"
            )

    # -- identity -----------------------------------------------------------------------
    def _key(self) -> tuple:
        return (id(self.cluster), self.shape, self.axis_names, self.ranks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LogicalMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        """``pp=2 dp=4 tp=8``."""
        return " ".join(f"{name}={n}" for name, n in zip(self.axis_names, self.shape))

    def __repr__(self) -> str:
        return f"LogicalMesh({self}, ranks {self.ranks[0]}..{self.ranks[-1]})"

    # -- axes ---------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def axis_index(self, axis: int | str) -> int:
        if isinstance(axis, str):
            if axis not in self.axis_names:
                raise KeyError(f"mesh has no axis {axis!r}; axes are {self.axis_names}")
            return self.axis_names.index(axis)
        if not -self.ndim <= axis < self.ndim:
            raise IndexError(f"axis {axis} out of range for a {self.ndim}-D mesh")
        return axis % self.ndim

    def axis_size(self, axis: int | str) -> int:
        return self.shape[self.axis_index(axis)]

    def axis_groups(self, axis: int | str) -> list[tuple[int, ...]]:
        """All rank groups along ``axis`` (ranks agreeing on every other coordinate)."""
        return self._groups[self.axis_index(axis)]

    def axis_group(self, axis: int | str, rank: int | None = None) -> tuple[int, ...]:
        """The group along ``axis`` that contains ``rank`` (default: the mesh's first rank)."""
        rank = self.ranks[0] if rank is None else rank
        for group in self.axis_groups(axis):
            if rank in group:
                return group
        raise ValueError(f"rank {rank} is not in mesh {self}")

    @cached_property
    def _groups(self) -> list[list[tuple[int, ...]]]:
        groups: list[list[tuple[int, ...]]] = []
        for i, n in enumerate(self.shape):
            stride = math.prod(self.shape[i + 1 :])
            block = n * stride
            axis_groups = []
            for outer in range(0, self.size, block):
                for inner in range(stride):
                    start = outer + inner
                    axis_groups.append(tuple(self.ranks[start + k * stride] for k in range(n)))
            groups.append(axis_groups)
        return groups

    def representative_groups(self, axis: int | str) -> list[tuple[int, ...]]:
        """One representative group per distinct (node pattern) so that pricing an axis of a
        3072-rank mesh looks at a handful of groups, not hundreds."""
        index = self.axis_index(axis)
        if index in self._representatives:
            return self._representatives[index]
        seen: dict[tuple, tuple[int, ...]] = {}
        for group in self.axis_groups(index):
            nodes = [self.cluster.node_of(r) for r in group]
            pattern = (
                tuple(n - nodes[0] for n in nodes),
                tuple(self.cluster.device(r).name for r in group),
                # groups of one node pattern may lie in one domain or cross a domain boundary
                tuple(tuple(self.cluster.domain_of(r, level) - self.cluster.domain_of(group[0], level)
                            for r in group) for level in self.cluster.domain_levels),
            )
            seen.setdefault(pattern, group)
        self._representatives[index] = list(seen.values())
        return self._representatives[index]

    def axis_level(self, axis: int | str) -> "LinkLevel":
        """Outermost link level spanned by any group of the axis."""
        levels = self.cluster.levels
        spanned = [self.cluster.group_level(g) for g in self.representative_groups(axis)]
        return max(spanned, key=lambda level: [l.name for l in levels].index(level.name))
