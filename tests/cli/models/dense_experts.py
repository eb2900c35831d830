"""A model with batched expert weights ``[E, ·, ·]`` (4 experts) in a layer fxplan's runtime
cannot split under expert parallelism: no router step methods and no routed experts forward
(every token goes through every expert, averaged). The planner prices it as a mixture of
experts, so an ``ep = 2`` plan can be made; ``fxplan launch`` must refuse it before any process."""

import torch
import torch.nn as nn


class DenseExperts(nn.Module):
    def __init__(self, d=16, f=32, experts=4):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.w1 = nn.Parameter(torch.randn(experts, d, f) * 0.1)
        self.w2 = nn.Parameter(torch.randn(experts, f, d) * 0.1)

    def forward(self, x):
        b, s, d = x.shape
        h = torch.relu(torch.einsum("td,edf->etf", self.norm(x).reshape(b * s, d), self.w1))
        return x + torch.einsum("etf,efd->td", h, self.w2).reshape(b, s, d) / self.w1.shape[0]


class Model(nn.Module):
    def __init__(self, vocab=64, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([DenseExperts(d), DenseExperts(d)])
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build():
    return Model(), torch.zeros(2, 16, dtype=torch.long)
