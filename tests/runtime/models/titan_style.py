"""A torchtitan-style Llama in small: its layers are a ``ModuleDict`` keyed ``"0"``, ``"1"``…
that the forward iterates with ``.values()``, and the output projection may be absent on a
pipeline stage (``if self.output``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, HEADS, LAYERS = 64, 32, 4, 2


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wq = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.wk = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.wv = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.wo = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, HIDDEN // HEADS).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.w3 = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.w2 = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(HIDDEN)
        self.attention = Attention()
        self.ffn_norm = nn.RMSNorm(HIDDEN)
        self.feed_forward = FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleDict({str(i): TransformerBlock() for i in range(LAYERS)})
        self.norm = nn.RMSNorm(HIDDEN)
        self.output = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of token ids (4 × 8)."""
    return Transformer(), torch.zeros(4, 8, dtype=torch.long)
