"""A ZeRO stage per pipeline rank (``zero_stages``) as the estimate prices it: each rank's
times and memory are those of the plan-wide configuration with its own stage (nothing of one
rank reads another's), and a list of equal entries is the plain plan to 1e-12
(:mod:`fxplan.cost_model.step.stage_costs`, "ZeRO per pipeline rank")."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.api import capture
from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.cost_model import estimate
from fxplan.cost_model.memory.breakdown import ADAM_FP32

CLUSTER = "dgx-a100-80g:nodes=1"


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    """A 4-layer GPT of hidden 256 at sequence 128 on one DGX A100 (8 GPUs)."""
    return (capture("gpt:layers=4,hidden=256,heads=4,vocab=1024,seq=128", batch=1),
            Cluster.load(CLUSTER))


def _config(schedule: str, **zero) -> ParallelConfig:  # type: ignore[no-untyped-def]
    return ParallelConfig(dp=4, pp=2, microbatch_size=2, num_microbatches=4,
                          schedule=Schedule.parse(schedule), **zero)


def _close(a, b) -> bool:  # type: ignore[no-untyped-def]
    return bool(np.allclose(np.asarray(a, float), np.asarray(b, float), rtol=1e-12, atol=0.0))


def _same_rank(mixed, own, s: int, tied_gather: float = 0.0) -> None:  # type: ignore[no-untyped-def]
    a, b = mixed.stage_plan.costs, own.stage_plan.costs
    assert _close(a.forward[:, s], b.forward[:, s])
    assert _close(a.backward[:, s], b.backward[:, s])
    assert _close(a.post[s], b.post[s] + tied_gather)
    assert _close(a.optimizer[s], b.optimizer[s])
    assert a.grad_buckets[s] == b.grad_buckets[s]
    assert a.blocks(s) == b.blocks(s)
    assert _close(mixed.memory[s].total, own.memory[s].total)
    assert _close(mixed.memory[s].optimizer, own.memory[s].optimizer)


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved:2"])
@pytest.mark.parametrize("stages", [(3, 2), (2, 3), (1, 0), (0, 1)])
def test_each_rank_is_priced_under_its_own_stage(tiny, schedule: str,  # type: ignore[no-untyped-def]
                                                 stages: tuple[int, int]) -> None:
    """Ranks whose stages keep gradients alike (FSDP2's shards under ZeRO-2/3, DDP's whole
    gradients under ZeRO-0/1 with tp = 1): every number of rank ``s`` is that of the plain
    plan at its own stage."""
    graph, cluster = tiny
    mixed = estimate(graph, cluster, _config(schedule, zero_stages=stages), batch=32)
    for s, zero in enumerate(stages):
        _same_rank(mixed, estimate(graph, cluster, _config(schedule, zero_stage=zero), batch=32),
                   s)
    assert mixed.memory[0].total != mixed.memory[1].total


@pytest.mark.parametrize("stages", [(3, 1), (0, 2)])
def test_a_tied_weight_between_layouts_adds_the_sharded_holders_gather(  # type: ignore[no-untyped-def]
        tiny, stages: tuple[int, int]) -> None:
    """The tied embedding and head on ranks that keep its gradient sharded (ZeRO-2/3) and
    whole (ZeRO-0/1): the sharded holder all-gathers it over dp before the sum, the one term
    by which its rank differs from the plain plan at its stage."""
    from fxplan.cost_model.comm.collectives import collective_time_s
    from fxplan.cost_model.step.stage_plan import stage_ranks

    graph, cluster = tiny
    mixed = estimate(graph, cluster, _config("1f1b", zero_stages=stages), batch=32)
    params = mixed.stage_plan.params
    (tied,) = [n for n in params[0] if ":" not in n and n in params[1]]
    sharded = 0 if stages[0] >= 2 else 1
    nbytes = ADAM_FP32.grad_bytes * params[sharded][tied]   # the capture trains in fp32
    gather = collective_time_s("all_gather", nbytes, stage_ranks(mixed.config, sharded)[1],
                               cluster)
    assert gather > 0
    for s, zero in enumerate(stages):
        own = estimate(graph, cluster, _config("1f1b", zero_stage=zero), batch=32)
        _same_rank(mixed, own, s, gather if s == sharded else 0.0)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_equal_entries_reproduce_the_plain_prices(tiny, zero: int) -> None:  # type: ignore[no-untyped-def]
    graph, cluster = tiny
    listed = estimate(graph, cluster, _config("1f1b", zero_stages=(zero, zero)), batch=32)
    plain = estimate(graph, cluster, _config("1f1b", zero_stage=zero), batch=32)
    assert abs(listed.step_time_s - plain.step_time_s) <= 1e-12 * plain.step_time_s
    assert _close([m.total for m in listed.memory], [m.total for m in plain.memory])


def test_mixed_plan_names_each_ranks_overlaps(tiny) -> None:  # type: ignore[no-untyped-def]
    """ZeRO-3 on rank 0 and ZeRO-1 on rank 1: the estimate relies on the prefetch of the
    first and the bucketed reduction of the second."""
    graph, cluster = tiny
    mixed = estimate(graph, cluster, _config("1f1b", zero_stages=(3, 1)), batch=32)
    names = [o.name for o in mixed.overlaps]
    assert "zero3_prefetch" in names and "dp_grad_reduce" in names
