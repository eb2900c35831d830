"""The closed form's drain slack (:func:`fxplan.inter_op.surrogate.drain_slack`) against the
step simulator: ``δ_s`` is how long before the first pipeline rank rank ``s`` runs its last op.
In 1F1B with every rank idle in the drain it is exact; where a rank is still busy when the
last gradient reaches it (GPipe, a heavy first rank; the interleaved chunks) the simulator's
gap is larger and ``δ_s`` a lower bound; under a split backward the weight-gradient work
fills the drain and ``δ_s = 0``. So a rank's once-per-step work is never credited with
slack the simulator does not give it."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config import ParallelConfig
from fxplan.core.schedule import Schedule
from fxplan.cost_model import estimate
from fxplan.inter_op.profile import ModelProfile
from fxplan.inter_op.surrogate import RungTerms, drain_slack

MODEL = "llama:layers=8,hidden=1024,heads=16,vocab=32000,seq=2048"

#: (schedule, pp, dp, tp, ZeRO stage, split; exact?)
CASES = {
    "1f1b": ("1f1b", 4, 4, 1, 1, (1, 2, 3, 2), True),
    "1f1b-tp": ("1f1b", 4, 2, 2, 0, (2, 1, 3, 2), True),
    "gpipe": ("gpipe", 4, 2, 2, 0, (3, 1, 2, 2), False),
    "interleaved": ("interleaved:2", 4, 4, 1, 1, (1,) * 8, False),
    "zb": ("zb", 4, 4, 1, 0, (2, 2, 2, 2), False),
}


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    cluster = Cluster.load("dgx-a100-80g:nodes=2")
    graph = capture_for_search(MODEL, dtype=training_dtype(cluster))
    return graph, cluster, ModelProfile(graph, cluster)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_slack_is_the_simulators_drain_or_less(model, case: str) -> None:  # type: ignore[no-untyped-def]
    graph, cluster, profile = model
    schedule, pp, dp, tp, zero, split, exact = CASES[case]
    c = ParallelConfig(pp=pp, dp=dp, tp=tp, zero_stage=zero, stage_layers=split,
                       schedule=Schedule.parse(schedule), microbatch_size=1, num_microbatches=8)
    end = estimate(graph, cluster, c, batch=dp * 8).simulation.timeline.stage_end
    gaps = end[0] - end
    slack = drain_slack(c, RungTerms(c, profile.of(c), cluster).drain())
    assert slack[0] == 0.0 and (np.diff(slack) >= 0).all()
    if exact:
        np.testing.assert_allclose(slack, gaps, rtol=1e-9, atol=1e-12)
    else:
        assert (slack <= gaps + 1e-12).all(), (slack, gaps)
    if schedule == "zb":
        assert not slack.any()
    else:
        assert slack[-1] > 0.0
