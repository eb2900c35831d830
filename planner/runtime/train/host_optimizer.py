"""``offload=optimizer``: the optimizer steps in host memory, the parameters stay on the device.

DeepSpeed's ZeRO-Offload (Ren et al., 2021) as the cost model prices it
(:mod:`fxplan.cost_model.memory.offload`). For each parameter ``p`` this rank's optimizer
updates — its local tensor: FSDP2's dp shard under ZeRO-2/3 (and ZeRO-1 beside tp or ep), the
tp shard of a ``DTensor``, the whole tensor otherwise; under ZeRO-1 with ``tp = ep = 1``
``ZeroRedundancyOptimizer`` hands this optimizer only the tensors of its rank's partition —
the host keeps, per parameter::

    master  fp32 copy of the local tensor         4 B
    g_h     the gradient copied down, fp32         4 B   (a buffer reused every step)
    m, v    the inner optimizer's state (AdamW)    8 B
                                           total  16 B   (``OptimizerSpec.host_bytes``)

and one step is, after the trainer's gradient clipping on the device::

    g_h ← g          device → host, every local gradient (non_blocking), then synchronise
    inner.step()     the wrapped optimizer class over (master, g_h), on the host's cores
    p   ← master     host → device (non_blocking), then synchronise

The runtime's parameters and gradients are fp32 on the device (its master weights: mixed
precision casts inside the forward, :mod:`fxplan.runtime.apply.precision`), so both copies
move 4 B per parameter and the device parameter is bit-for-bit the master after each step.
The inner optimizer is the class the runtime would build (``torch.optim.AdamW`` for training)
with ``foreach=False`` and ``fused=False``: torch's single-tensor loop, the host step the cost
model measured. Parameters and gradients keep the plan's ZeRO layout on the device; nothing
else of the step changes.

On CUDA the host tensors are pinned, the copies asynchronous and the step synchronises the
device's current stream after each direction — untested on a GPU (the test suite runs this
module on CPU ranks; ``make gpu-check``'s "ZeRO-1, optimizer offloaded" row runs it on CUDA).
On a CPU rank the "host" is the same memory, and the step makes the same copies, so the CPU
tests run this path.

**Masters follow the device parameters.** A parameter overwritten outside the step (a
checkpoint loaded into the model, a user's in-place edit) bumps its tensor's version counter;
the next step then first copies it to the master, so a model loaded before or after this
optimizer steps from the loaded values.

**State as a plain optimizer shows it.** :attr:`state` holds, per device parameter, the inner
optimizer's state tensors (host memory, shared with it), each with the parameter's layout: a
``DTensor`` parameter's moments are ``DTensor`` objects of the same spec over the host tensors
(FSDP2's CPU offload keeps its shards so), scalars such as Adam's ``step`` plain. ``state_dict``
and :meth:`load_state_dict` therefore speak the wrapped class's format, and
:mod:`fxplan.runtime.checkpoint.optim_state` saves and loads it through DCP unchanged, into a
plan with or without offload. The masters are not saved: they equal the parameters.
"""

from __future__ import annotations

import functools
import inspect
from collections import defaultdict
from typing import Any, Callable, Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["HostOffloadOptimizer", "host_offloaded"]

#: Group keys that choose the inner optimizer's kernels, not its arithmetic: the host step
#: always runs the single-tensor loop, whatever a loaded state dict says.
_IMPLEMENTATION = ("foreach", "fused")


