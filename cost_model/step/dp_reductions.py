"""How the data-parallel gradient reduction runs, as the runtime runs it: ZeRO-1 as DDP plus
``ZeroRedundancyOptimizer``'s broadcasts (:func:`zero1_broadcasts`), and the reductions in
every one of ``m > 1`` backwards (:func:`reduced_per_microbatch`), ZeRO-2's priced block by
block as ZeRO-3's are (:func:`zero2_reduces_per_microbatch`).
"""

from __future__ import annotations

from fxplan.core.config import ParallelConfig
from fxplan.cost_model.host.host_overhead import dtensor_params

__all__ = ["reduced_per_microbatch", "zero1_broadcasts", "zero2_reduces_per_microbatch"]


def zero1_broadcasts(config: ParallelConfig) -> bool:
    """ZeRO-1 as the runtime runs it without tensor parallelism: DDP all-reduces the gradients
    and ``ZeroRedundancyOptimizer`` broadcasts every parameter tensor from its owner after
    the step (:mod:`fxplan.runtime.styles.data_parallel`); with ``tp > 1`` or ``ep > 1`` it runs as
    FSDP2."""
    return config.zero_stage == 1 and config.dp > 1 and not dtensor_params(config)


def zero2_reduces_per_microbatch(config: ParallelConfig) -> bool:
    """ZeRO-2 with ``m > 1`` microbatches: each backward reduce-scatters the gradients it
    produced (:attr:`~fxplan.core.config.ParallelConfig.reduces_every_microbatch`), so its
    reductions are priced per microbatch as ZeRO-3's are — block by block, each hidden
    behind the next block's backward (:func:`~cost_model.host.host_overhead.zero3_exposed_s`)
    — without ZeRO-3's gathers (the blocks stay gathered from the step's first forward to
    its last backward), and the last backward carries no gradient buckets. With one
    microbatch the one reduction is the last backward's buckets
    (:func:`~cost_model.step.grad_buckets.gradient_buckets`)."""
    return config.keeps_blocks_gathered and reduced_per_microbatch(config)


def reduced_per_microbatch(config: ParallelConfig) -> bool:
    """The dp gradient reduction runs in every one of ``m > 1`` backwards
    (:attr:`~fxplan.core.config.ParallelConfig.reduces_every_microbatch`)."""
    return config.reduces_every_microbatch and (config.num_microbatches or 1) > 1
