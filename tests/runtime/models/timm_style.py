"""A timm-style vision transformer classifier in small: patches by a strided convolution, a
class token and position embedding as parameters of the model itself, ``blocks`` an
``nn.Sequential``, and ``forward(x)`` the class scores ``(b, classes)`` of an image batch. The
file names no loss and no labels: training uses the default (cross-entropy against class ids
derived from the output's shape)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

CHANNELS, IMAGE, PATCH, HIDDEN, HEADS, LAYERS, CLASSES = 3, 16, 8, 32, 4, 2, 10


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.norm2 = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.fc2 = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).reshape(b, n, c))
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class VisionTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(CHANNELS, HIDDEN, PATCH, stride=PATCH)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, HIDDEN))
        self.pos_embed = nn.Parameter(torch.randn(1, (IMAGE // PATCH) ** 2 + 1, HIDDEN) * 0.02)
        self.blocks = nn.Sequential(*[Block() for _ in range(LAYERS)])
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.head(x[:, 0])


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of images (4 × 3 × 16 × 16)."""
    return VisionTransformer(), torch.zeros(4, CHANNELS, IMAGE, IMAGE)
