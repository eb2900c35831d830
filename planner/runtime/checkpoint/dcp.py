"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), resharded on load.

A checkpoint holds, keyed by the parameter names of the original model whatever the plan::

    model.h.0.attn.qkv.weight                    DTensor | Tensor   the parameter
    optim.state.h.0.attn.qkv.weight.<name>       DTensor | Tensor   optimizer state (momentum,
                                                                    exp_avg, exp_avg_sq, step)
    optim.param_groups.h.0.attn.qkv.weight.<hp>  object             lr, momentum, betas, …

(``optim.*`` when saved with an optimizer; see :mod:`fxplan.runtime.checkpoint.optim_state`). DCP records
each DTensor's global shape and the chunk each rank holds, and every rank writes only its own
chunks (replicated tensors are written once). Loading under another plan — another mesh, tp
degree, ZeRO stage or pipeline split — asks each rank's *new* state dict for the chunks it holds
now; DCP reads the overlapping pieces of the saved chunks and copies them in place (``load``
plans by global offsets, so ``S(0)`` on tp=2 → ``S(0)`` on dp×tp=4 or → a plain tensor works the
same way). Optimizer state follows its parameter's layout (an FSDP2 shard, a TP DTensor, a
plain tensor, or ZeRO-1's owner rank) and reshards the same way. Weights held by two pipeline
ranks (tied embedding/LM head) are saved under one name and loaded into both copies; where the
ranks hold them in different layouts (a ZeRO stage per pipeline rank) only the first rank's
copy is written.

A tensor strided over a mesh dim (``_StridedShard(d, split_factor=f)``: the head-parallel
fused QKV weight, each rank its rows of q, of k and of v) has no chunk at one global offset,
which DCP's plan needs. It is written and read with that mesh dim ``Replicate`` instead (an
all-gather of the tensor at save; at load each rank keeps its rows of the whole:
:mod:`fxplan.runtime.apply.strided`), so such a checkpoint reshards like any other.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed.checkpoint as dcp

from fxplan.runtime.checkpoint.optim_state import ShardedParameters, optimizer_state, set_optimizer_state


class ShardedState(ShardedParameters, Protocol):
    """A sharded model whose state dict DCP can fill in place
    (:class:`~fxplan.runtime.apply.sharded_module.ShardedModule` is one)."""

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None: ...

__all__ = ["save_sharded", "load_sharded"]


def _state(module: ShardedState, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    state: dict[str, Any] = {"model": module.state_dict()}
    if optimizer is not None:
        state["optim"] = optimizer_state(module, optimizer)
    return state


def _portable(state: Any, strided: list[tuple[Any, Any]]) -> Any:
    """``state`` with every strided DTensor replaced by its copy replicated over the strided
    mesh dims (module docstring); ``strided`` collects ``(original, copy)`` pairs."""
    from fxplan.runtime.apply.strided import has_strided, unstrided

    if isinstance(state, dict):
        return {k: _portable(v, strided) for k, v in state.items()}
    if not has_strided(state):
        return state
    copy = unstrided(state.detach())
    strided.append((state, copy))
    return copy


def _restore(original: Any, copy: Any) -> None:
    """Fill ``original``'s local shard from ``copy``, the tensor read replicated over its
    strided mesh dims (module docstring): DTensor's own ``Replicate → _StridedShard``, a
    local selection of this rank's rows, no communication."""
    from fxplan.runtime.apply.strided import restrided

    local = restrided(copy, original.placements).to_local()
    with torch.no_grad():
        original.to_local().copy_(local)


def _merge(state: Any, portable: Any) -> Any:
    """``portable`` as loaded, with the strided tensors' originals (filled by
    :func:`_restore`) in place of their replicated copies."""
    if isinstance(state, dict):
        return {k: _merge(v, portable[k]) for k, v in state.items()}
    from fxplan.runtime.apply.strided import has_strided

    return state if has_strided(state) else portable


def save_sharded(module: ShardedState, path: str,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
    """Every member rank writes its shards of the parameters (and of ``optimizer``'s state)
    under ``path``, but the copies of tied weights its ``copies_saved_elsewhere`` names
    (:func:`_without`)."""
    state = _without(_state(module, optimizer), getattr(module, "copies_saved_elsewhere", ()))
    dcp.save(_portable(state, []), checkpoint_id=path, process_group=module.group)


def _without(state: dict[str, Any], names: Any) -> dict[str, Any]:
    """``state`` less the parameters ``names`` and their optimizer entries
    (``state.<fqn>.<key>``, ``param_groups.<fqn>.<key>``): copies of a weight tied between
    pipeline ranks whose layouts differ (a ZeRO stage per rank: FSDP2's shard on one, the
    whole tensor on the other), which DCP cannot record under one name twice; the copy on the
    weight's first rank is saved, and both load from it."""
    if not names:
        return state
    out = dict(state, model={k: v for k, v in state["model"].items() if k not in names})
    if "optim" in state:
        out["optim"] = {k: v for k, v in state["optim"].items()
                        if k.partition(".")[2].rpartition(".")[0] not in names}
    return out


def load_sharded(module: ShardedState, path: str,
                 optimizer: torch.optim.Optimizer | None = None) -> None:
    """Fill ``module``'s parameters (and ``optimizer``'s state) in place from a checkpoint saved
    under any plan."""
    state = _state(module, optimizer)
    strided: list[tuple[Any, Any]] = []
    portable = _portable(state, strided)
    dcp.load(portable, checkpoint_id=path, process_group=module.group)
    for original, copy in strided:
        _restore(original, copy)
    state = _merge(state, portable)
    module.load_state_dict(state["model"])
    if optimizer is not None:
        set_optimizer_state(module, optimizer, state["optim"])
