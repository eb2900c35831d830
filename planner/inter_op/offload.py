"""Offload and FP8 as search dimensions: the *memory rungs* a candidate climbs, the host
check, and the FP8 choices.

**FP8** is offered only when the constraints allow it (``fp8=True`` or ``[False, True]``;
``fxplan plan --allow-fp8``): it changes the numerics. Allowed on a cluster whose devices have
no FP8 peak it is a :class:`~fxplan.inter_op.constraints.ConstraintError`.

**Offload**:

A candidate of a family is tried at ``(zero, offload)`` rungs in order of decreasing device
memory, and the first rung at which it fits is kept (higher rungs move more bytes at equal
everything else)::

    (0, none) (1, none) (2, none) (3, none)              ZeRO alone
    (1, optimizer) (2, optimizer) (3, optimizer)          ZeRO-Offload, dp > 1
    (0, optimizer)                                        ZeRO-Offload, dp = 1
    (3, optimizer+params)                                 FSDP2's CPU offload, dp > 1

so within a candidate offload is offered only where no ZeRO stage fits without it. The search
offers the offload rungs at all only in a second pass, when its first pass found no candidate
that fits without offload (:meth:`MemoryRungs.start_offload`, called by
:func:`fxplan.inter_op.driver.run_search`; or from the start when the ``offload`` constraint
excludes ``none``): it keeps the search as fast as before
for models that fit, and a plan that fits without offload is not traded for one that copies
over PCIe every step. Per pipeline rank (:mod:`fxplan.inter_op.stage_zero`) the offload rungs
may join in every pass (:meth:`MemoryRungs.per_rank`, with
:data:`fxplan.inter_op.joint_rungs.JOINT_RUNGS`): there a rank offloads only where that lowers the
closed-form step time — its optimizer states on the host free the memory that made it
recompute, or let the split even out. ``(0, optimizer)`` with ``dp > 1`` is
left out: ``(1, optimizer)`` keeps the same device bytes with ``1/dp`` of the host bytes and
of the CPU step. Only the rungs the ``zero_stage`` and ``offload`` constraints allow are
tried, and offload rungs only when every device group's spec gives its host side
(:class:`fxplan.cost_model.memory.offload.HostSide`). A rung fits when the device memory fits and
every node's host memory holds its ranks' offloaded states
(:func:`fxplan.cost_model.memory.offload.with_host_check`). When nothing fits even with offload, the
error adds the host memory a node needs at least (:meth:`MemoryRungs.host_note`): every state
on the host, 16 B per parameter, sharded over the ranks, ``16·Ψ·(N/nodes)/N`` per node.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, Collection, Mapping

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.core.config_error import CostModelError
from fxplan.cost_model.compute.fp8 import check_fp8
from fxplan.cost_model.memory.breakdown import GIB
from fxplan.cost_model.memory.offload import HostSide
from fxplan.inter_op.constraints import ConstraintError
from fxplan.inter_op.profile import SegmentProfile
from fxplan.inter_op.stage_memory import DeviceMemory, stage_rows

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["MemoryRungs", "Rung", "fp8_choices", "host_fit_ranks", "host_fits", "host_missing",
           "memory_rungs", "node_shares", "offload_allows_none"]

#: ``(zero_stage, offload)``.
Rung = tuple[int, str]


def _allows(want: Any, value: Any) -> bool:
    if want is None:
        return True
    return value in want if isinstance(want, Collection) and not isinstance(want, str) \
        else value == want


def offload_allows_none(offload_want: Any) -> bool:
    """Whether the ``offload`` constraint (a value, a collection or ``None``) allows
    ``none``."""
    return _allows(offload_want, "none")


def memory_rungs(dp: int, zero_want: Any = None, offload_want: Any = None,
                 offload_ok: bool = True) -> list[Rung]:
    """The rungs of a family with ``dp`` replicas, in order (module docstring), that the
    constraints ``zero_want`` / ``offload_want`` (a value, a collection or ``None``) allow;
    no offload rung when ``offload_ok`` is false (a device group without its host side)."""
    zeros = (0, 1, 2, 3) if dp > 1 else (0,)
    rungs: list[Rung] = [(z, "none") for z in zeros]
    if offload_ok:
        rungs += ([(z, "optimizer") for z in (1, 2, 3)] + [(3, "optimizer+params")]
                  if dp > 1 else [(0, "optimizer")])
    return [(z, o) for z, o in rungs if _allows(zero_want, z) and _allows(offload_want, o)]


class MemoryRungs:
    """The rungs the search offers, pass by pass: ZeRO alone, then (:meth:`start_offload`)
    with the offload rungs too (module docstring). Offload constrained to anything but
    ``none`` on a cluster without its host side is a :class:`ConstraintError`."""

    def __init__(self, constraints: Mapping[str, Any], cluster: Cluster) -> None:
        self.zero_want, self.offload_want = constraints.get("zero_stage"), constraints.get("offload")
        #: why offload cannot be priced here (:func:`host_missing`), or ``""``
        self.no_offload = host_missing(cluster)
        if self.no_offload and self.offload_want not in (None, "none"):
            raise ConstraintError(f"constraint offload={self.offload_want}: {self.no_offload}")
        #: whether the offload rungs are offered (from the start when ``none`` is not allowed)
        self.offloading = not offload_allows_none(self.offload_want)

    def of(self, dp: int) -> list[Rung]:
        """The rungs of a family with ``dp`` replicas the constraints allow, in order
        (:func:`memory_rungs`)."""
        return memory_rungs(dp, self.zero_want, self.offload_want,
                            self.offloading and not self.no_offload)

    def per_rank(self, dp: int) -> list[Rung]:
        """The rungs a pipeline rank may take in the choice per rank
        (:mod:`fxplan.inter_op.stage_zero`): those of :meth:`of` with the offload rungs in
        every pass, wherever offload can be priced and the constraints allow it — a plan that
        fits on the device may still offload one rank where that makes it faster."""
        return memory_rungs(dp, self.zero_want, self.offload_want, not self.no_offload)

    def start_offload(self) -> bool:
        """Offer the offload rungs from now on; ``False`` (nothing changes) when they are
        offered already or offload cannot be priced here."""
        if self.offloading or self.no_offload:
            return False
        self.offloading = True
        return True

    def host_note(self, num_params: int, cluster: Cluster) -> str:
        """When offload was tried: the host memory a node needs at least, 16 B per parameter
        of the whole model over the nodes (every state on the host, sharded over every rank),
        against the spec's host memory (the device figure of the error may then fit)."""
        if not self.offloading or self.no_offload:
            return ""
        device = cluster.device(0)
        need = 16.0 * num_params * cluster.devices_per_node() / cluster.num_devices
        return (f" Offload was tried as well: with every optimizer state and parameter shard "
                f"in host memory a node needs at least 16 B/param × {num_params / 1e9:.3g} G "
                f"params / {cluster.num_nodes} node(s) = {need / GIB:.0f} GiB of host memory "
                f"(it has {device.host_memory_gib:g} GiB).")


