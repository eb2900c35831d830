"""Activation recompute per block at module level, as planned (``plan.recompute(i)``).

    none       nothing
    full       composable ``checkpoint(block)``: the block's input is saved, the whole block
               is recomputed in the backward; beside a split backward (the zero-bubble
               schedules) ``kept_checkpoint(block)``, whose one recompute serves both the
               input-gradient and the weight-gradient pass
               (:mod:`fxplan.passes.rewrite.split_recompute`)
    selective  the same ``checkpoint`` with a selective-checkpoint policy
               (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the ATen ops
               of the attention core — fused scaled-dot-product attention, or the batched
               products ``QKᵀ``, ``·V`` and the softmax between them — are recomputed, every
               other op's output is kept (``MUST_SAVE``); the ``O(s²)`` scores and
               probabilities are not saved (Korthikanti et al., 2022), as the graph rewrite's
               ``attn_core`` checkpoint (:mod:`fxplan.passes.rewrite.recompute`); beside a
               split backward, whose weight pass reads the block's saved tensors again (a
               checkpoint over the block hands each recomputed tensor out once), each call
               of ``F.scaled_dot_product_attention`` inside the block is checkpointed on its
               own instead (:class:`AttentionCheckpoint`): the attention holds no weights,
               so the weight pass never reads what it saved, and it is recomputed once, in
               the input-gradient pass

Parameter names and ``state_dict`` keys are unchanged; recompute changes memory and time,
never values.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

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
                    split_backward: bool = False) -> None:
    """Checkpoint ``blocks[i]`` as ``policies[i]`` says (module docstring);
    ``split_backward``: the stage's backward runs as two passes (a zero-bubble schedule)."""
    from torch.distributed._composable import checkpoint

    contexts: dict[str, Callable[[], Any] | None] = {"full": None,
                                                     "selective": _selective_context}
    for block, policy in zip(blocks, policies, strict=True):
        if policy == "none":
            continue
        if policy not in contexts:
            raise ValueError(f"unknown recompute policy {policy!r}")
        context = contexts[policy]
        if context is None and split_backward:
            kept_checkpoint(block)
        elif split_backward:   # selective: the attention calls alone
            AttentionCheckpoint.install(block)
        elif context is None:
            checkpoint(block)
        else:
            checkpoint(block, context_fn=functools.partial(context))
