"""A GPT in small whose attention reshapes by head counts stored on the module, as much
hand-written code does: separate ``q``/``k``/``v`` Linears viewed as ``(b, t, self.n_head,
self.head_dim)`` (keys and values with ``self.n_kv_head`` heads, grouped-query attention), the
heads joined back by ``reshape(b, t, self.n_embd)``. Under tensor parallelism the runtime sets
the local counts on each rank (``fxplan.runtime.styles.tp_head_counts``)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, SEQ = 64, 32, 4, 2, 2, 8


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.n_embd = HEADS, KV_HEADS, HIDDEN
        self.head_dim = HIDDEN // HEADS
        self.q = nn.Linear(HIDDEN, HEADS * self.head_dim, bias=False)
        self.k = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.v = nn.Linear(HIDDEN, KV_HEADS * self.head_dim, bias=False)
        self.o = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.n_kv_head, self.head_dim).transpose(1, 2)
        groups = self.n_head // self.n_kv_head
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, self.n_embd))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.up, self.down = nn.Linear(HIDDEN, 2 * HIDDEN), nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.down(F.gelu(self.up(self.ln_2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.head(self.ln_f(x))


def build() -> tuple[nn.Module, torch.Tensor]:
    """The model and an example batch of token ids (4 × 8)."""
    return GPT(), torch.zeros(4, SEQ, dtype=torch.long)
