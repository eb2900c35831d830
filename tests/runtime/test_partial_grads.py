"""The trainer's Partial-gradient reduction: under tp=2 with sequence parallelism the layer
norms' and the position embedding's gradients come out ``Partial(sum)``; after
:func:`fxplan.runtime.apply.partial_grads.reduce_partial_grads` none is, each equals DTensor's own
``Partial → Replicate`` redistribution (the same sum over the same 2 ranks, so ≤ 1 ulp-level
rounding), and the whole set took one flattened all-reduce."""

from __future__ import annotations


def test_partial_gradients_are_reduced_once_in_one_all_reduce(rank_pool):
    report = rank_pool.run("rt_partial_cases:partial_grads_reduced_once")[0]
    assert len(report["partial"]) >= 5, report            # ln weights/biases (+ wpe) under sp
    assert any("ln" in fqn or "norm" in fqn for fqn in report["partial"]), report
    assert report["still_partial"] == [], report
    assert report["placements_match"], report
    assert report["collectives"] == 1, report             # one mesh group, one dtype
    assert report["again"] == 0, report                   # nothing left to reduce
    assert report["scale"] > 0
    assert report["error"] <= 1e-6 * report["scale"], report
