"""A GPT decoder (Megatron/GPT-2 layout), single-device, ordinary PyTorch.

Learned token and position embeddings, ``layers`` pre-LayerNorm blocks, a final LayerNorm
and an LM head tied to the token embedding. Each block::

    x = x + Dropout(Proj(Attention(LN1(x))))
    x = x + Dropout(FC2(GeLU(FC1(LN2(x)))))          FC1: h → 4h, FC2: 4h → h

Dropouts sit where Megatron has them: after the embeddings, on the attention probabilities,
after the attention projection and after the MLP.

Parameters (biases included, final LayerNorm aside): per block ``12h² + 13h``, embeddings
``(V + s)·h``, so ``P = 12·l·h²·(1 + 13/(12h) + (V+s)/(12·l·h))`` (Narayanan et al., 2021).

``attention="math"`` spells attention out (``QKᵀ``, scale, causal mask from a buffer, softmax,
dropout, ``@V``): what Korthikanti et al. (2022) count as ``34·s·b·h + 5·a·s²·b`` bytes of
saved activations per layer in 16-bit precision. ``attention="sdpa"`` calls
``F.scaled_dot_product_attention`` (fused on GPUs).

fx: ``forward(tokens, targets=None)`` returns the logits, or the loss when ``targets`` is
given; trace the logits variant with ``concrete_args={"targets": None}`` (capture does this
when no ``targets`` input is given). The causal mask and the positions are buffers narrowed to the
input length (``narrow`` takes a traced length where ``[:t]`` does not).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxplan.examples.models.lm import init_lm_weights, lm_loss
from fxplan.examples.models.validation import (require_choice, require_divisible, require_positive,
                                        require_positive_float, require_probability)

ATTENTION_KINDS = ("math", "sdpa")


@dataclass
class GPTConfig:
    """GPT shape. Defaults: GPT-2-small depth and width with Megatron's vocabulary and seq."""

    layers: int = 12
    hidden: int = 768
    heads: int = 12
    vocab: int = 51200
    seq: int = 2048
    dropout: float = 0.1
    attention: str = "math"
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        require_positive(self, "layers", "hidden", "heads", "vocab", "seq")
        require_divisible(self, "hidden", "heads")
        require_probability(self, "dropout")
        require_positive_float(self, "ln_eps")
        require_choice(self, "attention", ATTENTION_KINDS)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with one fused QKV projection."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads, self.hidden, self.head_dim = config.heads, config.hidden, config.head_dim
        self.math = config.attention == "math"
        self.p = config.dropout
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(config.hidden, 3 * config.hidden)
        self.proj = nn.Linear(config.hidden, config.hidden)
        self.attn_drop = nn.Dropout(config.dropout)
        self.resid_drop = nn.Dropout(config.dropout)
        if self.math:  # True above the diagonal: the future positions a token must not see
            pos = torch.arange(config.seq)
            future = pos.view(1, -1) > pos.view(-1, 1)  # [i, j] = j > i
            self.register_buffer("future", future.view(1, 1, config.seq, config.seq),
                                 persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.size(0), x.size(1)
        q, k, v = self.qkv(x).split(self.hidden, dim=2)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)  # (b, a, t, d)
        k = k.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        if self.math:
            scores = (q @ k.transpose(-2, -1)) * self.scale            # (b, a, t, t)
            future = self.future.narrow(2, 0, t).narrow(3, 0, t)  # narrow: fx-traceable slice
            scores = scores.masked_fill(future, float("-inf"))
            probs = self.attn_drop(F.softmax(scores, dim=-1))
            y = probs @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.p if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(b, t, self.hidden)
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    """``h → w → h`` (``w = 4h`` unless given) with GeLU and a dropout after the second
    projection."""

    def __init__(self, config: GPTConfig, width: int | None = None) -> None:
        super().__init__()
        width = 4 * config.hidden if width is None else width
        self.fc1 = nn.Linear(config.hidden, width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(width, config.hidden)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Block(nn.Module):
    """One pre-LN transformer layer; ``mlp`` replaces the feed-forward part (a mixture of
    experts, :mod:`examples.models.moe`)."""

    def __init__(self, config: GPTConfig, mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.hidden, eps=config.ln_eps)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.hidden, eps=config.ln_eps)
        self.mlp = MLP(config) if mlp is None else mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Decoder-only transformer with learned positions and a tied LM head."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab, config.hidden)
        self.wpe = nn.Embedding(config.seq, config.hidden)
        self.drop = nn.Dropout(config.dropout)
        self.h = nn.ModuleList(self.block(config, i) for i in range(config.layers))
        self.ln_f = nn.LayerNorm(config.hidden, eps=config.ln_eps)
        self.lm_head = nn.Linear(config.hidden, config.vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied: one Parameter, two modules
        self.register_buffer("positions", torch.arange(config.seq), persistent=False)
        init_lm_weights(self)

    def block(self, config: GPTConfig, index: int) -> nn.Module:
        """Layer ``index`` (a subclass may vary the layers: :class:`examples.models.moe.MoEGPT`)."""
        return Block(config)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = tokens.size(1)
        x = self.drop(self.wte(tokens) + self.wpe(self.positions.narrow(0, 0, t)))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        if targets is None:
            return logits
        return lm_loss(logits, targets)

