"""Offload and FP8 at run time: what the runtime can run, and the pieces PyTorch gives for it.

Offload runs as the cost model prices it (:mod:`fxplan.cost_model.memory.offload`):

* ``offload=optimizer`` — DeepSpeed's ZeRO-Offload: the parameters and gradients stay on the
  device under the plan's ZeRO stage; the optimizer keeps fp32 master weights and its moments
  in host memory, and each step copies the (clipped) gradients down, steps there and copies
  the updated weights back (:mod:`fxplan.runtime.train.host_optimizer`, built by
  :func:`~fxplan.runtime.styles.data_parallel.make_optimizer`). Runnable at every ZeRO stage,
  dp and tp, ZeRO-1's ``ZeroRedundancyOptimizer`` included (its partition steps on the host).
* ``offload=optimizer+params`` — FSDP2's CPU offload: ``fully_shard(...,
  offload_policy=CPUOffloadPolicy())`` keeps each rank's fp32 parameter shard, its gradient
  and the optimizer states in host memory, copies the shard to the device before each
  all-gather and the reduce-scattered gradient back, and the optimizer steps on the CPU. It
  needs the stage sharded by FSDP2 over ``dp > 1``; otherwise it is refused before launch
  (:func:`check_runnable`), naming what would run it.

With an offload per pipeline rank (``offload_stages``) each rank applies its own view
(:meth:`~fxplan.core.plan.Plan.at_pipeline_rank`): the host optimizer or ``CPUOffloadPolicy``
only on the offloading ranks, and :func:`check_runnable` judges every rank under its own ZeRO
stage and offload. A weight tied between ranks whose offload differs is refused on GPUs
(:func:`fxplan.runtime.apply.tied.offload_refusal`).

**FP8** runs as torchao's float8 training (``convert_to_float8_training``) on CUDA devices
with FP8 tensor cores; it is refused on CPU ("fp8 is not runnable on CPU") and when torchao is
not importable.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from fxplan.core.errors import UserError
from fxplan.cost_model.host.host_overhead import offload_runs

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["RuntimeSupportError", "check_runnable", "offload_policy"]


class RuntimeSupportError(UserError):
    """A plan the runtime cannot run on this kind of device (offload layout, FP8 on CPU)."""


def check_runnable(plan: "Plan", device_kind: str) -> None:
    """Refuse a plan whose offload or FP8 the runtime cannot run on ``device_kind``
    (``"cpu"`` or ``"gpu"``), with what would run it (module docstring). Every pipeline rank's
    offload must run under its own ZeRO stage
    (:func:`~fxplan.cost_model.host.host_overhead.offload_runs`, the rule the search offers
    by): ``optimizer+params`` needs the stage sharded by FSDP2, ``offload=optimizer`` runs
    under any."""
    config = plan.config
    for rank in range(plan.pp):
        own = config.at_pipeline_rank(rank)
        if offload_runs(own):
            continue
        where = f" on pipeline rank {rank}" if config.per_rank else ""
        raise RuntimeSupportError(
            f"offload={own.offload} with zero={own.zero_stage}{where}, dp={plan.dp}, "
            f"tp={plan.tp} is not runnable by fxplan's runtime: it keeps the parameter shards "
            "on the host with FSDP2's CPUOffloadPolicy, which needs fully_shard over dp > 1 "
            "(zero=2 or 3, or zero=1 with tp or ep > 1); re-plan with --constrain "
            "\"zero=3,offload=optimizer+params\", or offload the optimizer only "
            "(offload=optimizer, which runs at any ZeRO stage)")
    if plan.config.fp8:
        if device_kind == "cpu":
            raise RuntimeSupportError(
                "fp8 is not runnable on CPU: FP8 matrix products need GPU tensor cores (H100, "
                "H200); re-plan without fp8 (--constrain fp8=false) to train on CPU")
        if importlib.util.find_spec("torchao") is None:
            raise RuntimeSupportError(
                "fp8 needs torchao's float8 training (pip install torchao -c constraints.txt); "
                "torchao is not importable here")


def offload_policy(plan: "Plan") -> Any:
    """``CPUOffloadPolicy`` for ``fully_shard`` when the plan offloads its parameters
    (``offload=optimizer+params``; pinned host memory on CUDA, where it speeds the copies;
    plain on CPU, where there is nothing to pin for), else ``None`` (FSDP2's default: the
    parameters on the device, also under ``offload=optimizer``)."""
    if plan.offload != "optimizer+params":
        return None
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy

    return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
