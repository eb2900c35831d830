"""An encoder-decoder (T5-style, text to text) in small, as a user writes one: the forward
takes the source ids and the decoder's input ids, ``forward(src, tgt)``, and returns the
decoder's logits ``(b, t, V)``; ``build()`` gives its inputs as a dict in another order than
the forward's parameters (``tgt`` first) with the ``targets`` (the next target tokens), and the
file defines its loss, ``loss(outputs, batch)``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, HEADS, LAYERS, SRC, TGT = 64, 32, 4, 2, 8, 6


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.kv = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, causal: bool) -> torch.Tensor:
        b, t, c = x.shape
        q = self.q(x).view(b, t, HEADS, c // HEADS).transpose(1, 2)
        k, v = (z.view(b, memory.shape[1], HEADS, c // HEADS).transpose(1, 2)
                for z in self.kv(memory).chunk(2, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.o(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wi = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.wo = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(F.relu(self.wi(x)))


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn, self.ff = Attention(), FeedForward()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, False)
        return x + self.ff(self.norm2(x))


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(HIDDEN) for _ in range(3))
        self.self_attn, self.cross_attn, self.ff = Attention(), Attention(), FeedForward()

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h, True)
        x = x + self.cross_attn(self.norm2(x), memory, False)
        return x + self.ff(self.norm3(x))


class Seq2Seq(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.encoder = nn.ModuleList(EncoderLayer() for _ in range(LAYERS))
        self.decoder = nn.ModuleList(DecoderLayer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        memory = self.embed(src)
        for layer in self.encoder:
            memory = layer(memory)
        y = self.embed(tgt)
        for layer in self.decoder:
            y = layer(y, memory)
        return self.lm_head(self.norm(y))


def loss(outputs: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the decoder's logits against the next target tokens."""
    return F.cross_entropy(outputs.flatten(0, 1), batch["targets"].flatten())


def build() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The model and an example batch: decoder ids first, then source ids, then targets."""
    return Seq2Seq(), {"tgt": torch.zeros(4, TGT, dtype=torch.long),
                       "src": torch.zeros(4, SRC, dtype=torch.long),
                       "targets": torch.zeros(4, TGT, dtype=torch.long)}
