"""The tensor a model's forward returns, as training reads it.

A forward may return a tensor, a Hugging Face model output (its ``.logits``) or a tuple or list
whose first item is a tensor (nanoGPT's ``(logits, loss)``). Capture hands this tensor to a
user file's loss, and every pipeline stage and the trainer's loss read the same one.

A forward that is given the targets and computes its own loss returns that loss beside its
output (:func:`returned_loss`): a model output's ``.loss``, or the first scalar floating-point
tensor after the first item of a tuple (nanoGPT's ``(logits, loss)``), or the scalar
itself when that is all it returns.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["model_output", "returned_loss", "describe_output"]


def model_output(out: Any) -> torch.Tensor:
    """The tensor a module returns: itself, ``.logits`` of a model output, or the first item."""
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(f"the model returns {type(out).__name__}, not a tensor, a model output "
                    "with logits or a tuple starting with a tensor")


def returned_loss(out: Any) -> torch.Tensor:
    """The scalar loss a forward given its targets returns (module docstring); ``TypeError``
    when it returns none."""
    if _is_scalar(out):
        return out
    loss = getattr(out, "loss", None)
    if _is_scalar(loss):
        return loss
    if isinstance(out, (tuple, list)):
        found = next((item for item in out[1:] if _is_scalar(item)), None)
        if found is not None:
            return found
    raise TypeError(f"the model returns {describe_output(out)}, not a loss: expected a tuple "
                    "(output, loss), a model output with .loss or the loss alone, a scalar "
                    "tensor")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() == 0 and value.is_floating_point()


def describe_output(out: Any) -> str:
    """``out`` in a few words: a tensor's shape, a tuple's items."""
    if isinstance(out, torch.Tensor):
        return f"a tensor of shape {tuple(out.shape)}"
    if isinstance(out, (tuple, list)):
        items = ", ".join(str(tuple(x.shape)) if isinstance(x, torch.Tensor) else
                          type(x).__name__ for x in out)
        return f"a {type(out).__name__} ({items})"
    return type(out).__name__
