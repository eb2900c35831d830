"""Checks shared by the model configs' ``__post_init__``; each error shows the arithmetic."""

from __future__ import annotations

import math
from typing import Any, Iterable

#: Upper bounds of model dimensions: a repeated-block count (layers, stages) above
#: :data:`MAX_LAYERS` or a width above :data:`MAX_WIDTH` describes no trainable model, and
#: building one would not finish (docs/cli.md "Input bounds").
MAX_LAYERS = 10_000
MAX_WIDTH = 2 ** 24
_COUNTS = ("layers", "stages", "blocks_per_stage")


def require_positive(config: Any, *names: str) -> None:
    """Every named field is a positive ``int`` up to its bound (:data:`MAX_LAYERS` for block
    counts, :data:`MAX_WIDTH` for widths and vocabularies)."""
    for name in names:
        value = getattr(config, name)
        high = MAX_LAYERS if name in _COUNTS else MAX_WIDTH
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            shown = repr(value) if len(repr(value)) < 24 else f"{repr(value)[:10]}…"
            raise ValueError(f"{type(config).__name__}.{name} must be a positive integer "
                             f"≤ {high:,}, got {shown}")


def require_positive_float(config: Any, *names: str) -> None:
    """Every named field is a finite number > 0 (an epsilon, a rotary base)."""
    for name in names:
        value = getattr(config, name)
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{type(config).__name__}.{name} must be a finite number > 0, "
                             f"got {value!r}")


def require_divisible(config: Any, numerator: str, denominator: str) -> int:
    """``numerator`` is a multiple of ``denominator``; returns the quotient."""
    a, b = getattr(config, numerator), getattr(config, denominator)
    if a % b:
        raise ValueError(f"{type(config).__name__}: {numerator}={a} is not divisible by "
                         f"{denominator}={b} ({a} / {b} = {a / b:.4g})")
    return a // b


def require_probability(config: Any, name: str) -> None:
    """A dropout-like probability in [0, 1)."""
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{type(config).__name__}.{name} must be in [0, 1), got {value!r}")


def require_choice(config: Any, name: str, choices: Iterable[str]) -> None:
    """A string field among ``choices``."""
    value, allowed = getattr(config, name), tuple(choices)
    if value not in allowed:
        raise ValueError(f"{type(config).__name__}.{name} must be one of "
                         f"{', '.join(map(repr, allowed))}, got {value!r}")


def check_seq(config: Any, seq: int | None) -> int:
    """The sequence length to use: ``seq`` if given (1 ≤ seq ≤ config.seq), else config.seq."""
    if seq is None:
        return config.seq
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq <= config.seq:
        raise ValueError(f"seq={seq!r} must be an integer in [1, {config.seq}] "
                         f"(the model's position table holds {config.seq} positions)")
    return seq


def require_no_seq(seq: int | None, model: str, hint: str = "") -> None:
    """Models without a sequence axis refuse a ``seq`` request."""
    if seq is not None:
        raise ValueError(f"the {model} has no sequence axis; leave seq unset{hint}")
