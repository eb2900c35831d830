"""A multi-layer perceptron classifier, single-device, ordinary PyTorch.

``inp: in → hidden``, then ``layers`` identical residual blocks
``x = x + Dropout(FC2(GeLU(FC1(LN(x)))))`` (``hidden → expansion·hidden → hidden``), a final
LayerNorm and ``head: hidden → classes``. ``forward(x, targets=None)`` returns the logits, or
the cross-entropy loss when ``targets`` (class indices) are given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.examples.bundle import InputSpec
from fxplan.examples.models.validation import require_no_seq, require_positive, require_probability


@dataclass
class MLPConfig:
    """MLP shape."""

    in_features: int = 1024
    hidden: int = 1024
    layers: int = 4
    expansion: int = 4
    classes: int = 10
    dropout: float = 0.0

    def __post_init__(self) -> None:
        require_positive(self, "in_features", "hidden", "layers", "expansion", "classes")
        require_probability(self, "dropout")


class ResidualMLPBlock(nn.Module):
    """``x + Dropout(FC2(GeLU(FC1(LN(x)))))``."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden)
        self.fc1 = nn.Linear(config.hidden, config.expansion * config.hidden)
        self.fc2 = nn.Linear(config.expansion * config.hidden, config.hidden)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.norm(x)))))


class MLP(nn.Module):
    """Input projection, residual blocks, output head."""

    def __init__(self, config: MLPConfig) -> None:
        super().__init__()
        self.config = config
        self.inp = nn.Linear(config.in_features, config.hidden)
        self.blocks = nn.ModuleList(ResidualMLPBlock(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden)
        self.head = nn.Linear(config.hidden, config.classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets)


def example_inputs(config: MLPConfig, batch: int, seq: int | None = None,
                   with_targets: bool = True) -> dict[str, InputSpec]:
    """``x`` (batch, in_features) float32 and ``targets`` (batch,) int64; no sequence axis."""
    require_no_seq(seq, "MLP")
    x = InputSpec((batch, config.in_features), torch.float32)
    if not with_targets:
        return {"x": x}
    return {"x": x, "targets": InputSpec((batch,), torch.int64)}
