"""Intra-op answers shared between the searches of one graph on sizes of one cluster kind
(``inter_op.placements.shared_solves``, what ``fxplan compare`` runs its sweep in): the plans
are those of searches alone, each tp degree is solved once per kind, and nothing is shared
under a time budget."""

from __future__ import annotations

import pytest

import fxplan.intra_op
from fxplan.api import capture_for_search
from fxplan.inter_op import search
from fxplan.inter_op.placements import shared_solves

SMALL = "gpt:layers=4,hidden=256,heads=8,vocab=4096,seq=256"
SIZES = ("dgx-a100-80g:nodes=1", "dgx-a100-80g:nodes=2")


@pytest.fixture
def solves(monkeypatch):  # type: ignore[no-untyped-def]
    """The tp degrees the intra-op solver is called for, in order."""
    calls: list[int] = []
    solve = fxplan.intra_op.solve_intra_op

    def counted(graph, mesh, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(mesh.shape[-1])
        return solve(graph, mesh, **kwargs)

    monkeypatch.setattr(fxplan.intra_op, "solve_intra_op", counted)
    return calls


def _plans(graph, **options):  # type: ignore[no-untyped-def]
    return [search(graph, spec, batch=64, progress=False, **options) for spec in SIZES]


def test_shared_answers_give_the_plans_of_searches_alone(solves) -> None:  # type: ignore[no-untyped-def]
    graph = capture_for_search(SMALL)
    alone = _plans(graph)
    alone_solves = list(solves)
    solves.clear()
    with shared_solves():
        shared = _plans(graph)
    for a, b in zip(alone, shared):
        assert a.summary == b.summary
        assert a.estimate["step_time_s"] == b.estimate["step_time_s"]
        assert a.placements == b.placements
    # each tp degree solved once for the kind, not once per size
    assert sorted(solves) == sorted(set(alone_solves))
    assert len(solves) < len(alone_solves)


def test_nothing_is_shared_under_a_time_budget(solves) -> None:  # type: ignore[no-untyped-def]
    graph = capture_for_search(SMALL)
    alone = _plans(graph, time_budget_s=600)
    count = len(solves)
    solves.clear()
    with shared_solves():
        _plans(graph, time_budget_s=600)
    assert len(solves) == count and alone
