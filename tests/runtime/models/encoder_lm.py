"""A user model made of ``torch.nn`` parts for the runtime tests: a token embedding, an
``nn.TransformerEncoder`` of 2 layers (no dropout, so ranks and one process agree) and a
linear head; ``build()`` returns the model and an example input, as user files do."""

import torch
import torch.nn as nn

VOCAB, HIDDEN, HEADS, LAYERS, SEQ = 64, 32, 4, 2, 8


class EncoderLM(nn.Module):
    def __init__(self, vocab: int = VOCAB, hidden: int = HIDDEN, heads: int = HEADS,
                 layers: int = LAYERS):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, 2 * hidden, dropout=0.0,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens):
        return self.head(self.encoder(self.emb(tokens)))


def build():
    return EncoderLM(), torch.zeros(4, SEQ, dtype=torch.long)


def build_wide():
    """The same model 32× wider (hidden 1024, 4 heads): wide enough that the search splits it
    over tp (at hidden 32, at 256 since the cost model prices DTensor's per-op dispatch on
    local-cpu, and at 512 since the CPU's class efficiencies were re-measured in 2026-11-24 (`c352b19`),
    replicating it is cheaper than the tp collectives and dispatch; 768 splits)."""
    return EncoderLM(hidden=1024), torch.zeros(4, SEQ, dtype=torch.long)
