"""The closed form that ranks candidates (:mod:`fxplan.inter_op.surrogate`) prices ZeRO-1 and
ZeRO-2 as the step simulator does: ZeRO-1 without tensor parallelism broadcasts every parameter
tensor from its owner after the step (``ZeroRedundancyOptimizer``), not one all-gather, and
ZeRO-2 with several microbatches reduce-scatters in every backward
(``ParallelConfig.reduces_every_microbatch``). Ranked with one all-gather and one reduction per
step, both looked cheaper than the simulator prices them and pushed better plans out of the
finalists."""

from __future__ import annotations

import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.step.estimate import estimate
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.surrogate import surrogate_step_s

MODEL, CLUSTER, BATCH = "gpt:layers=8,hidden=1024,heads=16,vocab=32000,seq=1024", \
    "dgx-a100-80g:nodes=4", 256


@pytest.fixture(scope="module")
def case():
    cluster = Cluster.load(CLUSTER)
    return capture_for_search(MODEL, dtype=training_dtype(cluster)), cluster


@pytest.mark.parametrize("text", [
    "dp=32,tp=1,pp=1,mb=2,m=4,schedule=1f1b,zero=1,recompute=none,sp=off,stages=8",
    "dp=32,tp=1,pp=1,mb=1,m=8,schedule=1f1b,zero=2,recompute=none,sp=off,stages=8",
    "dp=16,tp=1,pp=2,mb=1,m=16,schedule=1f1b,zero=2,recompute=none,sp=off,stages=4/4",
])
def test_surrogate_follows_the_simulator(case, text: str) -> None:
    graph, cluster = case
    config = ParallelConfig.parse(text)
    simulated = estimate(graph, cluster, config, batch=BATCH)
    ranked = surrogate_step_s(simulated.config, ModelProfile(graph, cluster).of(config), cluster)
    assert ranked == pytest.approx(simulated.step_time_s, rel=0.01)


def test_zero2_pays_a_reduction_per_microbatch(case) -> None:
    """More microbatches of the same global batch: ZeRO-2's exposed reduce-scatters grow with
    ``m`` in both prices, ZeRO-1's single reduction does not."""
    graph, cluster = case
    profile = ModelProfile(graph, cluster)

    def both(text: str) -> tuple[float, float]:
        config = ParallelConfig.parse(text)
        simulated = estimate(graph, cluster, config, batch=BATCH)
        return simulated.step_time_s, surrogate_step_s(simulated.config,
                                                       profile.of(config), cluster)

    z2_few = both("dp=32,tp=1,pp=1,mb=4,m=2,schedule=1f1b,zero=2,recompute=none,sp=off,stages=8")
    z2_many = both("dp=32,tp=1,pp=1,mb=1,m=8,schedule=1f1b,zero=2,recompute=none,sp=off,stages=8")
    z1_few = both("dp=32,tp=1,pp=1,mb=4,m=2,schedule=1f1b,zero=1,recompute=none,sp=off,stages=8")
    z1_many = both("dp=32,tp=1,pp=1,mb=1,m=8,schedule=1f1b,zero=1,recompute=none,sp=off,stages=8")
    for i in range(2):
        assert z2_many[i] - z1_many[i] > z2_few[i] - z1_few[i]
