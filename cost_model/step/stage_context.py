"""What pricing one configuration's stages reads before any cost: each chunk's segments by
profile key and label (:func:`chunk_keys`), the model's parts every stage reads
(:class:`ModelParts`), each stage's groups, device and blocking collectives
(:class:`PricedStage`), each layer's recompute policy (:func:`layer_policy`) and a pipeline
rank's own view of the configuration (:func:`rank_view`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.comm.partial_grads import partial_grad_params
from fxplan.cost_model.parallel.context_parallel import CPLayer, cp_layers
from fxplan.cost_model.parallel.expert_parallel import MoELayer, ep_groups, moe_layers
from fxplan.cost_model.step.layer_costs import GraphSegments
from fxplan.cost_model.step.stage_collectives import BlockingCollective, wait_refill_s
from fxplan.cost_model.step.stage_plan import stage_ranks

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import Cluster, DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["ModelParts", "PricedStage", "chunk_keys", "layer_policy", "model_parts", "priced_stage",
           "rank_view"]


def chunk_keys(segments: GraphSegments, config: ParallelConfig) -> list[list[list[tuple[str, str]]]]:
    """``[s][c]`` → ``(profile key, instance label)`` of the chunk's segments in order; the
    label (``pre``, ``post``, ``L<i>``) names the segment's own copy of its parameters."""
    p, v = config.pp, config.virtual_stages
    counts = config.layers_per_stage(len(segments.layers))
    keys: list[list[list[tuple[str, str]]]] = [[[] for _ in range(v)] for _ in range(p)]
    start = 0
    for j, count in enumerate(counts):
        s, c = config.schedule.placement(j, p)
        chunk = [("pre", "pre")] if j == 0 else []
        chunk += [(key, f"L{start + i}") for i, (key, _) in
                  enumerate(segments.layers[start:start + count])]
        if j == len(counts) - 1:
            chunk.append(("post", "post"))
        keys[s][c] = chunk
        start += count
    return keys


@dataclass(frozen=True)
class ModelParts:
    """What every stage of one configuration reads about the model: the MoE layers (``ep >
    1``) and attention layers (``cp > 1``) found in the graph, the expert parameters, the
    microbatch's scale against the capture, the pp group of the loss broadcast and the norm,
    whether FSDP2 shards over dp, the parameters whose gradients come out ``Partial`` under
    sp, the model's buffers ``(name, bytes, dtype)`` and layer paths for DDP's buffer
    broadcasts, and each layer's recompute policy (``policies``)."""

    moe: dict[str, MoELayer]
    attn: dict[str, CPLayer]
    experts: frozenset[str]
    scale: float
    pp_group: tuple[int, ...]
    sharded_dp: bool
    partial: frozenset[str] | set[str]
    buffers: list[tuple[str, float, str]]
    layer_paths: list[str]
    policies: tuple[str, ...] = ()


@dataclass(frozen=True)
class PricedStage:
    """One pipeline stage as priced: its first replica's groups
    (:func:`~cost_model.step.stage_plan.stage_ranks`,
    :func:`~cost_model.parallel.expert_parallel.ep_groups`), its device group and how it prices
    a blocking collective (:class:`~cost_model.step.stage_collectives.BlockingCollective`)."""

    index: int
    tp_group: tuple[int, ...]
    dp_group: tuple[int, ...]
    ep_group: tuple[int, ...]
    edp_group: tuple[int, ...]
    device: DeviceGroup
    waited: BlockingCollective


def model_parts(graph: CapturedGraph, segments: GraphSegments,
                config: ParallelConfig) -> ModelParts:
    """Step 1 of :func:`~cost_model.step.stage_costs.build_stages`: what every stage reads
    about the model."""
    moe = moe_layers(graph) if config.ep > 1 else {}     # expert parallelism: expert_parallel.py
    return ModelParts(
        moe=moe, attn=cp_layers(graph) if config.cp > 1 else {},   # context_parallel.py
        experts=frozenset().union(*(m.expert_params for m in moe.values())),
        scale=config.microbatch_size / segments.batch,
        pp_group=tuple(stage_ranks(config, k)[0][0] for k in range(config.pp)),
        sharded_dp=config.shards_params_with_fsdp, partial=partial_grad_params(graph, config),
        buffers=[(name, float(b.numel() * b.element_size()), str(b.dtype))
                 for name, b in graph.gm.named_buffers()],
        layer_paths=list(graph.layer_names.values()),
        policies=config.layer_recompute(len(segments.layers)))


def priced_stage(s: int, cluster: Cluster, config: ParallelConfig) -> PricedStage:
    """Step 2: stage ``s``'s groups, device and blocking collectives."""
    tp_group, dp_group = stage_ranks(config, s)
    ep_group, edp_group = ep_groups(dp_group, config.ep)
    device = cluster.device(tp_group[0])
    return PricedStage(s, tp_group, dp_group, ep_group, edp_group, device,
                       BlockingCollective(cluster, wait_refill_s(device, config)))


def layer_policy(model: ModelParts, label: str) -> str:
    """The recompute policy of the segment labelled ``label``: layer ``L<i>``'s
    (:meth:`~fxplan.core.config.ParallelConfig.layer_recompute`), ``none`` for ``pre`` and
    ``post`` (never recomputed)."""
    return model.policies[int(label[1:])] if label.startswith("L") else "none"


def rank_view(config: ParallelConfig, model: ModelParts,
              s: int) -> tuple[ParallelConfig, ModelParts]:
    """Pipeline rank ``s``'s configuration (its own ZeRO stage and offload,
    :meth:`~fxplan.core.config.ParallelConfig.at_pipeline_rank`) and model parts (whether
    FSDP2 shards its parameters over dp); ``(config, model)`` with one of each for all ranks."""
    view = config.at_pipeline_rank(s)
    if view is config:
        return config, model
    return view, replace(model, sharded_dp=view.shards_params_with_fsdp)
