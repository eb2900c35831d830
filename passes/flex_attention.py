"""FlexAttention captured as the fused attention it is, without its CPU kernels.

``flex_attention(q, k, v, score_mod, block_mask)`` refuses inputs that need a gradient on a CPU
device ("FlexAttention does not support backward on CPU") and, outside ``torch.compile``, runs a
higher-order op that fxplan's fake run cannot price. Capture runs nothing for real: it needs the
op's shapes, FLOPs and saved activations on the cluster's devices, where FlexAttention is one
fused kernel. Inside :func:`priced_as_fused` (every capture) the higher-order op is replaced by
``scaled_dot_product_attention(q, k, v, scale=scale)`` (grouped-query when ``k`` has fewer
heads), which the cost model prices as one fused attention kernel, with its log-sum-exp
statistics as zeros; the device check is skipped. The block mask is priced dense: its sparsity
(causal, sliding window) is a function of the mask, not of shapes, so a causal FlexAttention is
priced at the FLOPs of full attention, an upper bound. The block mask's construction (under
``vmap``) stays in the graph, unpriced.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.nn import functional as F

__all__ = ["priced_as_fused"]


def _fused(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, score_mod: Any,
           block_mask: Any, scale: float | None, kernel_options: Any, *rest: Any
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The higher-order op's ``(out, lse, max_scores)`` with ``out`` from fused attention."""
    grouped = query.shape[-3] != key.shape[-3]
    out = F.scaled_dot_product_attention(query, key, value, scale=scale, enable_gqa=grouped)
    stats = query.new_zeros(query.shape[:-1], dtype=torch.float32)
    return out, stats, stats


@contextlib.contextmanager
def priced_as_fused() -> Iterator[None]:
    """FlexAttention as fused attention inside the block (module docstring); nothing changes
    on a torch without FlexAttention."""
    try:
        import torch.nn.attention.flex_attention as flex
    except ImportError:
        yield
        return
    names = ("flex_attention_hop", "_validate_device", "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG")
    if not all(hasattr(flex, n) for n in names):
        yield
        return
    saved = {n: getattr(flex, n) for n in names}
    flex.flex_attention_hop = _fused
    flex._validate_device = lambda query, key, value: None
    flex._FLEX_ATTENTION_DISABLE_COMPILE_DEBUG = True   # no torch.compile around the op
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(flex, name, value)
