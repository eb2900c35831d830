"""The pipeline lower bound ``(m + (p−1)/v)·W/pp`` (:func:`fxplan.inter_op.bounds.
pipeline_lower_bound`): never above the closed form ``T̂`` of a candidate the search prices,
and skipping by it changes no answer of the search."""

from __future__ import annotations

import json

import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster
from fxplan.inter_op import ranking, search, search_state
from fxplan.inter_op.bounds import pipeline_lower_bound
from fxplan.inter_op.reasons import TIME_BOUND

SMALL = "gpt:layers=12,hidden=1024,heads=16,vocab=8192,seq=1024"


@pytest.fixture(scope="module")
def small():  # type: ignore[no-untyped-def]
    return capture_for_search(SMALL)


def _answer(plan) -> dict:  # type: ignore[no-untyped-def]
    out = json.loads(plan.to_json())
    for key in ("search_time_s", "timings", "pruned", "pruned_detail", "solver"):
        out.pop(key)
    out["estimate"].pop("candidates_visited")
    return out


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_the_bound_is_below_every_priced_closed_form(small, monkeypatch, pp) -> None:  # type: ignore[no-untyped-def]
    priced: list[tuple[float, float]] = []
    closed_form = search_state.surrogate_step_s

    def recording(c, prof, cluster, profs=None):  # type: ignore[no-untyped-def]
        t = closed_form(c, prof, cluster, profs)
        priced.append((t, pipeline_lower_bound(c, prof)))
        return t

    monkeypatch.setattr(search_state, "surrogate_step_s", recording)
    search(small, Cluster.load("dgx-a100-80g:nodes=4"), batch=256, progress=False,
           constraints={"pp": pp})
    assert len(priced) > 10
    assert all(t >= bound for t, bound in priced), max(b / t for t, b in priced)
    if pp > 1:   # the bubble term is in the bound: tight for some candidate
        assert max(b / t for t, b in priced) > 0.9


def test_skipping_by_the_bound_changes_no_answer(small, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-a100-80g:nodes=8")
    with_bound = search(small, cluster, batch=512, progress=False)
    skipped = [d for r, d in zip(with_bound.pruned, with_bound.pruned_detail)
               if "pipeline lower bound" in r]
    assert skipped and all(d["kind"] == TIME_BOUND for d in skipped)
    monkeypatch.setattr(ranking, "pipeline_lower_bound", lambda c, prof: 0.0)
    without = search(small, cluster, batch=512, progress=False)
    assert not [r for r in without.pruned if "pipeline lower bound" in r]
    assert without.estimate["candidates_visited"] > with_bound.estimate["candidates_visited"]
    assert _answer(with_bound) == _answer(without)
