"""The schedules' in-flight counts as the search reads them (:func:`fxplan.cost_model.
pipeline_schedules.inflight_counts`): the same numbers as the full op order's, for every
schedule kind, with the distinct rows found by packing each row into one integer."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.cost_model.step.pipeline_schedules import (_unique_rows, inflight_counts,
                                                  schedule_order)

KINDS = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 4), ("zb", 1),
         ("zb", 2), ("zbv", 2), ("dualpipev", 2))


def test_unique_rows_is_numpys_unique_along_rows() -> None:
    rng = np.random.default_rng(0)
    for v in (1, 2, 3, 4):
        for _ in range(100):
            rows = rng.integers(-3, 9, size=(int(rng.integers(0, 40)), v))
            want, got = np.unique(rows, axis=0), _unique_rows(rows)
            assert got.dtype == want.dtype and got.shape == want.shape
            assert (got == want).all()


@pytest.mark.parametrize("kind,v", KINDS)
def test_counts_equal_the_orders(kind: str, v: int) -> None:
    rng = np.random.default_rng(1)
    for p in (2, 4):
        m = 4 * p
        order, counts = schedule_order(kind, p, v, m), inflight_counts(kind, p, v, m)
        assert counts.stages == order.stages
        assert (counts.inflight_peak == order.inflight_peak).all()
        weights = rng.uniform(0, 1e9, size=(p, v))
        assert (counts.peak_inflight(weights) == order.peak_inflight(weights)).all()
