"""Per-stage build: the model on ``meta``, only this rank's stage(s) made real.

A rank of a pipeline plan needs the parameters of its own stages only (and of those, only its
tensor-parallel shards). :func:`apply_plan` therefore accepts a model whose parameters live on
the ``meta`` device — shapes and dtypes, no storage — builds and splits the graph from it, turns
the local stages' parameters into DTensors on ``meta`` (``distribute_tensor`` of a meta tensor
costs nothing), and only then gives each of them storage with :func:`materialize`:

    model on meta ─trace/outline/split─► stages (meta) ─tp DTensors (meta)─► materialize ─► dp/ZeRO

Where the values come from (``init`` of :func:`apply_plan`):

* a checkpoint (``checkpoint=path``): parameters are allocated empty and filled by
  :meth:`ShardedModule.load`; the full model never exists anywhere. This is the path for a
  re-planned cluster and for models that do not fit one host.
* a builder ``() -> nn.Module`` returning the full model on CPU (e.g. the reference built with
  the same seed): called once per process, each local parameter copies its shard of the
  builder's tensor, and the full model is dropped before training. Bit-identical to the
  single-process model, at the price of a transient full-model peak in host memory while
  building (the steady state holds the stage only). Sequential RNG streams (``manual_seed``
  then construct) cannot be reproduced per parameter without running them, hence this trade-off.
* a mapping ``{fqn: tensor}`` of full values.

Buffers are small and usually computed, not learned (causal masks, position ids; often
non-persistent, so not in checkpoints): build the model under :func:`meta_parameters`, which puts
only *parameters* on ``meta`` and keeps buffers real.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Mapping, Union

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

__all__ = ["InitSource", "meta_parameters", "has_meta", "init_values", "materialize"]

InitSource = Union[Callable[[], nn.Module], Mapping[str, torch.Tensor], None]


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Build modules with parameters on ``meta`` and real buffers.

    Each parameter is moved to ``meta`` as it is registered, so at most one module's parameters
    exist at a time while the model is constructed."""
    register = nn.Module.register_parameter

    def register_on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register_on_meta  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def has_meta(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` lives on ``meta``."""
    tensors = [*model.parameters(), *model.buffers()]
    return any(t.is_meta for t in tensors)


def init_values(init: InitSource) -> Mapping[str, torch.Tensor] | None:
    """``{fqn: full tensor}`` from an ``init`` source (a builder is called once, here)."""
    if init is None or isinstance(init, Mapping):
        return init
    model = init()
    values = dict(model.named_parameters(remove_duplicate=False))
    values.update(model.named_buffers(remove_duplicate=False))
    return values


def _real(tensor: torch.Tensor, full: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """Storage for a meta ``tensor`` (plain or DTensor): its shard of ``full``, or empty."""
    if isinstance(tensor, DTensor):
        mesh, placements = tensor.device_mesh, tensor.placements
        if full is None:
            local = torch.empty(tensor.to_local().shape, dtype=tensor.dtype, device=device)
        else:  # every rank holds the same full value: slice locally, no communication
            local = distribute_tensor(full.detach().to(device), mesh, placements,
                                      src_data_rank=None).to_local()
        return DTensor.from_local(local, mesh, placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    if full is None:
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    return full.detach().to(device, tensor.dtype, copy=True)


def materialize(module: nn.Module, names: dict[int, str], device: torch.device,
                values: Mapping[str, torch.Tensor] | None) -> bool:
    """Give every meta parameter and buffer of ``module`` storage on ``device``.

    ``names`` maps tensor ids to original names (updated with the new parameters); ``values``
    gives full tensors by name, or ``None`` to allocate empty parameters (to be loaded from a
    checkpoint). A tensor shared by several modules (tied weights) stays one object. The real
    buffers that :func:`meta_parameters` kept on the host (positions, rotary tables) move to
    ``device`` too, so that a model built there runs where its parameters are. Returns whether
    anything was materialised."""
    replaced: dict[int, torch.Tensor] = {}
    for sub in module.modules():
        for slots, is_param in ((sub._parameters, True), (sub._buffers, False)):
            for key, tensor in list(slots.items()):
                if tensor is None:
                    continue
                if not tensor.is_meta:
                    if not is_param and tensor.device != device:
                        slots[key] = replaced.setdefault(id(tensor), tensor.to(device))
                    continue
                if id(tensor) not in replaced:
                    fqn = names.get(id(tensor), key)
                    full = None if values is None else values.get(fqn)
                    if full is None and not is_param:
                        raise ValueError(f"buffer {fqn!r} is on meta and no value is given: build "
                                         "the model under fxplan.runtime.apply.build.meta_parameters()")
                    new = _real(tensor, full, device)
                    if is_param:
                        new = nn.Parameter(new, requires_grad=tensor.requires_grad)
                    names[id(new)] = fqn
                    replaced[id(tensor)] = new
                slots[key] = replaced[id(tensor)]
    return bool(replaced)