def _local(param: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds of ``param`` (a ``DTensor``'s local shard)."""
    return param._local_tensor if isinstance(param, DTensor) else param


def _synchronize(device: torch.device) -> None:
    """Wait for the copies queued on ``device`` (CUDA); nothing to wait for on CPU."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class HostOffloadOptimizer(torch.optim.Optimizer):
    """``inner_class`` stepping fp32 masters in host memory for device parameters (module
    docstring). Made by :func:`host_offloaded`, whose subclasses set :attr:`inner_class`;
    constructed like the inner class: ``(params or param groups, **hyperparameters)``."""

    #: the optimizer that runs on the host
    inner_class: type[torch.optim.Optimizer] = torch.optim.AdamW

    def __init__(self, params: Iterable[Any], **kwargs: Any) -> None:
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        groups = [dict(g, params=list(g["params"])) for g in groups]
        owned = [p for g in groups for p in g["params"]]
        self._device = _local(owned[0]).device if owned else torch.device("cpu")
        pin = self._device.type == "cuda"
        #: device parameter → its fp32 master on the host
        self.masters: dict[nn.Parameter, torch.Tensor] = {}
        self._versions: dict[nn.Parameter, int] = {}
        for p in owned:
            local = _local(p).detach()
            master = torch.empty(local.shape, dtype=torch.float32, pin_memory=pin)
            master.copy_(local)
            self.masters[p] = master
            self._versions[p] = local._version
        self._grad_buffers: dict[nn.Parameter, torch.Tensor] = {}
        accepted = inspect.signature(self.inner_class.__init__).parameters
        single = {k: False for k in _IMPLEMENTATION if k in accepted}
        self.host = self.inner_class(
            [dict(g, params=[self.masters[p] for p in g["params"]]) for g in groups],
            **{**kwargs, **single})
        # the groups as the plain class shows them (its own kernel choice, not the host's)
        defaults = {**self.host.defaults, **{k: kwargs.get(k) for k in single}}
        super().__init__(groups, defaults)

    # -- the step ---------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        """Gradients down, the inner step on the host, the masters back (module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparameters()
        for group in self.param_groups:
            for p in group["params"]:
                self._download(p)
        _synchronize(self._device)
        self.host.step()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    _local(p).copy_(self.masters[p], non_blocking=True)
        _synchronize(self._device)
        for group in self.param_groups:
            for p in group["params"]:
                self._versions[p] = _local(p)._version
        self._show_state()
        return loss

    def _download(self, p: nn.Parameter) -> None:
        """Queue ``p``'s gradient into its host buffer (the master's ``grad``; ``None``
        without a gradient), the master refreshed first if ``p`` changed since the last step."""
        master, local = self.masters[p], _local(p)
        if local._version != self._versions[p]:
            master.copy_(local, non_blocking=True)
        grad = p.grad
        if grad is None:
            master.grad = None
            return
        buffer = self._grad_buffers.get(p)
        if buffer is None:
            buffer = torch.empty_like(master, pin_memory=self._device.type == "cuda")
            self._grad_buffers[p] = buffer
        buffer.copy_(_local(grad), non_blocking=True)
        master.grad = buffer

    def _sync_hyperparameters(self) -> None:
        """The groups' hyperparameters (the trainer sets ``lr`` every step) onto the inner
        optimizer's groups, its kernel choice kept."""
        for outer, inner in zip(self.param_groups, self.host.param_groups):
            for key, value in outer.items():
                if key != "params" and key not in _IMPLEMENTATION:
                    inner[key] = value

    # -- state --------------------------------------------------------------------------------
    def _shown(self, p: nn.Parameter, key: str, value: Any) -> Any:
        """One state value of ``p`` as a plain optimizer would hold it: a tensor shaped like
        the local parameter gets ``p``'s ``DTensor`` spec (host memory, not copied)."""
        if (isinstance(p, DTensor) and isinstance(value, torch.Tensor) and key != "step"
                and value.shape == self.masters[p].shape):
            return DTensor(value, p._spec, requires_grad=False)
        return value

    def _show_state(self, every: bool = False) -> None:
        """:attr:`state` for the parameters whose inner state appeared (``every``: all)."""
        for p, master in self.masters.items():
            inner = self.host.state.get(master)
            if inner and (every or len(self.state.get(p, ())) != len(inner)):
                self.state[p] = {k: self._shown(p, k, v) for k, v in inner.items()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of the wrapped class (from this optimizer or a plain one, e.g.
        one written without offload): the tensors into the inner optimizer's host state, the
        hyperparameters into both."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved_groups)} parameter groups, this "
                             f"optimizer {len(self.param_groups)}")
        inner_groups = []
        for saved, inner in zip(saved_groups, self.host.param_groups):
            group = {k: v for k, v in saved.items() if k not in _IMPLEMENTATION}
            inner_groups.append({**group, **{k: inner[k] for k in _IMPLEMENTATION
                                             if k in inner}})
        local_state = {key: {name: (v.to_local() if isinstance(v, DTensor) else v)
                             for name, v in values.items()}
                       for key, values in state_dict["state"].items()}
        self.host.load_state_dict({"state": local_state, "param_groups": inner_groups})
        for saved, outer in zip(saved_groups, self.param_groups):
            outer.update({k: v for k, v in saved.items() if k != "params"})
        self.state = defaultdict(dict)
        self._show_state(every=True)


@functools.cache
def host_offloaded(optimizer_class: type[torch.optim.Optimizer]
                   ) -> type[HostOffloadOptimizer]:
    """``optimizer_class`` run on the host: a :class:`HostOffloadOptimizer` subclass taking
    the same arguments (so ``ZeroRedundancyOptimizer`` can build it for its partition)."""
    return type(f"Host{optimizer_class.__name__}", (HostOffloadOptimizer,),
                {"inner_class": optimizer_class, "__module__": __name__,
                 "__doc__": f"{optimizer_class.__name__} stepped on the host (offload=optimizer)."})
