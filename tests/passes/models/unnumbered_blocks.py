"""Models whose repeated layers are not numbered children of a container: three blocks held as
attributes ``block_a``, ``block_b``, ``block_c`` of one class, and a functional model looping
over ``ParameterList`` weights (the blocks are found from graph structure)."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class AttrModel(nn.Module):
    def __init__(self, vocab=64, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.block_a, self.block_b, self.block_c = Block(d), Block(d), Block(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.block_c(self.block_b(self.block_a(self.emb(tokens)))))


class Functional(nn.Module):
    def __init__(self, vocab=64, d=32, layers=4):
        super().__init__()
        self.emb = nn.Parameter(torch.randn(vocab, d))
        self.w1 = nn.ParameterList([nn.Parameter(torch.randn(4 * d, d)) for _ in range(layers)])
        self.w2 = nn.ParameterList([nn.Parameter(torch.randn(d, 4 * d)) for _ in range(layers)])

    def forward(self, tokens):
        x = F.embedding(tokens, self.emb)
        for w1, w2 in zip(self.w1, self.w2):
            x = x + F.linear(F.relu(F.linear(F.layer_norm(x, x.shape[-1:]), w1)), w2)
        return F.linear(x, self.emb)


def build():
    return AttrModel(), torch.zeros(2, 8, dtype=torch.long)


def build_functional():
    return Functional(), torch.zeros(2, 8, dtype=torch.long)
