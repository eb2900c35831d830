"""An offload per pipeline rank (``offload_stages``) as the estimate prices it: each rank's
times, offload row and memory are those of the plan-wide configuration with its own ZeRO stage
and offload, a node's host memory sums the host bytes of the ranks on it, and a list of equal
entries is the plain plan to 1e-12 (:mod:`fxplan.cost_model.step.stage_costs`, "Offload per
pipeline rank")."""

from __future__ import annotations

import pytest

from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate
from tests.cost_model.test_zero_per_stage import _close, _config, _same_rank, tiny  # noqa: F401


def _offload_row(result, s: int) -> float:  # type: ignore[no-untyped-def]
    row = result.stage_plan.costs.offload
    return 0.0 if row is None else float(row[s])


@pytest.mark.parametrize("zero_stages, offloads", [
    ((3, 3), ("optimizer+params", "none")),
    ((3, 3), ("none", "optimizer+params")),
    ((2, 3), ("optimizer", "none")),
    ((3, 2), ("optimizer+params", "optimizer")),
])
def test_each_rank_is_priced_under_its_own_offload(tiny, zero_stages, offloads) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = tiny
    mixed = estimate(graph, cluster, _config("1f1b", zero_stages=zero_stages,
                                             offload_stages=offloads), batch=32)
    assert mixed.config.rank_offloads == offloads
    for s, (zero, off) in enumerate(zip(zero_stages, offloads)):
        own = estimate(graph, cluster, _config("1f1b", zero_stage=zero, offload=off), batch=32)
        _same_rank(mixed, own, s)
        assert _close(_offload_row(mixed, s), _offload_row(own, s))
        assert _close(mixed.memory[s].host, own.memory[s].host)
        assert (mixed.memory[s].host > 0) == (off != "none")
    assert any(_offload_row(mixed, s) > 0 for s in range(2))


def test_host_memory_sums_the_ranks_on_each_node(tiny) -> None:  # type: ignore[no-untyped-def]
    """pp=2 × dp=4 on one DGX A100: the node holds the four ranks of each stage; only stage
    0 offloads, so the node keeps 4 × its host bytes, whichever stage's row is read."""
    graph, cluster = tiny
    mixed = estimate(graph, cluster, _config("1f1b", zero_stage=3,
                                             offload_stages=("optimizer+params", "none")),
                     batch=32)
    host = mixed.memory[0].host
    assert host > 0 and mixed.memory[1].host == 0
    for m in mixed.memory:
        assert m.host_node_total == pytest.approx(4 * host, rel=1e-12)
    every = estimate(graph, cluster, _config("1f1b", zero_stage=3, offload="optimizer+params"),
                     batch=32)
    assert every.memory[0].host_node_total > mixed.memory[0].host_node_total


@pytest.mark.parametrize("off", ["none", "optimizer", "optimizer+params"])
def test_equal_entries_reproduce_the_plain_prices(tiny, off: str) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = tiny
    listed = estimate(graph, cluster, _config("1f1b", zero_stage=3, offload_stages=(off, off)),
                      batch=32)
    plain = estimate(graph, cluster, _config("1f1b", zero_stage=3, offload=off), batch=32)
    assert listed.config.offload_stages is None
    assert abs(listed.step_time_s - plain.step_time_s) <= 1e-12 * plain.step_time_s
    assert _close([m.total for m in listed.memory], [m.total for m in plain.memory])
    assert _close([m.host for m in listed.memory], [m.host for m in plain.memory])


def test_offload_per_rank_round_trips_and_names_each_ranks_overlaps(tiny) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = tiny
    c = _config("1f1b", zero_stages=(3, 1), offload_stages=("optimizer+params", "none"))
    assert ParallelConfig.parse(c.to_string()) == c
    names = [o.name for o in estimate(graph, cluster, c, batch=32).overlaps]
    assert "zero3_prefetch" in names and "dp_grad_reduce" in names
