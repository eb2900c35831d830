"""Costs between pipeline stages: the blocking sends of each chunk's output and its input's
gradient (:func:`p2p_sends`) and the gradient all-reduce of a weight tied across stages
(:func:`tied_sync`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.step.layer_costs import SegmentCost
from fxplan.cost_model.step.stage_collectives import collective_s
from fxplan.cost_model.step.stage_plan import stage_ranks

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster

__all__ = ["boundary_send_s", "p2p_sends", "tied_sync"]


def p2p_sends(chunks: Sequence[Sequence[Sequence[SegmentCost]]], forward: np.ndarray,
              backward: np.ndarray, config: ParallelConfig, cluster: Cluster) -> None:
    """Fill row 3 (blocking sends) of ``forward``/``backward`` (``[row, stage, chunk]``):
    each virtual stage's output sent to the next one on another stage
    (:mod:`cost_model.step.stage_costs`, "p2p")."""
    p, v = config.pp, config.virtual_stages
    last = p * v - 1
    for j in range(last):
        s, c = config.schedule.placement(j, p)
        s2, c2 = config.schedule.placement(j + 1, p)
        if s2 == s:
            continue
        seconds = boundary_send_s(config, chunks[s][c][-1].output_bytes, s, s2, cluster)
        forward[3, s, c] += seconds
        backward[3, s2, c2] += seconds


def boundary_send_s(config: ParallelConfig, message: float, s: int, s2: int,
                    cluster: Cluster) -> float:
    """Seconds of one blocking send of a chunk's output (``message`` bytes on each tp rank)
    from pipeline rank ``s`` to ``s2``, between their first replicas: under sequence
    parallelism each tp rank sends its own shard; without it each sends ``1/tp`` of the
    replicated tensor and the receivers all-gather it (Megatron's scatter–gather)."""
    tp = config.tp
    a, b = stage_ranks(config, s)[0][0], stage_ranks(config, s2)[0][0]
    if config.sequence_parallel or tp == 1:
        return collective_s("send_recv", message, (a, b), cluster)
    return (collective_s("send_recv", message / tp, (a, b), cluster)
            + collective_s("all_gather", message, stage_ranks(config, s2)[0], cluster))


def tied_sync(params: list[dict[str, float]], post: np.ndarray, config: ParallelConfig,
              cluster: Cluster, optimizer: OptimizerSpec) -> None:
    """All-reduce the gradient of a weight held by several stages among them; where the
    holders' ZeRO stages keep that gradient in different dp layouts (``zero_stages``: FSDP2's
    shard on one rank, the whole gradient on another), each sharded holder also all-gathers
    it over dp first (:class:`fxplan.runtime.apply.tied.TiedGradSync`)."""
    holders: dict[str, list[int]] = {}
    for s, stage_params in enumerate(params):
        for name in stage_params:
            if ":" not in name:  # layers' parameters (``L<i>:name``) live on one stage
                holders.setdefault(name, []).append(s)
    for name, stages in holders.items():
        if len(stages) > 1:
            group = tuple(stage_ranks(config, s)[0][0] for s in stages)
            nbytes = optimizer.grad_bytes * params[stages[0]][name]
            seconds = collective_s("all_reduce", nbytes, group, cluster)
            sharded = [config.at_pipeline_rank(s).shards_params_with_fsdp for s in stages]
            for s, shard in zip(stages, sharded):
                post[s] += seconds
                if shard and not all(sharded):
                    post[s] += collective_s("all_gather", nbytes, stage_ranks(config, s)[1],
                                            cluster)
