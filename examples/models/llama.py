"""A Llama-style decoder, single-device, ordinary PyTorch.

RMSNorm (pre-norm), rotary position embeddings precomputed as ``cos``/``sin`` buffers,
grouped-query attention (``kv_heads`` key/value heads shared by ``heads / kv_heads`` query
heads each) through ``F.scaled_dot_product_attention``, and a SwiGLU MLP::

    x = x + Wo(Attention(RoPE(Wq·n), RoPE(Wk·n), Wv·n))      n = RMSNorm(x)
    x = x + W2(SiLU(W1·m) ⊙ W3·m)                            m = RMSNorm(x)

No biases, no dropout, untied output head (``tie_embeddings=True`` ties it). The MLP width
follows Llama: ``ffn = multiple_of · ⌈(8h/3) / multiple_of⌉`` unless ``ffn_hidden`` is given
(h = 4096 → 11008). Parameters per block: ``h·(2h + 2·kv·d) + 3·h·ffn + 2h`` with head width
``d = h / heads``.

fx: ``forward(tokens, targets=None)``; the rotary tables are buffers narrowed to the input
length, so nothing depends on a traced shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.examples.models.lm import init_lm_weights, lm_loss
from fxplan.examples.models.validation import (require_divisible, require_positive,
                                               require_positive_float)


@dataclass
class LlamaConfig:
    """Llama shape; defaults are Llama-2 7B (``kv_heads=None`` means ``heads``: plain MHA)."""

    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int | None = None
    vocab: int = 32000
    seq: int = 4096
    ffn_hidden: int | None = None
    multiple_of: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.kv_heads is None:
            self.kv_heads = self.heads
        if self.ffn_hidden is None:
            width = int(8 * self.hidden / 3)
            self.ffn_hidden = self.multiple_of * -(-width // self.multiple_of)
        require_positive(self, "layers", "hidden", "heads", "kv_heads", "vocab", "seq",
                         "ffn_hidden", "multiple_of")
        require_positive_float(self, "norm_eps", "rope_theta")
        require_divisible(self, "hidden", "heads")
        require_divisible(self, "heads", "kv_heads")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head width hidden/heads = {self.hidden}/{self.heads} "
                             f"= {self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def rotary_tables(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` of angle ``p·θ^(-2i/d)`` for position p, frequency i; (seq, d)."""
    d = config.head_dim
    inv_freq = config.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(config.seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs ``(x_i, x_{i+d/2})`` of ``x`` (b, heads, t, d) by their angles."""
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    """Grouped-query causal attention with rotary embeddings on queries and keys."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = config.heads, config.kv_heads, config.head_dim
        self.wq = nn.Linear(config.hidden, config.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden, config.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(config.heads * self.head_dim, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t = x.size(0), x.size(1)
        q = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv_heads != self.heads)
        return self.wo(y.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class FeedForward(nn.Module):
    """SwiGLU: ``W2(SiLU(W1·x) ⊙ W3·x)``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.hidden, config.ffn_hidden, bias=False)
        self.w2 = nn.Linear(config.ffn_hidden, config.hidden, bias=False)
        self.w3 = nn.Linear(config.hidden, config.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    """One pre-RMSNorm Llama layer."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embedding, ``layers`` decoder layers, final RMSNorm, output head."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.hidden)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.hidden, eps=config.norm_eps)
        self.output = nn.Linear(config.hidden, config.vocab, bias=False)
        if config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rotary_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_lm_weights(self)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = tokens.size(1)
        cos, sin = self.rope_cos.narrow(0, 0, t), self.rope_sin.narrow(0, 0, t)
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits
        return lm_loss(logits, targets)

