"""A small ResNet-style image classifier, single-device, ordinary PyTorch.

Stem ``conv3×3 → BN → ReLU`` at ``width`` channels, then ``stages`` stages of
``blocks_per_stage`` basic blocks (``conv3×3 → BN → ReLU → conv3×3 → BN``, plus the
shortcut, then ReLU). Stage ``i`` has ``width·2^i`` channels; its first block halves the
resolution (stride 2) and projects the shortcut with a 1×1 conv. The blocks live in one flat
``ModuleList`` so that capture numbers them as layers; blocks of equal shape are repeats.
Global average pooling and a linear head end it. ``forward(images, targets=None)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.examples.bundle import InputSpec
from fxplan.examples.models.validation import require_no_seq, require_positive


@dataclass
class ConvNetConfig:
    """ConvNet shape; ``image_size`` must survive ``stages - 1`` halvings."""

    in_channels: int = 3
    width: int = 32
    stages: int = 3
    blocks_per_stage: int = 2
    classes: int = 10
    image_size: int = 32

    def __post_init__(self) -> None:
        require_positive(self, "in_channels", "width", "stages", "blocks_per_stage", "classes",
                         "image_size")
        if self.image_size % 2 ** (self.stages - 1):
            raise ValueError(f"ConvNetConfig: image_size={self.image_size} must be divisible by "
                             f"2^(stages-1) = {2 ** (self.stages - 1)} (one halving per stage "
                             f"after the first)")


class BasicBlock(nn.Module):
    """Two 3×3 convs with batch norm and a (projected when the shape changes) shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class ConvNet(nn.Module):
    """Stem, residual stages, pooling, classifier."""

    def __init__(self, config: ConvNetConfig) -> None:
        super().__init__()
        self.config = config
        w = config.width
        self.stem = nn.Sequential(nn.Conv2d(config.in_channels, w, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(w), nn.ReLU())
        blocks, cin = [], w
        for stage in range(config.stages):
            cout = w * 2 ** stage
            for i in range(config.blocks_per_stage):
                blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, config.classes)

    def forward(self, images: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        x = self.stem(images)
        for block in self.blocks:
            x = block(x)
        logits = self.head(torch.flatten(self.pool(x), 1))
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets)


def example_inputs(config: ConvNetConfig, batch: int, seq: int | None = None,
                   with_targets: bool = True) -> dict[str, InputSpec]:
    """``images`` (batch, C, H, W) float32 and ``targets`` (batch,) int64; no sequence axis."""
    require_no_seq(seq, "conv net", "; set image_size instead")
    size = config.image_size
    images = InputSpec((batch, config.in_channels, size, size), torch.float32)
    if not with_targets:
        return {"images": images}
    return {"images": images, "targets": InputSpec((batch,), torch.int64)}
