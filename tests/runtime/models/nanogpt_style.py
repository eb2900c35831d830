"""A nanoGPT-style language model in small: its forward reads the token ids' shape
(``b, t = idx.size()``) and computes its positions from it, and its blocks are
``transformer.h``; the loss is the caller's (logits of every position). Beside it: nanoGPT's
own ``forward(idx, targets=None)`` (its loss when given targets, the last position's logits
without), one whose own loss is not the trainer's default (label smoothing), and a
``forward(idx)`` that returns the last position's logits only."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, HEADS, LAYERS, BLOCK = 64, 32, 4, 2, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(HIDDEN)
        self.c_attn = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.c_proj = nn.Linear(HIDDEN, HIDDEN)
        self.ln_2 = nn.LayerNorm(HIDDEN)
        self.c_fc = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.mlp_proj = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.c_attn(self.ln_1(x)).split(HIDDEN, dim=2)
        q, k, v = (z.view(b, t, HEADS, c // HEADS).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, HIDDEN), wpe=nn.Embedding(BLOCK, HIDDEN),
            h=nn.ModuleList(Block() for _ in range(LAYERS)), ln_f=nn.LayerNorm(HIDDEN)))
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of token ids (4 × 8)."""
    return GPT(), torch.zeros(4, 8, dtype=torch.long)


class InferenceGPT(GPT):
    """nanoGPT's own ``forward(idx, targets=None)``: given targets, the logits and its loss;
    without, the last position's logits and ``None`` (its inference path)."""

    smoothing = 0.0

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        logits = super().forward(idx)
        if targets is None:
            return logits[:, [-1], :], None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                       ignore_index=-1, label_smoothing=self.smoothing)


def build_inference() -> tuple[nn.Module, torch.Tensor]:
    """:class:`InferenceGPT` and an example batch of token ids (4 × 8)."""
    return InferenceGPT(), torch.zeros(4, 8, dtype=torch.long)


class SmoothedGPT(InferenceGPT):
    """nanoGPT's forward whose own loss is cross-entropy with label smoothing 0.1: not the
    trainer's default, so a run on the default loss is told apart."""

    smoothing = 0.1


def build_smoothed() -> tuple[nn.Module, torch.Tensor]:
    """:class:`SmoothedGPT` and an example batch of token ids (4 × 8)."""
    return SmoothedGPT(), torch.zeros(4, 8, dtype=torch.long)


class LastPositionGPT(GPT):
    """A ``forward(idx)`` that returns the last position's logits only (an inference path
    with no training path beside it)."""

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return super().forward(idx)[:, [-1], :]


def build_last_position() -> tuple[nn.Module, torch.Tensor]:
    """:class:`LastPositionGPT` and an example batch of token ids (4 × 8)."""
    return LastPositionGPT(), torch.zeros(4, 8, dtype=torch.long)
