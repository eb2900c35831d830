"""Regression tests for the inter-op search review: one memory model shared with the
estimate, truthful unfit reasons, constraint validation and failure messages, graphs with
1-D inputs, the intra-op fallback's narrow catch and strict placement parsing, the time
budget bounding the intra-op solves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn as nn

import fxplan.intra_op
from fxplan.cluster_specs import Cluster
from fxplan.cost_model import ParallelConfig, estimate
from fxplan.core.config import CostModelError
from fxplan.api import capture
from fxplan import search
from fxplan.core.errors import UserError
from fxplan.api import capture_for_search
from fxplan.inter_op import ConstraintError, InfeasibleError
from fxplan.inter_op import driver
from fxplan.inter_op.partition import balanced_counts
from fxplan.core.config import Schedule
from fxplan.core.placements import PlacementMap, Replicate, Shard
from fxplan.inter_op.placements import IntraOpCache, megatron_placements
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.progress import Budget
from fxplan.inter_op.stage_memory import DeviceMemory, stage_totals

SMALL = "gpt:layers=4,hidden=256,heads=8,vocab=4096,seq=256"
CLUSTER = "dgx-a100-80g:nodes=4"


def _config(tp: int, pp: int, dp: int, mb: int, m: int, schedule: str, recompute: str,
            sp: bool, zero: int) -> ParallelConfig:
    return ParallelConfig(dp=dp, tp=tp, pp=pp, microbatch_size=mb, num_microbatches=m,
                          schedule=Schedule.parse(schedule), recompute=recompute,
                          sequence_parallel=sp, zero_stage=zero)


@pytest.fixture(scope="module")
def gpt17():  # type: ignore[no-untyped-def]
    return capture_for_search("gpt-1.7b"), Cluster.load(CLUSTER)


# (tp, pp, dp, mb, m, schedule, recompute, sp, zero, uneven)
CONFIGS = [
    (1, 4, 8, 2, 32, "interleaved:2", "none", False, 0, False),   # the review's example
    (1, 4, 8, 2, 32, "interleaved:2", "none", False, 0, True),
    (1, 4, 8, 1, 8, "interleaved:4", "selective", False, 1, False),
    (1, 4, 8, 2, 32, "1f1b", "none", False, 0, True),
    (4, 4, 2, 1, 8, "gpipe", "selective", True, 3, False),
    (4, 2, 4, 4, 4, "interleaved:2", "full", True, 1, False),
    (2, 1, 16, 4, 8, "1f1b", "none", True, 3, False),
    (1, 2, 16, 2, 16, "1f1b", "full", False, 2, True),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"tp{c[0]}pp{c[1]}-{c[5]}-{c[6]}-z{c[8]}")
def test_search_memory_is_the_estimates(gpt17, cfg) -> None:  # type: ignore[no-untyped-def]
    """The search's per-rank memory is cost_model.estimate's peak memory, stage by stage."""
    graph, cluster = gpt17
    tp, pp, dp, mb, m, schedule, recompute, sp, zero, uneven = cfg
    prof = ModelProfile(graph, cluster)
    c = _config(tp, pp, dp, mb, m, schedule, recompute, sp, zero)
    counts = list(balanced_counts(prof.num_layers, pp * c.virtual_stages))
    if uneven:
        counts[0], counts[-1] = counts[0] - 1, counts[-1] + 1
    c = c.replace(stage_layers=tuple(counts))
    got = stage_totals(c, prof.get(tp, sp, recompute, mb), DeviceMemory.of(cluster.device(0)))
    est = estimate(graph, cluster, c, batch=dp * mb * m)
    want = [mem.total for mem in est.memory]
    assert list(got) == pytest.approx(want, rel=1e-6)


def test_unfit_reasons_do_not_say_none_fits_for_a_family_that_fits(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    plan = search(graph, cluster, batch=512, progress=False, constraints={"pp": 4})
    chosen = f"tp={plan.tp}, pp={plan.pp}, dp={plan.dp}:"
    mine = [r for r in plan.pruned if r.startswith(chosen) and "variants" in r]
    assert mine and all("none of" not in r and "did not fit" in r for r in mine)


def test_unfit_reasons_say_none_fits_only_without_a_fit() -> None:
    graph = capture_for_search(SMALL)
    state = driver._Search(graph, Cluster.load("dgx-a100-80g"), 64, {}, 8, driver.PhaseTimer(),
                           Budget(None), False)
    fams = list(state.families())[:2]
    lightest = state.lightest(fams[0])[1]
    state.unfit = {fams[0]: (3, lightest, "a"), fams[1]: (5, lightest, "b")}
    state.fitted = {fams[0]}
    state.unfit_reasons()
    assert any(r.startswith(f"{fams[0]}: 3 ") and "did not fit" in r for r in state.pruned)
    assert any(r.startswith(f"{fams[1]}: none of 5 ") for r in state.pruned)


@pytest.mark.parametrize("constraints, match", [
    ({"tp": 3}, r"tp=3 is not allowed; tp takes 1, 2, 4, 8"),
    ({"zero_stage": 5}, r"zero_stage=5 is not allowed; zero_stage takes 0, 1, 2, 3"),
    ({"zero_stage": (1, 5)}, r"zero_stage=5 is not allowed"),
    ({"schedule": "interleaved:3"}, r"schedule takes 1f1b, gpipe, interleaved:2"),
    ({"recompute": "some"}, r"recompute takes none, selective, full"),
    ({"sequence_parallel": 1}, r"sequence_parallel takes True, False"),
    ({"microbatch_size": 0}, r"microbatch_size takes positive integers"),
    ({"tensor": 2}, r"unknown constraints \['tensor'\]; allowed keys: tp, pp, dp"),
])
def test_invalid_constraints_are_user_errors(gpt17, constraints, match) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    with pytest.raises(ConstraintError, match=match) as info:
        search(graph, cluster, batch=512, progress=False, constraints=constraints)
    assert isinstance(info.value, UserError) and "more devices" not in str(info.value)


def test_constraints_that_exclude_every_candidate_say_so(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = gpt17
    with pytest.raises(ConstraintError, match="exclude every candidate"):
        search(graph, cluster, batch=512, progress=False, constraints={"microbatch_size": 32})


def test_infeasible_under_constraints_says_relax_them(gpt17) -> None:  # type: ignore[no-untyped-def]
    graph, _ = gpt17
    with pytest.raises(InfeasibleError) as info:
        search(graph, "dgx-a100-80g", batch=128, progress=False,
               constraints={"zero_stage": 0, "pp": 1, "tp": 1, "recompute": "none",
                            "microbatch_size": 16})
    text = str(info.value)
    assert "allowed by the constraints" in text and "Relax the constraints" in text
    assert "zero=0" in text and "more devices: about" not in text


def test_failed_finalists_are_quoted(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    def refuse(graph, cluster, c, batch, cache):  # type: ignore[no-untyped-def]
        raise CostModelError("refused for the test")

    monkeypatch.setattr(driver, "price_finalist", refuse)
    with pytest.raises(InfeasibleError, match="every finalist failed.*refused for the test"):
        search(capture_for_search(SMALL), "dgx-a100-80g", batch=8, progress=False)


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(4))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x).sum()


def test_graph_with_a_1d_input_plans() -> None:
    graph = capture(_Mlp(), inputs=(torch.randn(8),))
    plan = search(graph, "dgx-a100-80g", batch=8, progress=False, seq=123)  # no seq dim: ignored
    assert plan.estimate["fits"]


def test_graph_without_layers_quotes_the_arithmetic() -> None:
    graph = capture(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)),
                    inputs=(torch.randn(8),))
    with pytest.raises(InfeasibleError, match=r"more stages than layers \(1 > 0\)"):
        search(graph, "dgx-a100-80g", batch=8, progress=False)


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


def test_docs_name_errors_that_exist() -> None:
    text = (Path(__file__).parents[2] / "docs" / "planner.md").read_text()
    assert "fxplan.search.InfeasibleError" not in text
    assert "fxplan.inter_op.InfeasibleError" in text and "fxplan.inter_op.ConstraintError" in text
