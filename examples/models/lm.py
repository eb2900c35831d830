"""Pieces shared by the causal language models (GPT, Llama): loss and example inputs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from examples.bundle import InputSpec
from examples.models.validation import check_seq


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all ``batch × seq`` positions."""
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def lm_example_inputs(config: Any, batch: int, seq: int | None,
                      with_targets: bool) -> dict[str, InputSpec]:
    """``tokens`` (and ``targets``) of shape ``(batch, seq)``, int64."""
    tokens = InputSpec((batch, check_seq(config, seq)), torch.int64)
    return {"tokens": tokens, "targets": tokens} if with_targets else {"tokens": tokens}
