"""Optimizer state keyed by the original model's parameter names, whatever the plan.

``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` names optimizer state by the
fully-qualified names of the module it is given. The modules a rank runs are stage graph modules
(``layer_0``, wrapped by DDP or FSDP), so it is given a *name view* instead: an empty module tree
that holds this rank's parameter objects under their original names (``h.0.attn.qkv.weight``;
a tied weight under its first name). With ``flatten_optimizer_state_dict`` the result is flat
and per parameter::

    state.h.0.attn.qkv.weight.momentum_buffer   Tensor | DTensor (the parameter's layout)
    state.h.0.attn.qkv.weight.step              Tensor (Adam)
    param_groups.h.0.attn.qkv.weight.lr         float, and the group's other hyperparameters

so every key belongs to one parameter and any rank that holds that parameter can write or read
it: DCP reshards the tensors by global offsets like the parameters themselves.

ZeRO-1 (``ZeroRedundancyOptimizer``) keeps the state of each parameter on the one dp rank that
owns its partition; its local ``optim`` covers exactly those parameters, so each rank saves and
loads the keys of its own partition (no consolidation to one rank is needed). Under
``offload=optimizer`` the optimizer (:mod:`fxplan.runtime.train.host_optimizer`) shows its
host state in the plain optimizer's form — the same keys, a ``DTensor`` parameter's moments as
``DTensor`` objects of its layout over host tensors — so a checkpoint written with offload loads
without it and the other way round. Loading asks the
optimizer for its state first; an optimizer that has not stepped yet is initialised by
``get_optimizer_state_dict`` with one zero-gradient, zero-learning-rate step (parameters do not
change), and DCP then overwrites those tensors in place.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.tensor import DTensor

from fxplan.runtime.apply.strided import full_tensor
from fxplan.runtime.apply.mesh import gather_merged


class ShardedParameters(Protocol):
    """What optimizer state and checkpoints need of a sharded model
    (:class:`~fxplan.runtime.apply.sharded_module.ShardedModule` is one): its parameters under the
    original model's names, and the process group of its ranks."""

    group: Any

    def named_parameters(self) -> Mapping[str, nn.Parameter]: ...

__all__ = ["ShardedParameters", "name_view", "local_optimizer", "optimizer_state", "set_optimizer_state",
           "full_optimizer_state"]

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def name_view(params: Mapping[str, nn.Parameter]) -> nn.Module:
    """An empty module tree holding ``params`` (the same objects) under their dotted names."""
    root = nn.Module()
    for fqn, param in params.items():
        *path, leaf = fqn.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, nn.Module())
            module = module._modules[part]
        module.register_parameter(leaf, param)
    return root


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that holds this rank's state (ZeRO-1's per-partition ``optim``)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer) else optimizer


def optimizer_state(module: ShardedParameters, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's optimizer state, flat and keyed by original names (module docstring)."""
    view = name_view(module.named_parameters())
    return get_optimizer_state_dict(view, local_optimizer(optimizer), options=_OPTIONS)


def set_optimizer_state(module: ShardedParameters, optimizer: torch.optim.Optimizer,
                        state: dict[str, Any]) -> None:
    """Put a state from :func:`optimizer_state` (e.g. filled by ``dcp.load``) into ``optimizer``."""
    view = name_view(module.named_parameters())
    set_optimizer_state_dict(view, local_optimizer(optimizer), state, options=_OPTIONS)


def full_optimizer_state(module: ShardedParameters, optimizer: torch.optim.Optimizer
                         ) -> dict[str, Any]:
    """Every rank's state, gathered and unsharded, on every member rank (collective; tests)."""
    local = {}
    for key, value in optimizer_state(module, optimizer).items():
        if isinstance(value, DTensor):
            value = full_tensor(value)
        local[key] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
    return gather_merged(local, module.group)
