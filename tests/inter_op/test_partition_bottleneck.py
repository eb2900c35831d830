"""The bottleneck of identical layers with recompute chosen per stage
(:func:`fxplan.inter_op.partition.partition_recompute`): the closed form
``T* = max(L-th smallest T_j(n), max_j T_j(1))`` is the value the bisection over the sorted
table entries ends at, and the split it gives is the one that bisection gives."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.inter_op.partition import _bottleneck, _least_bottleneck


def _table(rng: np.random.Generator, S: int, L: int) -> np.ndarray:
    """``(S, L+1)`` stage times ``T_j(n)``: non-decreasing in ``n`` up to each stage's most
    layers (ties common), ``∞`` beyond and at ``n = 0``."""
    steps = rng.choice([0.0, 0.5, 1.0, 2.0], size=(S, L))
    table = np.concatenate([np.full((S, 1), np.inf),
                            rng.integers(0, 4, size=(S, 1)) + np.cumsum(steps, axis=1)], axis=1)
    most = rng.integers(0, L + 1, size=S)
    table[np.arange(L + 1)[None, :] > most[:, None]] = np.inf
    return table


@pytest.mark.parametrize("seed", range(4))
def test_closed_form_is_the_bisections_answer(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(300):
        S, L = int(rng.integers(1, 7)), int(rng.integers(1, 13))
        table = _table(rng, S, L)
        rows = np.arange(S)

        def take(T: float) -> np.ndarray:
            return (table[:, 1:] <= T).sum(axis=1)

        def cost(n: np.ndarray) -> np.ndarray:
            return table[rows, n]

        finite = table[np.isfinite(table)]
        by_bisection = _bottleneck(np.unique(finite), take, cost, L)
        least = _least_bottleneck(table[:, 1:], L)
        by_closed_form = None if least is None else _bottleneck(np.array([least]), take, cost, L)
        assert by_closed_form == by_bisection
