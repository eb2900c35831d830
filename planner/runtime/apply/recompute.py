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
               recomputed once, in the input-gradient pass. Blocks that write attention out
               as products and a softmax make no such call: the module level refuses the
               plan and the graph rewrite, which outlines their core, runs it
               (:func:`fxplan.runtime.apply.module.module_level_plan`) — torch's selective
               checkpoint over such a block, recomputing the products and the softmax,
               caches every other op's output for its replay and freed none of the scores
               (measured 2026-11-29 at 7224893 with ``benchmarks/activation_bytes.py``: on
               the tiny GPT's written-out block 273 KiB held with and without it; applied to
               the tiny Llama's block, 2036 KiB against 1350 without recompute)

Parameter names and ``state_dict`` keys are unchanged; recompute changes memory and time,
never values.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from fxplan.passes.rewrite.split_recompute import kept_checkpoint

__all__ = ["AttentionCheckpoint", "apply_recompute"]


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
    ``split_backward``: the stage's backward runs as two passes (a zero-bubble schedule).
    Selective recompute checkpoints the blocks' ``F.scaled_dot_product_attention`` calls;
    :func:`fxplan.runtime.apply.module.module_level_plan` refuses blocks that make none."""
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
            AttentionCheckpoint.install(block)
        else:
            raise ValueError(f"unknown recompute policy {policy!r}")
