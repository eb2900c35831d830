"""A model's forward under another signature, the model otherwise unchanged: its class is
swapped for a subclass of the same name whose ``forward`` is generated, so every parameter
keeps its name (``layers.0.…``, not ``model.layers.0.…``) and the plan's placements name the
user's parameters. The forward is generated with named parameters because ``symbolic_trace``
names its placeholders after the forward's code (``*args`` would be one placeholder).

* :func:`forward_with_loss` (capture): ``forward(self, <inputs>, targets)`` is
  ``loss(out, targets)`` with ``out`` the tensor the original forward returns for ``<inputs>``
  (:func:`fxplan.core.model_output.model_output`), so the graph the search prices ends in the
  loss the trainer computes, even when the model's own forward computes none.
* :func:`forward_taking` (launch): ``forward(self, <inputs>)`` passes each input to the
  original forward by name, so inputs fed by position (the runtime's stages, DDP, the trainer)
  reach the parameters capture bound them to by name (T5's ``decoder_input_ids`` is its third
  parameter, after ``attention_mask``).
"""

from __future__ import annotations

import contextlib
import inspect
import keyword
from typing import Any, Callable, Iterator, Sequence

import torch
import torch.fx

from fxplan.core.model_output import model_output
from fxplan.passes.errors import CaptureError

__all__ = ["forward_with_loss", "forward_taking", "taking", "binds_by_position", "traces_loss",
           "computes_own_loss", "TARGETS"]

#: The input that carries the loss's targets.
TARGETS = "targets"


def _output(out: Any) -> Any:
    """The loss's input: a traced proxy as it is, else the model's output tensor."""
    return out if isinstance(out, torch.fx.Proxy) else model_output(out)


def _swapped(original: type, names: Sequence[str], extra: Sequence[str], body: str,
             scope: dict[str, Any]) -> type:
    """A subclass of ``original`` of the same name whose ``forward(self, *names, *extra)``
    returns ``body`` (an expression over ``call``, the original forward called by name)."""
    bad = [n for n in [*names, *extra] if not n.isidentifier() or keyword.iskeyword(n)]
    if bad or len(set([*names, *extra])) != len(names) + len(extra):
        raise CaptureError(f"cannot give {original.__name__} a forward taking {list(names)}: "
                           f"expected distinct identifiers, none named {', '.join(extra)}")
    parameters = ", ".join([*names, *extra])
    call = f"_forward(self, {', '.join(f'{n}={n}' for n in names)})"
    scope = {**scope, "_forward": original.forward}
    exec(f"def forward(self, {parameters}):\n    return {body.format(call=call)}\n", scope)
    forward = scope["forward"]
    forward.__doc__ = f"{original.__name__}.forward, its inputs bound by name."
    return type(original.__name__, (original,), {
        "forward": forward, "__module__": original.__module__,
        "__qualname__": original.__qualname__})


@contextlib.contextmanager
def forward_with_loss(model: torch.nn.Module, loss: Callable[[Any, Any], Any],
                      names: Sequence[str]) -> Iterator[None]:
    """``model`` runs ``loss(forward(**names), targets)`` inside the block (module docstring);
    its class is restored after."""
    original = type(model)
    model.__class__ = _swapped(original, names, (TARGETS,), "_loss(_output({call}), targets)",
                               {"_loss": loss, "_output": _output})
    try:
        yield
    finally:
        model.__class__ = original


def binds_by_position(model: torch.nn.Module, names: Sequence[str]) -> bool:
    """Whether inputs ``names``, given by position, reach the forward parameters of those
    names (they are the first positional parameters, in that order)."""
    params = [p.name for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return params[:len(names)] == list(names)


def forward_taking(model: torch.nn.Module, names: Sequence[str]) -> torch.nn.Module:
    """``model`` whose forward takes ``names`` by position and passes them on by name (module
    docstring); unchanged when they bind by position already. For good: the runtime's stages,
    wrappers and probes call it as the trainer does."""
    if not binds_by_position(model, names):
        model.__class__ = _swapped(type(model), names, (), "{call}", {})
    return model


@contextlib.contextmanager
def taking(model: torch.nn.Module, names: Sequence[str]) -> Iterator[torch.nn.Module]:
    """:func:`forward_taking` inside the block only (a model shared with other callers)."""
    original = type(model)
    try:
        yield forward_taking(model, names)
    finally:
        model.__class__ = original


def traces_loss(bundle: Any, model: torch.nn.Module, example: Any) -> bool:
    """Whether capture traces ``bundle``'s loss after the forward: the bundle fixes a loss, the
    example holds its targets, and the forward either does not take them or computes a loss
    other than the bundle's (``loss_outside``)."""
    if getattr(bundle, "loss", None) is None or not isinstance(example, dict) \
            or TARGETS not in example:
        return False
    return not computes_own_loss(bundle, model)


def computes_own_loss(bundle: Any, model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward is trained on the loss it computes itself: the bundle fixes
    a loss (a user file), the file defines none (``loss_outside``) and the forward takes
    ``targets``. Capture then feeds it the targets and prices its loss, and the launch feeds
    it the targets and minimises the loss it returns
    (:func:`fxplan.core.model_output.returned_loss`)."""
    return getattr(bundle, "loss", None) is not None \
        and not getattr(bundle, "loss_outside", False) \
        and TARGETS in inspect.signature(model.forward).parameters
