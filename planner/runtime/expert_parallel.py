"""Expert parallelism at run time: not implemented yet, so an ``ep > 1`` plan is refused.

The search prices and chooses ``ep > 1`` for mixtures of experts
(:mod:`fxplan.cost_model.expert_parallel`), and ``fxplan export`` writes it for Megatron-LM,
torchtitan and DeepSpeed, but fxplan's own runtime has no expert-parallel layer yet: it
would shard the batched expert weights on their expert dimension over the EP group and
exchange tokens with ``all_to_all_single`` (which gloo runs on CPU as well as NCCL on GPUs).
Until it does, :func:`check_expert_parallel` refuses such a plan before any process starts,
saying what runs instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fxplan.runtime.offload import RuntimeSupportError

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["check_expert_parallel"]


def check_expert_parallel(plan: "Plan") -> None:
    """Raise :class:`RuntimeSupportError` for ``ep > 1`` (module docstring)."""
    ep = plan.config.ep
    if ep > 1:
        raise RuntimeSupportError(
            f"ep={ep}: expert parallelism is not implemented in fxplan's runtime yet (the plan "
            f"is priced, and exported by `fxplan export PLAN --to megatron|torchtitan|"
            f"deepspeed`); re-plan with --constrain ep=1 to train it here, where every "
            f"data-parallel rank holds all the experts")
