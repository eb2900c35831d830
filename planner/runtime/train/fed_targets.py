"""Training a forward that takes the targets and returns its own loss.

A user file's ``forward(idx, targets=None)`` that computes its loss when given the targets
(nanoGPT's ``(logits, loss)``), in a file that defines no ``loss(outputs, batch)``, is priced
with that loss: capture feeds it the targets
(:func:`fxplan.passes.forward_swap.computes_own_loss`). Training runs the same path, so that
what is priced is what is trained:

* the targets are one more input, the last: the forward is called by position with
  ``(*inputs, targets)`` and binds them by name, as capture did
  (:func:`fxplan.passes.forward_swap.forward_taking`); each microbatch gets its own rows of
  both (:class:`FedTargets`: the data source's ``(inputs, targets)`` becomes
  ``((*inputs, targets), targets)``);
* the loss minimised is the one the forward returns, ``L_j = returned_loss(forward(x_j, y_j))``
  (:class:`ReturnedLoss`, :func:`fxplan.core.model_output.returned_loss`), whatever the
  trainer's default would compute on the output; the mean over microbatches and the dp
  reduction are those of any loss (:mod:`fxplan.runtime.train.accumulate`).

A pipeline cannot run it (:func:`pipeline_refusal`): a stage gets the previous stage's hidden
state, the targets reach only the first stage's forward, and the forward's own loss is computed
where its head runs (the last stage) on the path it takes when given targets; cut into stages,
a forward that branches on ``targets`` takes its other path (nanoGPT's inference path returns
the last position only) on the stages without them. It runs at module level only: the graph
rewrite runs a traced program, not the user's forward, so no hook would see its loss (the
search's check does not offer the graph rewrite for it; a launch with ``--path graph`` is
refused).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fxplan.core.model_output import returned_loss

if TYPE_CHECKING:  # pragma: no cover
    from fxplan.core.plan import Plan
    from fxplan.runtime.train.data import Batch, DataSource

__all__ = ["FedTargets", "ReturnedLoss", "pipeline_refusal"]


class FedTargets:
    """A data source whose batches feed the targets to the forward too (module docstring):
    ``((*inputs, targets), targets)``; anything else (``skip``) is the source's."""

    def __init__(self, source: "DataSource") -> None:
        self.source = source

    def batch(self, step: int, start: int, stop: int) -> "Batch":
        inputs, targets = self.source.batch(step, start, stop)
        return (*inputs, targets), targets

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class ReturnedLoss:
    """The trainer's loss for such a forward: a forward hook on the model keeps the loss each
    call returns (before the runtime's own hook reduces the output to its first tensor, the
    one DDP, FSDP and the stages see), and calling this object as the loss hands it over.
    ``value`` is taken once: a loss never read twice, a forward that did not run is an
    error, not last microbatch's loss."""

    def __init__(self, model: nn.Module) -> None:
        self.value: torch.Tensor | None = None
        model.register_forward_hook(self._record, prepend=True)

    def _record(self, module: nn.Module, args: Any, out: Any) -> None:
        self.value = returned_loss(out)

    def __call__(self, output: Any, targets: torch.Tensor) -> torch.Tensor:
        """The loss the forward that made ``output`` returned (``targets`` were its input)."""
        value, self.value = self.value, None
        if value is None:
            raise RuntimeError("the forward's own loss was not recorded: the model's forward "
                               "did not run as the user's module (fed targets need the "
                               "module-level runtime)")
        return value


def pipeline_refusal(plan: "Plan") -> str | None:
    """Why ``plan`` cannot train a forward that computes its own loss (module docstring), or
    ``None``."""
    if plan.pp == 1:
        return None
    return (f"pp={plan.pp}: the forward takes targets and is trained on the loss it returns, "
            "which a pipeline cannot cut into stages (later stages get a hidden state, not the "
            "targets, and take the forward's path without them); use pp=1, or define "
            "loss(outputs, batch) in the file with a forward that returns every position's "
            "output without targets")
