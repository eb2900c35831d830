"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), resharded on load.

A checkpoint holds, keyed by the parameter names of the original model whatever the plan::

    model.h.0.attn.qkv.weight                    DTensor | Tensor   the parameter
    optim.state.h.0.attn.qkv.weight.<name>       DTensor | Tensor   optimizer state (momentum,
                                                                    exp_avg, exp_avg_sq, step)
    optim.param_groups.h.0.attn.qkv.weight.<hp>  object             lr, momentum, betas, …

(``optim.*`` when saved with an optimizer; see :mod:`fxplan.runtime.optim_state`). DCP records
each DTensor's global shape and the chunk each rank holds, and every rank writes only its own
chunks (replicated tensors are written once). Loading under another plan — another mesh, tp
degree, ZeRO stage or pipeline split — asks each rank's *new* state dict for the chunks it holds
now; DCP reads the overlapping pieces of the saved chunks and copies them in place (``load``
plans by global offsets, so ``S(0)`` on tp=2 → ``S(0)`` on dp×tp=4 or → a plain tensor works the
same way). Optimizer state follows its parameter's layout (an FSDP2 shard, a TP DTensor, a
plain tensor, or ZeRO-1's owner rank) and reshards the same way. Weights held by two pipeline
ranks (tied embedding/LM head) are saved under one name and loaded into both copies.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed.checkpoint as dcp

from fxplan.runtime.optim_state import ShardedParameters, optimizer_state, set_optimizer_state


class ShardedState(ShardedParameters, Protocol):
    """A sharded model whose state dict DCP can fill in place
    (:class:`~fxplan.runtime.sharded_module.ShardedModule` is one)."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None: ...

__all__ = ["save_sharded", "load_sharded"]


def _state(module: ShardedState, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    state: dict[str, Any] = {"model": module.state_dict()}
    if optimizer is not None:
        state["optim"] = optimizer_state(module, optimizer)
    return state


def save_sharded(module: ShardedState, path: str,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
    """Every member rank writes its shards of the parameters (and of ``optimizer``'s state)
    under ``path``."""
    dcp.save(_state(module, optimizer), checkpoint_id=path, process_group=module.group)


def load_sharded(module: ShardedState, path: str,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
    """Fill ``module``'s parameters (and ``optimizer``'s state) in place from a checkpoint saved
    under any plan."""
    state = _state(module, optimizer)
    dcp.load(state, checkpoint_id=path, process_group=module.group)
    module.load_state_dict(state["model"])
    if optimizer is not None:
        set_optimizer_state(module, optimizer, state["optim"])
