"""A torchtitan-style (current) Llama in small whose attention is FlexAttention with a causal
block mask built in the forward: planned on a CPU host for a GPU cluster (FlexAttention has no
CPU backward)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

VOCAB, HIDDEN, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 128


def causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    return q >= kv


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wqkv = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.wo = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (z.view(b, t, HEADS, -1).transpose(1, 2) for z in self.wqkv(x).chunk(3, -1))
        mask = create_block_mask(causal, None, None, t, t, device=x.device)
        y = flex_attention(q, k, v, block_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Attention() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = h + layer(h)
        return self.output(self.norm(h))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of token ids (2 × 128: a block mask's block)."""
    return Transformer(), torch.zeros(2, SEQ, dtype=torch.long)
