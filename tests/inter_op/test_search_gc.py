"""The search keeps Python's cyclic collector off the objects alive before it (``gc.freeze``
while it runs, a higher youngest-generation threshold) and leaves the collector as it found
it."""

from __future__ import annotations

import gc

import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster
from fxplan.inter_op import driver, search

TINY = "gpt:layers=2,hidden=128,heads=4,vocab=512,seq=128"


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return capture_for_search(TINY)


def test_frozen_while_it_runs_and_unfrozen_after(tiny, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[int] = []
    run = driver.run_search

    def recording(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.get_freeze_count())
        seen.append(gc.get_threshold()[0])
        return run(*args, **kwargs)

    monkeypatch.setattr(driver, "run_search", recording)
    assert gc.get_freeze_count() == 0
    search(tiny, Cluster.load("dgx-a100-80g:nodes=1"), batch=8, progress=False)
    assert seen[0] > 0 and seen[1] >= 5000
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_left_alone(tiny) -> None:  # type: ignore[no-untyped-def]
    gc.freeze()
    try:
        search(tiny, Cluster.load("dgx-a100-80g:nodes=1"), batch=8, progress=False)
        assert gc.get_freeze_count() > 0   # still frozen (less what the search freed)
    finally:
        gc.unfreeze()


def test_thresholds_restored(tiny) -> None:  # type: ignore[no-untyped-def]
    before = gc.get_threshold()
    search(tiny, Cluster.load("dgx-a100-80g:nodes=1"), batch=8, progress=False)
    assert gc.get_threshold() == before
