"""Parameters become DTensors on the tensor-parallel mesh axis, with their planned placements.

For every parameter ``p`` with original name ``fqn`` the plan gives ``placements.params[fqn]``
over ``placements.axes``; its ``tp`` entry ``π`` (``S(d)`` or ``R``) is realised as

    p  ←  nn.Parameter(distribute_tensor(p, tp_mesh, [π]))

so each tp rank holds the slice ``p[…, r·n/tp:(r+1)·n/tp, …]`` of dim ``d`` (Megatron:
column-parallel ``W`` is ``S(0)``, row-parallel ``W`` is ``S(1)``, the vocabulary-parallel
embedding ``S(0)``). ``P`` is not a parameter placement and is refused. Parameters the plan does
not mention are replicated (``R``), listed in :attr:`DistributeParameters.defaulted` and
reported as a fallback (logged, and in ``ShardedModule.fallbacks``).

A parameter shared by several modules (tied embedding / LM head) is distributed once and the
same new ``Parameter`` is put back in every module that held it, so the tie survives. The
``dp`` token is not handled here: data parallelism (DDP / ZeRO / FSDP) is applied by the runtime
on top of these DTensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import fx, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

from fxplan.core.placements import format_placements
from fxplan.passes.rewrite.base import PassResult, RewritePass
from fxplan.passes.rewrite.placements import axis_placement, normalize

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan

__all__ = ["DistributeParameters"]


class DistributeParameters(RewritePass):
    """Make parameters DTensors over ``tp_mesh`` (see the module docstring).

    ``names`` maps each parameter object (by ``id``) to its name in the original model; it is
    updated in place so that it also maps the new DTensor parameters.
    """

    name = "distribute-parameters"

    def __init__(self, tp_mesh: DeviceMesh, names: dict[int, str]) -> None:
        self.tp_mesh = tp_mesh
        self.names = names
        self.defaulted: list[str] = []

    def run(self, gm: fx.GraphModule, plan: "Plan") -> PassResult:
        if self.tp_mesh.size() == 1:
            return PassResult(gm, False)
        replaced: dict[int, nn.Parameter] = {}
        changed = False
        before = len(self.defaulted)
        for module in gm.modules():
            for key, param in list(module._parameters.items()):
                if param is None or isinstance(param, DTensor):
                    continue
                if id(param) not in replaced:
                    replaced[id(param)] = self._distribute(param, plan)
                new = replaced[id(param)]
                module._parameters[key] = new
                changed = True
        defaulted = self.defaulted[before:]
        if defaulted:
            self.fallback(f"{len(defaulted)} parameter(s) without a planned placement are "
                          f"replicated over tp: {_listing(defaulted)}")
        return PassResult(gm, changed)

    def _distribute(self, param: nn.Parameter, plan: "Plan") -> nn.Parameter:
        fqn = self.names.get(id(param))
        self.at = f"parameter {fqn!r}" if fqn else None
        if fqn is None:
            raise self.error(f"parameter of shape {tuple(param.shape)} has no name in the model")
        planned = plan.placements.params.get(fqn)
        if planned is None:
            self.defaulted.append(fqn)
            placement = Replicate()
        else:
            placement = normalize(axis_placement(plan, planned, "tp"), param.ndim)
        if isinstance(placement, Partial):
            raise self.error(f"parameter {fqn!r} is planned {format_placements(planned)!r}: a "
                             "parameter cannot be partial")
        with torch.no_grad():
            # a meta parameter (per-stage build) has no data to send: every rank slices alone
            src = None if param.is_meta else 0
            dtensor = distribute_tensor(param.detach(), self.tp_mesh, [placement],
                                        src_data_rank=src)
        new = nn.Parameter(dtensor, requires_grad=param.requires_grad)
        self.names[id(new)] = fqn
        return new


def _listing(names: list[str], limit: int = 8) -> str:
    """``a, b, c`` or ``a, …, h (+3 more)``: a readable list for a fallback line."""
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")
