"""A global batch stated in tokens (``--batch-tokens 4M``), as people state it, into sequences.

Batch sizes are quoted in binary units: Llama 2's "4M tokens" is 1024 sequences of 4096
tokens = 4 · 2²⁰, so here ``K`` = 2¹⁰, ``M`` = 2²⁰, ``B``/``G`` = 2³⁰ (a plain number is a
count of tokens). With ``s`` tokens per sequence the global batch is the whole number of
sequences nearest to ``T / s``::

    B = max(1, round(T / s))          4M at s = 4096 → 1024;  4M at s = 8192 → 512

and the batch trained, ``B·s`` tokens, is reported beside it (it differs from ``T`` when ``s``
does not divide it).
"""

from __future__ import annotations

import re

from fxplan.core.errors import UserError

__all__ = ["BatchTokensError", "batch_from_tokens", "parse_batch_tokens"]

_BINARY = {"": 1, "K": 2 ** 10, "k": 2 ** 10, "M": 2 ** 20, "B": 2 ** 30, "G": 2 ** 30}


class BatchTokensError(UserError, ValueError):
    """A ``--batch-tokens`` value that is not a positive token count."""


def parse_batch_tokens(text: str) -> int:
    """``"4M"`` → 4 194 304, ``"512K"`` → 524 288, ``"1000000"`` → 1 000 000."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKMBG]?)\s*", str(text))
    if not match or float(match[1]) * _BINARY[match[2]] < 1:
        raise BatchTokensError(
            f"--batch-tokens: found {text!r}, expected a positive number of tokens per step with "
            "an optional binary suffix K (2^10), M (2^20) or B (2^30), e.g. 4M (1024 sequences "
            "of 4096 tokens)")
    return round(float(match[1]) * _BINARY[match[2]])


def batch_from_tokens(tokens: int, seq: int | None) -> int:
    """``max(1, round(tokens / seq))`` sequences (module docstring); a model without a sequence
    dimension has no tokens to count."""
    if not seq:
        raise BatchTokensError(
            "--batch-tokens: the model has no sequence dimension, so a batch in tokens has no "
            "meaning; expected --batch (samples per step)")
    return max(1, round(tokens / seq))
