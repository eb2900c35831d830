"""What a stage runs after the step's last backward: its blocking reductions (the loss and
norm scalars, sequence parallelism's partial-sum gradients, DDP's buffer broadcasts), the
optimizer row (the memory-bound step and its host loop) and the updated parameters' gather
back to every dp rank, hidden behind the next forward under ``pg_overlap``
(:mod:`cost_model.step.stage_costs`, "Data parallelism").
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.comm.step_scalars import step_scalars_s
from fxplan.cost_model.compute.op_time import op_time_s
from fxplan.cost_model.host.host_overhead import (async_batch_s, ddp_buffer_bytes, ddp_host_s,
                                                  ddp_runs, dtensor_params, optimizer_host_s,
                                                  pipeline_host_s)
from fxplan.cost_model.memory.breakdown import OptimizerSpec
from fxplan.cost_model.step.dp_reductions import zero1_broadcasts
from fxplan.cost_model.step.stage_context import ModelParts, PricedStage

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.cluster_specs import DeviceGroup
    from fxplan.passes.captured_graph import CapturedGraph

__all__ = ["hidden_gather", "optimizer_row", "optimizer_s", "step_host_s", "step_reductions",
           "updated_params_gather"]


@lru_cache(maxsize=1 << 12)
def optimizer_s(optimizer: OptimizerSpec, params: float, tensors: int, dtensor: bool,
                device: DeviceGroup) -> float:
    """Memory-bound optimizer step over ``params`` local parameters in ``tensors`` tensors,
    its host work (:func:`step_host_s`): ``op_time(12·Ψ FLOPs, 28·Ψ bytes) + t_host``."""
    return (op_time_s("elementwise", optimizer.step_flops * params, optimizer.step_bytes * params,
                      torch.float32, device)
            + step_host_s(tensors, dtensor, device))


def step_host_s(tensors: int, dtensor: bool, device: DeviceGroup) -> float:
    """The optimizer's per-tensor host loop (:func:`~cost_model.host.host_overhead.
    optimizer_host_s`) and the training loop's fixed host work per step (``step_overhead_us``):
    ``t_opt_host + step_overhead_us``, 0 without host costs (the GPU specs)."""
    host = device.host
    if not host:
        return 0.0
    return optimizer_host_s(tensors, host, dtensor=dtensor) + host.step_overhead_us * 1e-6


def step_reductions(graph: CapturedGraph, config: ParallelConfig, optimizer: OptimizerSpec,
                    model: ModelParts, stage: PricedStage, keys: list[list[tuple[str, str]]],
                    stage_params: dict[str, float]) -> float:
    """Step 5: the stage's blocking collectives after the step's last backward — the
    trainer's loss and gradient-norm scalars (:mod:`cost_model.comm.step_scalars`), under sp the
    replicated parameters' partial-sum gradients (one flattened all-reduce), and where DDP
    runs its broadcast of the stage's buffers (one per dtype)."""
    waited = stage.waited
    seconds = step_scalars_s(
        config, {"pp": model.pp_group, "dp": stage.dp_group, "tp": stage.tp_group}, waited,
        sharded_dp=model.sharded_dp)
    psi_p = sum(n for k, n in stage_params.items() if k in model.partial)
    if psi_p:
        seconds += waited("all_reduce", optimizer.grad_bytes * psi_p, stage.tp_group)
    if ddp_runs(config):
        stage_layers = [graph.layer_names.get(int(label[1:]), "") for chunk in keys
                        for _, label in chunk if label.startswith("L")]
        seconds += sum(waited("broadcast", nbytes, stage.dp_group)
                       for nbytes in ddp_buffer_bytes(model.buffers, model.layer_paths,
                                                      stage_layers, first=stage.index == 0))
    return seconds


def optimizer_row(config: ParallelConfig, optimizer: OptimizerSpec, stage: PricedStage,
                  stage_params: dict[str, float], local: float) -> float:
    """Step 6: the optimizer row — the step over ``local`` parameters (:func:`optimizer_s`;
    offloaded, only its host loop: the host's memory traffic is the offload row's), the
    pipeline schedule's and DDP's host work per step (CPU hosts)."""
    device = stage.device
    # ZeRO-1 without FSDP (tp = ep = 1: not shards_params_with_fsdp) steps only the tensors
    # its rank owns (ZeroRedundancyOptimizer).
    owned = config.dp if zero1_broadcasts(config) else 1
    tensors = -(-len(stage_params) // owned)
    seconds = (optimizer_s(optimizer, local, tensors, dtensor_params(config), device)
               if config.offload == "none" else
               step_host_s(tensors, dtensor_params(config), device))
    if config.pp > 1 and device.host:   # the pipeline schedule's per step (host_overhead)
        seconds += pipeline_host_s(device.host)[2]
    if ddp_runs(config) and device.host:   # DDP's hooks and bucket copies (host_overhead)
        seconds += ddp_host_s(len(stage_params), device.host)
    return seconds


def updated_params_gather(config: ParallelConfig, optimizer: OptimizerSpec, stage: PricedStage,
                          stage_params: dict[str, float], psi: float, psi_e: float) -> float:
    """Step 7: the updated parameters back to every dp rank (ZeRO-1/2) — as
    ``ZeroRedundancyOptimizer`` does it, each tensor broadcast from its owner, all issued async
    and waited once, or one all-gather (the experts' over their dp/ep replicas)."""
    waited, dp_group = stage.waited, stage.dp_group
    if zero1_broadcasts(config):
        host = stage.device.host
        return async_batch_s(
            [waited("broadcast", optimizer.param_bytes * n, dp_group)
             for n in stage_params.values()],
            # its latency: the same broadcast of one byte (0 bytes is priced 0); the batch is
            # waited once, so one refill
            [waited("broadcast", 1.0, dp_group)] * len(stage_params),
            host.queued_collective_us * 1e-6 if host else 0.0)
    if config.zero_stage in (1, 2):
        return (waited("all_gather", optimizer.gather_bytes * (psi - psi_e), dp_group)
                + waited("all_gather", optimizer.gather_bytes * psi_e, stage.edp_group))
    return 0.0


def hidden_gather(gather_s: float, forward_s: float, config: ParallelConfig) -> float:
    """What the parameter gather after the optimizer step leaves on the critical path:
    all of it, or under ``pg_overlap`` (Megatron-Core ``--overlap-param-gather``: each bucket
    all-gathered before its module's first forward of the next step) only what exceeds the
    stage's forward of one microbatch, ``max(0, t_gather − t_forward)`` — the gathers stream
    ahead of the first microbatch's forward, which waits on each bucket in turn."""
    if not config.param_gather_overlap:
        return gather_s
    return max(0.0, gather_s - forward_s)