def host_missing(cluster: Cluster) -> str:
    """Why offload cannot be priced on ``cluster`` (the first group without its host side),
    or ``""``."""
    for group in cluster.device_groups:
        try:
            HostSide.of(group)
        except CostModelError as err:
            return str(err)
    return ""


def host_fits(c: ParallelConfig, prof: SegmentProfile, mem: DeviceMemory,
              cluster: Cluster) -> bool:
    """Whether every node's host memory holds the offloaded states of ``c`` (always true
    without offload)."""
    if c.offload == "none":
        return True
    return bool(host_fit_ranks(c, stage_rows(c, prof, mem).rows["host"], cluster).all())


def fp8_choices(constraints: Mapping[str, Any], cluster: Cluster) -> tuple[bool, ...]:
    """The ``fp8`` values the search tries: ``(False,)`` unless the constraints allow FP8;
    :class:`ConstraintError` when they allow it on devices without an FP8 peak."""
    want = constraints.get("fp8")
    choices = (False,) if want is None else tuple(
        sorted(set(want) if isinstance(want, Collection) else {want}))
    if True in choices:
        try:
            check_fp8(cluster)
        except CostModelError as err:
            raise ConstraintError(f"constraint fp8: {err}") from None
    return choices


@lru_cache(maxsize=64)
def _host_layout(cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """Per rank of ``cluster``: its node, and its node's host memory in bytes (``inf`` where
    its group gives no host side: nothing is offloaded there)."""
    def host_memory(rank: int) -> float:
        try:
            return HostSide.of(cluster.device(rank)).memory
        except CostModelError:
            return np.inf

    ranks = range(cluster.num_devices)
    nodes = np.array([cluster.node_of(r) for r in ranks], dtype=np.int64)
    caps = np.array([host_memory(r) for r in ranks], dtype=float)
    nodes.setflags(write=False)
    caps.setflags(write=False)
    return nodes, caps


def node_shares(c: ParallelConfig, cluster: Cluster) -> tuple[np.ndarray, np.ndarray]:
    """``(shares, caps)``: ``shares[N, s]`` the devices of pipeline rank ``s`` of ``c`` on node
    ``N`` (rank ``r`` runs pipeline rank ``r // (dp·tp)``, as :func:`host_fit_ranks` reads
    it) and ``caps[N]`` the node's host bytes (``inf`` without a host side)."""
    nodes, caps = _host_layout(cluster)
    shares = np.zeros((int(nodes.max()) + 1, c.pp))
    np.add.at(shares, (nodes, np.arange(len(nodes)) // (c.dp * c.tp)), 1.0)
    node_caps = np.full(len(shares), np.inf)
    node_caps[nodes] = caps
    return shares, node_caps


def host_fit_ranks(c: ParallelConfig, host: np.ndarray, cluster: Cluster) -> np.ndarray:
    """Per pipeline rank of ``c`` (``host``: the host bytes each keeps): whether the fullest
    node its ranks sit on holds the host bytes of every rank on that node — the
    ``host_fits`` of :func:`~fxplan.cost_model.memory.offload.with_host_check`, as arrays:
    rank ``r`` runs pipeline rank ``r // (dp·tp)``, node ``n`` keeps
    ``H_n = Σ_{r on n} host_{r // (dp·tp)}`` (summed in rank order: the same floats), and
    pipeline rank ``s`` fits when ``H_n ≤ C_n`` or ``H_n = 0`` on its first rank of largest
    ``H_n``."""
    nodes, caps = _host_layout(cluster)
    per_stage = c.dp * c.tp
    stage_of = np.arange(len(nodes)) // per_stage
    totals = np.bincount(nodes, weights=np.asarray(host, dtype=float)[stage_of])[nodes]
    out = np.empty(c.pp, dtype=bool)
    for s in range(c.pp):
        span = slice(s * per_stage, (s + 1) * per_stage)
        worst = int(np.argmax(totals[span])) + s * per_stage
        out[s] = totals[worst] <= caps[worst] or totals[worst] == 0.0
    return out
