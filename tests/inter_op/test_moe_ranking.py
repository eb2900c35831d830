"""The free search of a mixture of experts is never beaten by a search held to one ZeRO stage:
the closed form that ranks candidates (:mod:`fxplan.inter_op.surrogate`) prices the experts'
gradient sync over their expert-data-parallel group and ZeRO-3's gathers prefetched behind
the layer before (a dense layer before a heavy expert layer leaves its gather exposed), as the
step simulator does; it used to hide each gather behind its own layer and sync the experts
over every dp rank, and so ranked ZeRO-3 first where the simulator prices it slowest."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.step.estimate import estimate
from fxplan.inter_op import search
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.surrogate import surrogate_step_s

#: Alpa's GShard MoE 27B cut to four layers (two dense, two of 48 experts), on 64 H100s.
MODEL, CLUSTER, BATCH = "moe-27b:layers=4", "dgx-h100:nodes=8", 512


@pytest.fixture(scope="module")
def case():
    cluster = Cluster.load(CLUSTER)
    return capture_for_search(MODEL, dtype=training_dtype(cluster)), cluster


def test_free_search_is_at_least_as_fast_as_any_zero_stage(case):
    graph, cluster = case
    free = search(graph, cluster, batch=BATCH, progress=False)
    for zero in (0, 1, 2, 3):
        held = search(graph, cluster, batch=BATCH, progress=False,
                      constraints={"zero_stage": zero})
        assert free.estimate["step_time_s"] <= held.estimate["step_time_s"] * (1 + 1e-9), \
            (zero, free.summary, held.summary)


@pytest.mark.parametrize("zero", [1, 3])
def test_surrogate_follows_the_simulator_on_expert_layers(case, zero):
    """``T̂`` within 1 % of the simulated step for the expert-parallel configuration the
    search chooses between (its sync, gathers and optimizer share are the simulator's)."""
    graph, cluster = case
    config = ParallelConfig.parse(f"dp=64,tp=1,pp=1,mb=8,m=1,schedule=1f1b,zero={zero},"
                                  "recompute=none,sp=off,stages=4,ep=16")
    profile = ModelProfile(graph, cluster).of(config)
    assert profile.expert_params is not None and np.any(profile.expert_params > 0)
    simulated = estimate(graph, cluster, config, batch=BATCH).step_time_s
    assert surrogate_step_s(config, profile, cluster) == pytest.approx(simulated, rel=0.01)
