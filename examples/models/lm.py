"""Pieces shared by the causal language models (GPT, Llama): loss and example inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fxplan.examples.bundle import InputSpec
from fxplan.examples.models.validation import check_seq


def init_lm_weights(model: torch.nn.Module, std: float = 0.02) -> None:
    """GPT-2's initialisation: linear and embedding weights ~ N(0, std²), biases 0.

    PyTorch's defaults draw embeddings from N(0, 1); tied to the LM head that makes the first
    logits of size √hidden and the first loss far above ln(vocab). On the meta device this
    is a no-op.
    """
    for module in model.modules():
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=std)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all ``batch × seq`` positions."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def lm_example_inputs(config: Any, batch: int, seq: int | None,
                      with_targets: bool) -> dict[str, InputSpec]:
    """``tokens`` (and ``targets``) of shape ``(batch, seq)``, int64."""
    tokens = InputSpec((batch, check_seq(config, seq)), torch.int64)
    return {"tokens": tokens, "targets": tokens} if with_targets else {"tokens": tokens}
