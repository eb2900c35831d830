"""Cost of changing a tensor's placements on a :class:`~cost_model.comm.mesh.LogicalMesh`.

A reshard changes each mesh axis whose placement differs. One axis of size ``n``, the
tensor's current local buffer ``b`` bytes (before the step), takes one of these steps
(sizes in nccl-tests convention, priced by :func:`cost_model.comm.collectives.collective_time_s`
over the axis's slowest group):

    src → dst   step                     collective size   local buffer after
    X   → X     nothing                  –                 b
    S(i)→ R     all-gather               n·b               n·b
    P   → R     all-reduce               b                 b
    P   → S(i)  reduce-scatter           b                 b/n
    S(i)→ S(j)  all-to-all               b                 b      (dim i ×n, dim j ÷n)
                or all-gather + slice    n·b               b      (whichever is cheaper)
    R   → S(i)  local slice: free        –                 b/n
    R   → P     local, free by convention: one rank keeps the value, the others zero it
    S(i)→ P     local, free by convention: each rank zero-pads its shard to the full size
                (n·b); torch's ``redistribute`` refuses both "→ P" cases, the rewrite pass
                builds them with ``DTensor.from_local``

Several axes: the steps run one axis after another, each inside the groups of its axis. A
tensor dim sharded by several axes is split outer axis first (torch's nesting), so an axis may
add, drop or move a shard of dim ``i`` only while no later axis shards ``i`` (``S(0)S(0) →
RR`` gathers tp, then dp). Both the order and detours matter,
because each step changes the local buffer the next one moves. ``PP → RR`` on a (dp, tp) mesh
is cheapest as tp: P→S(0) (reduce-scatter), dp: P→R (all-reduce of 1/tp of the tensor),
tp: S(0)→R (all-gather), not as two all-reduces. So the cheapest sequence is a shortest path
(Dijkstra) over the placement states ``{R, S(0), …, S(d−1)}`` per axis (plus ``P`` on the
axes whose destination is ``P``: partial detours are not taken), one axis changing per edge,
priced by the table above; the direct orders of the changing axes are among the paths.
A 3-D mesh and a 3-D tensor have 125 states. Results are memoized, since the planner asks the
same question for every edge of the graph.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence, Union

from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.comm.mesh import LogicalMesh
from fxplan.core.placements import Partial, Placement, Replicate, Shard, format_placements, local_shape, parse_placements

__all__ = ["ReshardStep", "ReshardCost", "reshard_cost"]

#: A compact placement string (``"S(0)R"``) or one placement per mesh axis.
PlacementsLike = Union[str, Sequence[Placement]]


@dataclass(frozen=True)
class ReshardStep:
    """One axis changing: ``kind`` (a collective, ``"slice"`` or ``"local"``), the collective
    size in bytes (0 for local steps) and its seconds."""

    axis: str
    src: str
    dst: str
    kind: str
    nbytes: int
    time_s: float

    def __str__(self) -> str:
        return f"{self.axis}: {self.src}→{self.dst} {self.kind} {self.nbytes} B {self.time_s * 1e6:.1f} µs"


@dataclass(frozen=True)
class ReshardCost:
    """Total seconds and the steps in the order they run."""

    time_s: float
    steps: tuple[ReshardStep, ...]


def _as_placements(value: PlacementsLike, ndim: int) -> tuple[Placement, ...]:
    placements = parse_placements(value) if isinstance(value, str) else tuple(value)
    if len(placements) != ndim:
        raise ValueError(f"{format_placements(placements)!r} has {len(placements)} placements for a "
                         f"{ndim}-D mesh")
    return placements


def reshard_cost(src: PlacementsLike, dst: PlacementsLike, global_shape: Sequence[int],
                 dtype_bytes: int, mesh: LogicalMesh) -> ReshardCost:
    """Cheapest sequence of per-axis steps taking a tensor of ``global_shape`` (elements of
    ``dtype_bytes`` bytes) from placements ``src`` to ``dst`` (``"S(0)R"`` or placement
    objects, one per mesh axis). See the module docstring for the cases."""
    src_p, dst_p = _as_placements(src, mesh.ndim), _as_placements(dst, mesh.ndim)
    for placement in (*src_p, *dst_p):
        if isinstance(placement, Shard) and not -len(global_shape) <= placement.dim < len(global_shape):
            raise ValueError(f"{placement} does not fit a tensor of shape {tuple(global_shape)}")
    return _cheapest(src_p, dst_p, tuple(int(d) for d in global_shape), int(dtype_bytes), mesh)


@lru_cache(maxsize=1 << 16)
def _cheapest(src: tuple[Placement, ...], dst: tuple[Placement, ...], shape: tuple[int, ...],
              dtype_bytes: int, mesh: LogicalMesh) -> ReshardCost:
    """Dijkstra from ``src`` to ``dst`` over placement states (module docstring)."""
    src, dst = _canonical(src, shape), _canonical(dst, shape)
    options = (Replicate(), *(Shard(d) for d in range(len(shape))))
    # an axis of size 1 holds the whole tensor whatever its placement says
    src = tuple(d if n == 1 else p for p, d, n in zip(src, dst, mesh.shape))
    done: set[tuple[Placement, ...]] = set()
    queue: list[tuple[float, int, tuple[Placement, ...], tuple[ReshardStep, ...]]] = [(0.0, 0, src, ())]
    tie = itertools.count(1)
    while queue:
        time_s, _, state, steps = heapq.heappop(queue)
        if state == dst:
            return ReshardCost(time_s, steps)
        if state in done:
            continue
        done.add(state)
        local = list(local_shape(shape, state, mesh.shape))
        for axis in range(mesh.ndim):
            # P is entered only where the destination asks for it (no partial detours)
            for target in (*options, Partial()) if isinstance(dst[axis], Partial) else options:
                if target == state[axis] or mesh.shape[axis] == 1 or not _local_to_axis(axis, state, target):
                    continue
                nxt = state[:axis] + (target,) + state[axis + 1:]
                if nxt in done:
                    continue
                step = _axis_step(axis, state[axis], target, local, dtype_bytes, mesh)
                heapq.heappush(queue, (time_s + step.time_s, next(tie), nxt, steps + (step,)))
    raise AssertionError("unreachable: innermost-first gathers then outermost-first shards connect any two states")


def _local_to_axis(axis: int, state: tuple[Placement, ...], target: Placement) -> bool:
    """Whether changing ``axis`` alone is a step inside its groups. A tensor dim sharded by
    several axes is split outer axis first (torch's nesting: chunk = c_a·n_b + c_b), so an axis
    may add, drop or move a shard of dim ``i`` only while no later axis shards ``i``."""
    dims = {p.dim for p in (state[axis], target) if isinstance(p, Shard)}
    return not any(isinstance(p, Shard) and p.dim in dims for p in state[axis + 1:])


def _canonical(placements: tuple[Placement, ...], shape: tuple[int, ...]) -> tuple[Placement, ...]:
    """``Shard(-1)`` → ``Shard(ndim − 1)``, so that states compare equal."""
    return tuple(Shard(p.dim % len(shape)) if isinstance(p, Shard) else p for p in placements)


def _collective(kind: str, nbytes: int, axis: int, mesh: LogicalMesh) -> float:
    """Seconds of ``kind`` along ``axis``: its slowest group (all groups run at once)."""
    groups = mesh.representative_groups(axis)  # one group per distinct node pattern
    return max(collective_time_s(kind, nbytes, g, mesh.cluster) for g in groups)


def _axis_step(axis: int, src: Placement, dst: Placement, local: list[int], dtype_bytes: int,
               mesh: LogicalMesh) -> ReshardStep:
    """The step of the module docstring's table for one axis, ``local`` the shape before it."""
    n = mesh.shape[axis]
    nbytes = math.prod(local) * dtype_bytes
    if isinstance(dst, Partial):
        kind, size, time_s = "local", 0, 0.0
    elif isinstance(src, Replicate):  # → S(i)
        kind, size, time_s = "slice", 0, 0.0
    elif isinstance(src, Partial):  # → R or S(i)
        kind, size = ("all_reduce" if isinstance(dst, Replicate) else "reduce_scatter"), nbytes
        time_s = _collective(kind, size, axis, mesh)
    elif isinstance(dst, Replicate):  # S(i) → R
        kind, size = "all_gather", nbytes * n
        time_s = _collective(kind, size, axis, mesh)
    else:  # S(i) → S(j)
        a2a = _collective("all_to_all", nbytes, axis, mesh)
        gather = _collective("all_gather", nbytes * n, axis, mesh)
        kind, size, time_s = ("all_to_all", nbytes, a2a) if a2a <= gather else ("all_gather+slice", nbytes * n, gather)
    return ReshardStep(mesh.axis_names[axis], format_placements([src]), format_placements([dst]),
                       kind, int(size), time_s)
