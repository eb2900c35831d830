"""A stage's collectives as the step prices them: each collective's α-β time memoised on its
exact arguments (:func:`collective_s`, the planner's hot path), a blocking one with the cache
refill its wait costs on time-shared cores (:class:`BlockingCollective`), and tensor-parallel
communication under ``tp_overlap`` — only what exceeds the GEMM it is pipelined with
(:func:`exposed_tp_s`), plus the compute the GEMM loses to the SMs Transformer Engine's
userbuffers kernels hold meanwhile (:func:`sm_share_s`). The model these terms join is
:mod:`cost_model.step.stage_costs`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Iterable, Sequence

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.comm.collectives import collective_time_s
from fxplan.cost_model.host.host_overhead import evicted_waits_s

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup

__all__ = ["BlockingCollective", "UB_COMM_SMS", "collective_s", "collectives_s", "exposed_tp_s",
           "replicas_beside", "sm_share_s", "wait_refill_s"]


@lru_cache(maxsize=1 << 16)
def collective_s(kind: str, nbytes: float, group: tuple[int, ...], cluster: Cluster) -> float:
    """:func:`collective_time_s`, memoised on the exact arguments (the planner's hot path)."""
    return collective_time_s(kind, nbytes, group, cluster)


@dataclass(frozen=True)
class BlockingCollective:
    """How a stage prices a blocking collective: its time (:func:`collective_s`) plus, where it
    moves anything, the cache refill its wait costs on time-shared cores (``refill_s``,
    :func:`wait_refill_s`: 0 without host costs, on every GPU spec)."""

    cluster: Cluster
    refill_s: float = 0.0

    def __call__(self, kind: str, nbytes: float, group: tuple[int, ...]) -> float:
        seconds = collective_s(kind, nbytes, group, self.cluster)
        return seconds + self.refill_s if seconds > 0 else seconds


def wait_refill_s(device: DeviceGroup, config: ParallelConfig) -> float:
    """What each blocking collective of a single-stage plan adds on time-shared cores: one
    refill of the waiting rank's caches (:func:`~cost_model.host.host_overhead.evicted_waits_s`),
    since every rank on the node runs the same step and its core runs another's work
    meanwhile. With ``pp > 1`` the ranks beside it run other stages, busy or idle as the
    schedule has it: only the tensor-parallel waits beside another replica are priced
    (:func:`replicas_beside`)."""
    return evicted_waits_s(1, device.host, config.pp == 1)


def collectives_s(events: Iterable[tuple[str, float]], group: tuple[int, ...],
                  cluster: Cluster) -> float:
    """Seconds of the collectives ``events`` (``(kind, bytes)`` each) over ``group``, one after
    another: ``Σ t_i``."""
    return sum(collective_s(kind, nbytes, group, cluster) for kind, nbytes in events)


def exposed_tp_s(events: Sequence[tuple[str, float]], gemm_s: Sequence[float],
                 group: tuple[int, ...], cluster: Cluster) -> float:
    """Tensor-parallel communication left on the critical path under ``tp_overlap``: each
    collective ``i`` pipelined with its GEMM (``gemm_s[i]``, 0 where it has none) costs
    ``max(0, t_i − g_i)``: chunk ``k`` of the GEMM runs while chunk ``k+1`` is exchanged, so
    the pair takes ``max(t_i, g_i)`` and only communication longer than its GEMM shows."""
    hide = list(gemm_s) + [0.0] * (len(events) - len(gemm_s))
    return sum(max(0.0, collective_s(kind, nbytes, group, cluster) - g)
               for (kind, nbytes), g in zip(events, hide))


#: SMs a Transformer Engine userbuffers ``pipeline`` or ``bulk`` communication kernel runs on
#: (``initialize_ub``'s default ``num_sm``: 16 for those methods, 1 for ``ring_exchange``,
#: whose copies run on the copy engines, ``use_ce``); Megatron-Core's ``--tp-comm-overlap``
#: passes no ``ub_cfgs`` of its own, so the defaults hold.
UB_COMM_SMS = 16


def sm_share_s(events: Sequence[tuple[str, float]], group: tuple[int, ...], cluster: Cluster,
               sm_count: int) -> float:
    """Seconds the GEMMs beside the SM-holding collectives ``events`` lose:
    ``Σ t_i · n/(N − n)`` with ``n = UB_COMM_SMS`` and ``N = sm_count`` (module docstring);
    0 when the device's SM count is not given (or leaves no SM beside the kernel)."""
    if sm_count <= UB_COMM_SMS or not events:
        return 0.0
    return collectives_s(events, group, cluster) * UB_COMM_SMS / (sm_count - UB_COMM_SMS)


def replicas_beside(tp_group: tuple[int, ...], dp_group: tuple[int, ...],
                    cluster: Cluster) -> bool:
    """Whether another data-parallel replica of the stage has ranks on the node of its tp
    group (the replicas run side by side there: :func:`~cost_model.host.host_overhead.
    evicted_waits_s`)."""
    node = cluster.node_of(tp_group[0])
    return any(cluster.node_of(rank) == node for rank in dp_group if rank != tp_group[0])
