"""A chunk's gradient buckets: when each is ready in its last backward and what reducing it
over dp costs (:mod:`cost_model.step.stage_costs`, "Data parallelism").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import ddp_buckets
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.step.dp_reductions import zero1_broadcasts, zero2_reduces_per_microbatch
from fxplan.cost_model.step.layer_costs import SegmentCost
from fxplan.cost_model.step.stage_collectives import BlockingCollective

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["gradient_buckets"]


def gradient_buckets(segs: tuple[SegmentCost, ...], labels: list[str],
                     stage_params: dict[str, float],
                     dp_group: tuple[int, ...], cluster: Cluster, config: ParallelConfig,
                     optimizer: OptimizerSpec, waited: BlockingCollective,
                     experts: frozenset[str] = frozenset(),
                     edp_group: tuple[int, ...] = (), tp_group: tuple[int, ...] = ()
                     ) -> tuple[tuple[float, float], ...]:
    """Gradient buckets of one chunk as ``(fraction of its last backward, seconds)``; also
    collects the chunk's parameters into ``stage_params`` (a layer's under its label, the
    others' — embeddings, head, possibly tied — under their canonical names). Under expert
    parallelism the gradients of ``experts`` are reduced over their ``edp_group`` instead,
    and with ``tp > 1`` summed over ``tp_group`` too (each tp rank's copy saw its share of
    the rows: :mod:`fxplan.runtime.styles.expert_tp`)."""
    total = sum(seg.backward_s + seg.recompute_s for seg in segs) or 1.0
    elapsed, out = 0.0, []
    kind = ("all_reduce" if config.zero_stage == 0 or zero1_broadcasts(config)
            else "reduce_scatter")
    # PyTorch DDP (tp = 1, ZeRO-0 / ZeRO-1) packs the dense gradients into its own buckets.
    ddp_cap = (cluster.device(dp_group[0]).ddp_bucket_mib
               if kind == "all_reduce" and config.tp == 1 and not experts else 0.0)
    dense: list[tuple[float, float]] = []
    for seg, label in zip(reversed(segs), reversed(labels)):
        elapsed += seg.backward_s + seg.recompute_s
        prefix = f"{label}:" if label.startswith("L") else ""
        new = {prefix + k: n for k, n in seg.params.items() if prefix + k not in stage_params}
        stage_params.update(new)
        if config.zero_stage < 3 and config.dp > 1 and new and not zero2_reduces_per_microbatch(config):
            mine = sum(n for k, n in new.items() if k.rpartition(":")[2] in experts)
            dense.append((elapsed / total, optimizer.grad_bytes * (sum(new.values()) - mine)))
            if mine:
                out.append((elapsed / total, waited(kind, optimizer.grad_bytes * mine,
                                                     edp_group)))
            if mine and len(tp_group) > 1:
                out.append((elapsed / total, waited(
                    "all_reduce", optimizer.grad_bytes * mine, tp_group)))
    out += [(f, waited(kind, nbytes, dp_group))
            for f, nbytes in ddp_buckets(dense, ddp_cap)]
    return tuple(sorted(out))
