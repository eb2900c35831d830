"""Mixed precision of the runtime: the plan's training dtype for compute, fp32 for the rest.

Plans are priced in the cluster's training dtype (``bfloat16`` by default, ``float16`` on
devices without bf16; :func:`fxplan.cluster_specs.training_dtype`), so the runtime computes in
it too, with the recipe every large-scale trainer uses (torchtitan, Megatron):

* **master weights and optimizer state in fp32**: the parameters the optimizer updates stay
  ``float32`` (``p ← p − η·u(g)`` in fp32, so updates far below bf16's resolution
  ``2⁻⁸·|p|`` are not lost);
* **compute in the low dtype** ``c`` (bf16/fp16): matmuls read and write ``c``;
* **gradient reduction in fp32**: ``g = (1/dp) Σ_r g_r`` summed in fp32 (a bf16 sum of ``dp``
  terms loses ``log2(dp)`` of its 8 mantissa bits).

Two mechanisms, one per wrapper (:func:`fxplan.runtime.styles.data_parallel.apply_data_parallel`):

    stage under FSDP2 (fully_shard, replicate)  MixedPrecisionPolicy(param_dtype=c,
                                                reduce_dtype=fp32): the all-gathered parameters
                                                are cast to c, the whole block computes in c;
                                                the stage root's outputs are cast to fp32
    any other stage (DDP, tp only, pp only,     torch.autocast(device, c) around the stage's
    one rank)                                   forward: per op, matmuls in c, reductions
                                                (softmax, norms, losses) in fp32 as autocast's
                                                tables say; parameters and gradients fp32

Either way a stage returns fp32 floating outputs, so pipeline stages exchange the dtype their
static metadata (:class:`~fxplan.core.stage_io.StageIO`) declares and the loss is
computed in fp32 on the logits. ``fp32`` (``--dtype fp32``) turns mixed precision off.
``float16`` runs without a loss scaler (a fallback, logged): small gradients may underflow.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fxplan.core.errors import UserError

__all__ = ["Precision", "PrecisionError", "DTYPES", "resolve_precision", "mixed_precision_policy",
           "autocast_stage", "fp32_outputs"]

#: ``--dtype`` values (and the plan's ``torch`` names) → the compute dtype.
DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16,
    "fp32": torch.float32, "float32": torch.float32,
}
_SHORT = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


class PrecisionError(UserError):
    """A ``--dtype`` the runtime does not know."""


@dataclass(frozen=True)
class Precision:
    """The compute dtype of a run (``float32``: mixed precision off) and where it came from."""

    compute: torch.dtype = torch.float32
    source: str = "default"

    @property
    def mixed(self) -> bool:
        return self.compute != torch.float32

    @property
    def name(self) -> str:
        return _SHORT[self.compute]

    def describe(self) -> str:
        """The line of the launch log and ``summary.json``'s ``mixed_precision``."""
        if not self.mixed:
            return "off: fp32 params/compute/reduce"
        return f"{self.name} params/compute, fp32 master+reduce"

    def fallback(self) -> str | None:
        """The fallback line of this precision, if any (fp16 has no loss scaler here)."""
        if self.compute == torch.float16:
            return ("[precision] fp16 runs without a loss scaler: gradients below fp16's "
                    "smallest subnormal (6e-8) underflow to 0; prefer bf16 where the device "
                    "has it")
        return None


def resolve_precision(setting: str | None, plan_dtype: str) -> Precision:
    """``--dtype`` (``plan``/``None``: the plan's dtype) → :class:`Precision`."""
    if setting in (None, "", "plan"):
        if plan_dtype not in DTYPES:
            raise PrecisionError(f"the plan's training dtype {plan_dtype!r} is not one of "
                                 f"{sorted(set(_SHORT.values()))}")
        return Precision(DTYPES[plan_dtype], f"the plan's dtype ({plan_dtype})")
    if setting not in DTYPES:
        raise PrecisionError(f"--dtype {setting}: expected plan, bf16, fp16 or fp32")
    return Precision(DTYPES[setting], f"--dtype {setting}")


def mixed_precision_policy(precision: Precision, *, root: bool = False) -> Any:
    """FSDP2's :class:`MixedPrecisionPolicy` for a block (``root``: the stage root, whose
    outputs are cast back to fp32), or ``None`` when mixed precision is off. One place, so that
    other FSDP2 policies (offloading) are built beside it."""
    if not precision.mixed:
        return None
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=precision.compute, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


def fp32_outputs(out: Any) -> Any:
    """Low-precision floating tensors of ``out`` (a tensor, tuple or list) cast to fp32."""
    if isinstance(out, torch.Tensor):
        return out.float() if out.is_floating_point() and out.dtype != torch.float32 else out
    if isinstance(out, (tuple, list)):
        return type(out)(fp32_outputs(x) for x in out)
    return out


def _cast_output(module: nn.Module, args: Any, out: Any) -> Any:
    return fp32_outputs(out)


def autocast_stage(module: nn.Module, precision: Precision, device_type: str) -> nn.Module:
    """Run ``module``'s forward under ``torch.autocast(device_type, precision.compute)`` and
    cast its floating outputs to fp32 (a forward hook, after the hooks already registered:
    the module-level path's ``.logits`` hook). Backward runs outside autocast, as recommended:
    each op's backward uses the dtype its forward ran in. In place; returns ``module``."""
    if not precision.mixed:
        return module
    forward = module.forward

    @functools.wraps(forward)
    def autocast_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device_type, dtype=precision.compute):
            return forward(*args, **kwargs)

    module.forward = autocast_forward  # type: ignore[method-assign]
    module.register_forward_hook(_cast_output)
    return module
