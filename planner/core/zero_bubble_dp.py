"""Data parallelism beside a zero-bubble pipeline: the one rule the runtime runs, the cost model
prices and the search offers.

Under a split-backward schedule (``zb[:v]``, ``zbv``, ``dualpipev``) with ``pp > 1`` each
microbatch's backward runs as an input-gradient op ``B`` (torch's ``stage_backward_input``)
and, later, a weight-gradient op ``W`` (``stage_backward_weight``); the weight gradients of
the step exist only once its last ``W`` has run. Neither data-parallel wrapper follows that:
DDP's reducer, armed for the last backward, all-reduces its buckets from autograd hooks that
fire in the ``B`` pass, before the weight gradients exist (wrong gradients), and FSDP2's
reduce-scatter inside torch's split backward deadlocks (both measured on gloo ranks with torch
2.13). So with ``dp > 1`` (:func:`reduces_after_step`) the runtime wraps the stage
modules in neither and reduces their gradients in one explicit pass after the schedule's step
(:mod:`fxplan.runtime.train.dp_reduce`)::

    g  ←  (1/dp) · Σ_{r ∈ dp group} g_r          per parameter, in fp32 buckets

then steps the optimizer — ZeRO-1's ``ZeroRedundancyOptimizer`` its shard, as without a
pipeline; under ``offload=optimizer`` that step runs on the host, as at any ZeRO stage
(``fxplan.runtime.train.host_optimizer``: the averaged, clipped gradients copied down, the
updated weights back). Nothing of that pass overlaps a backward: the cost model prices all of
it exposed after the stage's last op (:func:`fxplan.cost_model.step.overlap.dp_reduce_blocks`)
and lists no ``dp_grad_reduce`` overlap.

What the pass cannot replace is FSDP2's sharding (:func:`after_step_refusal`): ZeRO-2 and
ZeRO-3 (gradients or parameters sharded over dp; ``offload=optimizer+params``, FSDP2's
``CPUOffloadPolicy``, is ZeRO-3 only) and ZeRO-1 with ``tp > 1`` or ``ep > 1`` (which the
runtime runs as FSDP2: ``ZeroRedundancyOptimizer`` cannot hold DTensor parameters) stay
refused beside a zero-bubble pipeline with ``dp > 1``, and the search does not offer them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.config import ParallelConfig

__all__ = ["after_step_refusal", "reduces_after_step"]


def reduces_after_step(config: "ParallelConfig") -> bool:
    """Whether the data-parallel gradient reduction runs as one explicit pass after the
    pipeline schedule's step (module docstring): a split-backward schedule with ``pp > 1``
    and ``dp > 1``."""
    return config.splits_backward and config.dp > 1


def after_step_refusal(config: "ParallelConfig") -> str | None:
    """Why the runtime cannot run ``config``'s data parallelism beside its zero-bubble
    pipeline (module docstring), or ``None`` (it can, or the reduction is not after the step).
    With a ZeRO stage per pipeline rank ``zero_stage`` is the highest of them."""
    if not reduces_after_step(config):
        return None
    head = f"schedule {config.schedule} with dp={config.dp}"
    if config.zero_stage >= 2:
        return (f"{head} and ZeRO-{config.zero_stage}: FSDP2's reduce-scatter does not follow "
                "torch's split backward (the ranks hang); use ZeRO-0 or ZeRO-1, whose gradients "
                "the runtime all-reduces after the step, or a 1f1b/interleaved schedule")
    if config.zero_stage == 1 and (config.tp > 1 or config.ep > 1):
        what = f"tp={config.tp}" if config.tp > 1 else f"ep={config.ep}"
        return (f"{head}, ZeRO-1 and {what}: the runtime runs that ZeRO-1 as FSDP2 "
                "(ZeroRedundancyOptimizer cannot hold DTensor parameters), whose "
                "reduce-scatter does not follow torch's split backward; use ZeRO-0, or a "
                "1f1b/interleaved schedule")
    return None
