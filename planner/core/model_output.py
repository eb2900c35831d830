"""The tensor a model's forward returns, as training reads it.

A forward may return a tensor, a Hugging Face model output (its ``.logits``) or a tuple or list
whose first item is a tensor (nanoGPT's ``(logits, loss)``). Capture hands this tensor to a
user file's loss, and every pipeline stage and the trainer's loss read the same one.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["model_output"]


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
