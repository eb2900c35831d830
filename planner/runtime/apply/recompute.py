"""Activation recompute per block at module level, as planned (``plan.recompute(i)``).

    none       nothing
    full       composable ``checkpoint(block)``: the block's input is saved, the whole block
               is recomputed in the backward; beside a split backward (the zero-bubble
               schedules) ``kept_checkpoint(block)``, whose one recompute serves both the
               input-gradient and the weight-gradient pass
               (:mod:`fxplan.passes.rewrite.split_recompute`)
    selective  the attention core recomputed, everything else kept as autograd keeps it
               (Korthikanti et al., 2022), as the graph rewrite's ``attn_core`` checkpoint
               (:mod:`fxplan.passes.rewrite.recompute`): in blocks that call
               ``F.scaled_dot_product_attention``, each such call checkpointed on its own
               (:class:`AttentionCheckpoint`) — the inputs ``q, k, v`` kept, the output and
               its statistics recomputed; beside a split backward too, since the attention
               holds no weights: the weight pass never reads what it saved, and it is
               recomputed once, in the input-gradient pass. In blocks that write attention
               out as products and a softmax (at module level only under expert
               parallelism; elsewhere such a plan runs as the graph rewrite, which outlines
               the core: :func:`fxplan.runtime.apply.module.module_level_plan`), the
               composable ``checkpoint`` with a selective-checkpoint policy (``torch.utils.checkpoint.
               create_selective_checkpoint_contexts``) recomputing those ATen ops
               (``bmm``/``baddbmm``, ``_softmax``) and ``MUST_SAVE`` for every other op —
               whose outputs torch then caches for the replay, more than autograd alone
               keeps (measured on the tiny Llama's block, 4 × 64 tokens, the storages autograd
               keeps, parameters included: 2228 KiB cached beside 72 KiB saved, against
               1742 KiB saved without recompute and 1738 KiB with the attention checkpointed
               alone); not beside a split backward, whose
               weight pass reads the block's saved tensors again (the module level refuses
               it, :func:`fxplan.runtime.apply.module.module_level_plan`)

Parameter names and ``state_dict`` keys are unchanged; recompute changes memory and time,
never values.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fxplan.passes.rewrite.split_recompute import kept_checkpoint

__all__ = ["ATTENTION_CORE", "AttentionCheckpoint", "apply_recompute"]

_aten = torch.ops.aten
#: The ATen overload packets of an attention core (recomputed under ``selective``).
ATTENTION_CORE = frozenset(op for op in (
    getattr(_aten, name, None) for name in (
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable", "bmm", "baddbmm", "_softmax",
        "_safe_softmax")) if op is not None)


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    packet = getattr(op, "overloadpacket", op)
    return (CheckpointPolicy.PREFER_RECOMPUTE if packet in ATTENTION_CORE
            else CheckpointPolicy.MUST_SAVE)


def _selective_context() -> Any:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


class AttentionCheckpoint(TorchFunctionMode):
    """While a block's forward runs: each ``F.scaled_dot_product_attention`` call that
    records a graph is checkpointed on its own (``torch.utils.checkpoint``, non-reentrant),
    everything else runs as it is (module docstring, ``selective`` beside a split backward).
    The recompute runs in the backward, outside the mode. ``calls``: how many it took."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            self.calls += 1
            return checkpoint(func, *args, use_reentrant=False, **kwargs)
        return func(*args, **kwargs)

    @classmethod
    def install(cls, block: nn.Module) -> None:
        """Run ``block``'s every forward under a fresh mode (a forward pre-hook enters it,
        an always-called forward hook leaves it)."""
        active: list[AttentionCheckpoint] = []

        def enter(module: nn.Module, args: Any) -> None:
            active.append(cls())
            active[-1].__enter__()

        def leave(module: nn.Module, args: Any, output: Any) -> None:
            active.pop().__exit__(None, None, None)

        block.register_forward_pre_hook(enter)
        block.register_forward_hook(leave, always_call=True)


def apply_recompute(blocks: Sequence[nn.Module], policies: Sequence[str],
                    split_backward: bool = False, fused_attention: bool = True) -> None:
    """Checkpoint ``blocks[i]`` as ``policies[i]`` says (module docstring);
    ``split_backward``: the stage's backward runs as two passes (a zero-bubble schedule);
    ``fused_attention``: the blocks call ``F.scaled_dot_product_attention`` (the probe saw
    at least one such call per block), so that selective recompute checkpoints those calls."""
    from torch.distributed._composable import checkpoint

    for block, policy in zip(blocks, policies, strict=True):
        if policy == "none":
            continue
        if policy == "full":
            if split_backward:
                kept_checkpoint(block)
            else:
                checkpoint(block)
        elif policy == "selective":
            if fused_attention:
                AttentionCheckpoint.install(block)
            elif split_backward:   # module_level_plan refuses this plan before it gets here
                raise ValueError(
                    "selective recompute beside a split backward checkpoints each fused "
                    "attention call alone, and these blocks make none (their attention is "
                    "written out); run the plan as the graph rewrite, which outlines the core")
            else:   # attention written out: torch's selective checkpoint of the block
                checkpoint(block, context_fn=functools.partial(_selective_context))
        else:
            raise ValueError(f"unknown recompute policy {policy!r}")
