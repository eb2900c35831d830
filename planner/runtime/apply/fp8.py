"""FP8 training at run time: torchao's float8 linear layers, where the plan asks for them.

``convert_to_float8_training`` swaps each ``nn.Linear`` whose both dimensions are multiples of
16 (what FP8 GEMMs on H100 need) for torchao's ``Float8Linear``: parameters keep their names and
dtype (the master weights stay in the training dtype, the optimizer is unchanged); inputs,
weights and output gradients are cast to FP8 with per-tensor dynamic scales for each matrix
product. Refused with a :class:`~fxplan.runtime.apply.offload.RuntimeSupportError` on CPU and
without torchao (:func:`fxplan.runtime.apply.offload.check_runnable`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fxplan.runtime.apply.offload import check_runnable

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["apply_fp8"]


def _fp8_friendly(module: nn.Module, fqn: str) -> bool:
    return isinstance(module, nn.Linear) and module.in_features % 16 == 0 \
        and module.out_features % 16 == 0


def apply_fp8(model: nn.Module, plan: "Plan") -> nn.Module:
    """``model`` with its FP8-friendly linears converted when ``plan.config.fp8``; unchanged
    otherwise."""
    if not plan.config.fp8:
        return model
    check_runnable(plan, "gpu" if torch.cuda.is_available() else "cpu")
    from torchao.float8 import convert_to_float8_training

    return convert_to_float8_training(model, module_filter_fn=_fp8_friendly)
