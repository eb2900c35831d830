"""Trace a model into a flat fx graph for the rewrite passes.

``torch.fx.symbolic_trace`` with every ``forward`` parameter beyond the given inputs that
defaults to ``None`` fixed to ``None`` (``targets=None`` in the example GPT), so the traced
program is ``inputs → outputs`` with no data-dependent branch left open. Node names are those
capture gives, so a plan's ``placements.nodes`` apply.
"""

from __future__ import annotations

import inspect

from torch import fx, nn

__all__ = ["trace_model"]


def trace_model(model: nn.Module, num_inputs: int) -> fx.GraphModule:
    """Flat graph of ``model.forward`` over its first ``num_inputs`` parameters."""
    signature = inspect.signature(model.forward)
    concrete = {
        name: None
        for i, (name, param) in enumerate(signature.parameters.items())
        if i >= num_inputs and param.default is None
    }
    return fx.symbolic_trace(model, concrete_args=concrete or None)
