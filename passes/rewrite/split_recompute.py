"""Full recompute of a block that survives a split backward: the recompute is kept for both passes.

A zero-bubble schedule (``zb``, ``zbv``, ``dualpipev``) runs each microbatch's backward in two
passes over one autograd graph: ``B`` (torch's ``stage_backward_input``: the input gradient,
``retain_graph=True``) and later ``W`` (``stage_backward_weight``: the weight gradients over the
kept graph). Every saved tensor of a block is unpacked in ``B`` and again in ``W``. torch's
checkpoints (``torch.utils.checkpoint``, the composable ``checkpoint``, ``checkpoint_wrapper``)
hand each recomputed tensor out once and drop it, so the second pass finds nothing (or, with
``torch.utils.checkpoint``'s full recompute, reruns the forward a second time).

:func:`kept_checkpoint` checkpoints a block so that both passes read one recompute:

* **forward** (``F``): the block runs under ``saved_tensors_hooks`` whose pack hook stores, for
  every tensor autograd would save, its position ``i`` in the forward's order instead of the
  tensor. The block keeps only its inputs (detached; the same storage), the RNG states and the
  autocast state of the forward.
* **first unpack** (in ``B``): the block's forward runs again on the kept inputs, under
  ``torch.enable_grad()``, the forward's RNG states (dropout draws the same masks) and its
  autocast state (the backward runs outside the stage's autocast region), with hooks that
  record every saved tensor in order; their count must equal the forward's, else the block is
  not deterministic in what it saves and :class:`RecomputeMismatch` says so.
* **every unpack** returns the recorded tensor ``i`` and keeps it: the ``W`` pass reads the same
  tensors. They are freed with the autograd graph, whose nodes hold the frame through the
  packed positions — after ``W`` (``retain_graph=False``) or a whole backward.

Memory per microbatch, against no recompute: from ``F`` to ``B`` the block's inputs only; from
``B`` to ``W`` its whole activations (the recorded tensors, which include the inputs: the
recompute reads the same storage), as without recompute. The memory model counts exactly that
(:meth:`fxplan.cost_model.step.pipeline_schedules.InflightCounts.peak_held`). Time: one
recompute of the block's forward per microbatch, in its ``B``.

The hooks sit on the block itself (a forward pre-hook and an always-called forward hook, as
torch's composable ``checkpoint``), so parameter names and ``state_dict`` keys are the
block's own. Values never change: gradients equal a plain backward's bit for bit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

__all__ = ["RecomputeMismatch", "kept_checkpoint", "is_kept_checkpoint"]


class RecomputeMismatch(RuntimeError):
    """A block's recompute saved a different number of tensors than its forward did."""


@dataclass
class _Frame:
    """One forward of a checkpointed block: what its recompute needs, and the recompute."""

    module: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    rng: dict[str, Any]
    autocast: tuple[tuple[str, bool, torch.dtype], ...]
    packed: int = 0
    recomputed: list[torch.Tensor] | None = None

    def unpack(self, index: int) -> torch.Tensor:
        """Saved tensor ``index`` of the forward, recomputing the block on the first call."""
        if self.recomputed is None:
            self.recomputed = self._recompute()
        return self.recomputed[index]

    def _recompute(self) -> list[torch.Tensor]:
        recorded: list[torch.Tensor] = []

        def pack(tensor: torch.Tensor) -> int:
            recorded.append(tensor)
            return len(recorded) - 1

        state = _state(self.module)
        with contextlib.ExitStack() as stack:
            stack.enter_context(_restored_rng(self.rng))
            for device_type, enabled, dtype in self.autocast:
                stack.enter_context(torch.autocast(device_type, dtype=dtype, enabled=enabled))
            stack.enter_context(torch.enable_grad())
            stack.enter_context(torch.autograd.graph.saved_tensors_hooks(
                pack, recorded.__getitem__))
            state.recomputing = True
            try:
                self.module(*self.args, **self.kwargs)
            finally:
                state.recomputing = False
        if len(recorded) != self.packed:
            raise RecomputeMismatch(
                f"the recompute of {type(self.module).__name__} saved {len(recorded)} tensors "
                f"for the backward where its forward saved {self.packed}: the block does not "
                "save the same tensors each time it runs (data-dependent control flow?), so its "
                "recompute cannot stand in for its forward; run it without recompute")
        return recorded


@dataclass
class _State:
    """Per checkpointed block: the saved-tensor hooks of the forwards running now (innermost
    last) and whether its recompute is running (the hooks then stand aside)."""

    hooks: list[torch.autograd.graph.saved_tensors_hooks] = field(default_factory=list)
    recomputing: bool = False


def _state(module: nn.Module) -> _State:
    return module.__dict__["_fxplan_kept_checkpoint"]


def is_kept_checkpoint(module: nn.Module) -> bool:
    """Whether :func:`kept_checkpoint` was applied to ``module``."""
    return "_fxplan_kept_checkpoint" in module.__dict__


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().requires_grad_(value.requires_grad)
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    if isinstance(value, dict):
        return {k: _detached(v) for k, v in value.items()}
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _rng_states(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The CPU generator's state and that of every accelerator device the inputs sit on."""
    states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    for tensor in _tensors((args, kwargs)):
        device = tensor.device
        if device.type not in ("cpu", "meta") and str(device) not in states:
            states[str(device)] = torch.get_device_module(device.type).get_rng_state(device)
    return states


@contextlib.contextmanager
def _restored_rng(states: dict[str, Any]) -> Iterator[None]:
    devices = [torch.device(name) for name in states if name != "cpu"]
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.random.fork_rng(devices=[]))
        for kind in sorted({d.type for d in devices}):
            stack.enter_context(torch.random.fork_rng(
                devices=[d for d in devices if d.type == kind], device_type=kind))
        torch.set_rng_state(states["cpu"])
        for device in devices:
            torch.get_device_module(device.type).set_rng_state(states[str(device)], device)
        yield


def _autocast_state(args: tuple[Any, ...], kwargs: dict[str, Any]
                    ) -> tuple[tuple[str, bool, torch.dtype], ...]:
    """``(device type, enabled, dtype)`` of autocast on the CPU and on the inputs' devices."""
    kinds = {"cpu"} | {t.device.type for t in _tensors((args, kwargs))
                       if t.device.type != "meta"}
    return tuple((kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind))
                 for kind in sorted(kinds))


def kept_checkpoint(module: nn.Module) -> nn.Module:
    """Checkpoint ``module`` (whole-block recompute) so that a split backward's two passes
    read one recompute (module docstring); returns ``module``, its parameters' names
    unchanged."""
    if is_kept_checkpoint(module):
        return module
    state = _State()
    module.__dict__["_fxplan_kept_checkpoint"] = state

    def before(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if state.recomputing:
            return
        frame = _Frame(mod, _detached(args), _detached(kwargs), _rng_states(args, kwargs),
                       _autocast_state(args, kwargs))

        def pack(tensor: torch.Tensor) -> int:
            frame.packed += 1
            return frame.packed - 1

        hooks = torch.autograd.graph.saved_tensors_hooks(pack, frame.unpack)
        hooks.__enter__()
        state.hooks.append(hooks)

    def after(mod: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if state.recomputing or not state.hooks:
            return
        state.hooks.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, always_call=True)
    return module
