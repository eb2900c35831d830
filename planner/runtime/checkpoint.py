"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), resharded on load.

The state dict is keyed by the parameter names of the original model, whatever the plan:
``{"h.0.attn.qkv.weight": DTensor | Tensor, …}``. DCP records each DTensor's global shape and the
chunk each rank holds, and every rank writes only its own chunks (replicated tensors are written
once). Loading under another plan — another mesh, tp degree, ZeRO stage or pipeline split — asks
each rank's *new* state dict for the chunks it holds now; DCP reads the overlapping pieces of the
saved chunks and copies them in place (``load`` plans by global offsets, so ``S(0)`` on tp=2 →
``S(0)`` on dp×tp=4 or → a plain tensor works the same way). Weights held by two pipeline ranks
(tied embedding/LM head) are saved under one name and loaded into both copies.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.distributed.checkpoint as dcp

if TYPE_CHECKING:  # pragma: no cover
    from planner.runtime.sharded_module import ShardedModule

__all__ = ["save_sharded", "load_sharded"]


def save_sharded(module: "ShardedModule", path: str) -> None:
    """Every member rank writes its shards of ``module.state_dict()`` under ``path``."""
    dcp.save({"model": module.state_dict()}, checkpoint_id=path, process_group=module.group)


def load_sharded(module: "ShardedModule", path: str) -> None:
    """Fill ``module``'s parameters in place from a checkpoint saved under any plan."""
    state = {"model": module.state_dict()}
    dcp.load(state, checkpoint_id=path, process_group=module.group)
    module.load_state_dict(state["model"])
