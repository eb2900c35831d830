"""One chunk's forward and backward per microbatch, ``[compute, tp, zero]`` seconds: the
segments' compute, their tensor-parallel collectives (exposed under ``tp_overlap``, with
DTensor's host work and the caches a wait refills on CPU hosts), and ZeRO-3's exposed gathers
and reduce-scatters (:mod:`cost_model.step.stage_costs`, "Chunks").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import (evicted_waits_s, redistribute_host_s,
                                                  zero3_exposed_s)
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.memory.offload import offload_segment_s
from fxplan.cost_model.step.dp_reductions import zero2_reduces_per_microbatch
from fxplan.cost_model.step.layer_costs import SegmentCost
from fxplan.cost_model.step.stage_collectives import (BlockingCollective, collectives_s,
                                                      exposed_tp_s, replicas_beside,
                                                      sm_share_s)

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup

__all__ = ["chunk_times"]


def chunk_times(segs: tuple[SegmentCost, ...], tp_group: tuple[int, ...],
                dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
                optimizer: OptimizerSpec, device: DeviceGroup, waited: BlockingCollective,
                experts: frozenset[str] = frozenset(),
                edp_group: tuple[int, ...] = ()) -> tuple[list[float], list[float]]:
    """``[compute, tp, zero]`` seconds of one chunk's forward and backward; ZeRO-3's
    exposed gathers and reduce-scatters (ZeRO-2's reduce-scatters with ``m > 1``,
    :func:`~cost_model.step.dp_reductions.zero2_reduces_per_microbatch`) by
    :func:`~cost_model.host.host_overhead.zero3_exposed_s`
    with the device's ``comm_overlap`` (expert weights over their ``edp_group`` under expert
    parallelism, plus the host↔device copies of each shard under parameter offload), each
    each a blocking collective of the stage (``waited``,
    :class:`~cost_model.step.stage_collectives.BlockingCollective`)."""
    f = [0.0, 0.0, 0.0]
    b = [0.0, 0.0, 0.0]
    # a tp wait lets another rank of the step run on the core (host_overhead.evicted_waits_s)
    beside = config.pp == 1 or replicas_beside(tp_group, dp_group, cluster)
    for seg in segs:
        f[0] += seg.forward_s
        b[0] += seg.backward_s + seg.recompute_s
        if config.tp_comm_overlap:
            f[1] += (exposed_tp_s(seg.tp_forward, seg.tp_forward_gemm_s, tp_group, cluster)
                     + sm_share_s(seg.tp_sm_forward, tp_group, cluster, device.sm_count))
            b[1] += (exposed_tp_s(seg.tp_backward, seg.tp_backward_gemm_s, tp_group, cluster)
                     + sm_share_s(seg.tp_sm_backward, tp_group, cluster, device.sm_count))
        else:
            f[1] += collectives_s(seg.tp_forward, tp_group, cluster)
            b[1] += collectives_s(seg.tp_backward, tp_group, cluster)
        if device.host:
            # DTensor's host work per redistribution, and the caches refilled after a wait
            # that let another replica's rank run (host_overhead; CPU hosts only)
            f[1] += (redistribute_host_s(len(seg.tp_forward), device.host)
                     + evicted_waits_s(len(seg.tp_forward), device.host, beside))
            b[1] += (redistribute_host_s(len(seg.tp_backward), device.host)
                     + evicted_waits_s(len(seg.tp_backward), device.host, beside))
    if config.zero_stage == 3 and config.dp > 1 or zero2_reduces_per_microbatch(config):
        gather, scatter = [], []
        regather = config.zero_stage == 3
        for seg in segs:
            psi = seg.param_count
            mine = sum(n for k, n in seg.params.items() if k in experts)
            ag = regather * waited("all_gather", optimizer.gather_bytes * (psi - mine), dp_group)
            rs = waited("reduce_scatter", optimizer.grad_bytes * (psi - mine), dp_group)
            if mine:
                ag += regather * waited("all_gather", optimizer.gather_bytes * mine, edp_group)
                rs += waited("reduce_scatter", optimizer.grad_bytes * mine, edp_group)
            h2d, d2h = offload_segment_s(config, psi, device, expert_params=mine)
            gather.append(ag + h2d)
            scatter.append(rs + d2h)
        f[2], b[2] = zero3_exposed_s([seg.forward_s for seg in segs],
                                     [seg.backward_s + seg.recompute_s for seg in segs],
                                     gather, scatter, device.comm_overlap)
    return f, b
