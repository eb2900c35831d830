"""The intra-op placements of a candidate (``inter_op.placements``): solver bugs raise,
infeasible solves fall back with their reason, the Megatron fallback's placement strings and
their strict parsing, and the time budget bounding the intra-op solves."""

from __future__ import annotations

import pytest

import fxplan.intra_op
from fxplan import search
from fxplan.cluster_specs import Cluster
from fxplan.api import capture_for_search
from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.core.placements import PlacementMap, Replicate, Shard
from fxplan.inter_op.placements import IntraOpCache, megatron_placements
from fxplan.inter_op.progress import Budget

SMALL = "gpt:layers=4,hidden=256,heads=8,vocab=4096,seq=256"


def _config(tp: int, pp: int, dp: int, mb: int, m: int, schedule: str, recompute: str,
            sp: bool, zero: int) -> ParallelConfig:
    return ParallelConfig(dp=dp, tp=tp, pp=pp, microbatch_size=mb, num_microbatches=m,
                          schedule=Schedule.parse(schedule), recompute=recompute,
                          sequence_parallel=sp, zero_stage=zero)


def test_solver_bugs_raise_instead_of_falling_back(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    graph = capture_for_search(SMALL)

    def bug(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise TypeError("a bug in a sharding rule")

    monkeypatch.setattr(fxplan.intra_op, "solve_intra_op", bug)
    with pytest.raises(TypeError, match="a bug"):
        IntraOpCache(graph, Cluster.load("dgx-a100-80g")).solve(2)


def test_infeasible_solve_falls_back_with_its_reason(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    graph = capture_for_search(SMALL)

    def infeasible(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise fxplan.intra_op.IntraOpInfeasible("nothing fits")

    monkeypatch.setattr(fxplan.intra_op, "solve_intra_op", infeasible)
    cache = IntraOpCache(graph, Cluster.load("dgx-a100-80g"))
    c = _config(2, 1, 4, 1, 2, "1f1b", "none", False, 0)
    placed = cache.placements(c)
    assert not placed.priced and any("nothing fits" in f for f in placed.fallbacks)


def test_megatron_fallback_writes_r_for_dp_1_and_parsing_is_strict() -> None:
    graph = capture_for_search(SMALL)
    alone = megatron_placements(graph, _config(2, 1, 1, 1, 8, "1f1b", "none", False, 0)).placements
    assert alone.nodes and all(p[0] == Replicate() for p in alone.nodes.values())
    shared = megatron_placements(graph, _config(2, 1, 4, 1, 2, "1f1b", "none", False, 0)).placements
    assert all(p[0] == Shard(0) for p in shared.nodes.values())
    assert PlacementMap.from_json({"nodes": {"x": "S(0)S(2)"}}).nodes["x"] == (Shard(0), Shard(2))
    with pytest.raises(ValueError, match="bad placement string"):
        PlacementMap.from_json({"nodes": {"x": "S(0)X"}})


def test_time_budget_bounds_the_intra_op_solves() -> None:
    graph = capture_for_search(SMALL)
    cluster = Cluster.load("dgx-a100-80g")
    assert IntraOpCache(graph, cluster, Budget(5.0)).time_limit_s() <= 5.0
    spent = IntraOpCache(graph, cluster, Budget(0.0))
    assert "time budget" in spent.solve(2)
    plan = search(graph, "dgx-a100-80g:nodes=2", batch=64, progress=False, time_budget_s=0.0)
    assert plan.estimate["fits"]
    assert any("intra-op solver not used (time budget" in f for f in plan.fallbacks)
