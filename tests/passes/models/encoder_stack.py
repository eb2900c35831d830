"""A user model made of ``torch.nn`` parts: ``nn.TransformerEncoder`` over 2 layers."""

import torch
import torch.nn as nn


class EncoderLM(nn.Module):
    def __init__(self, vocab: int = 256, hidden: int = 64, heads: int = 4, layers: int = 2):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.emb(tokens)))


def build():
    return EncoderLM(), torch.zeros(2, 32, dtype=torch.long)
