"""``pg_overlap``: the distributed optimizer's parameter all-gather hidden behind the next
step's forward (Megatron-Core ``--overlap-param-gather``) costs only what exceeds the stage's
forward of one microbatch, ``max(0, t_gather − t_forward)``."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model import CostModelError, ParallelConfig, estimate
from fxplan.cost_model.step.after_backward import hidden_gather

def test_config_text_round_trips_and_needs_a_sharded_optimizer() -> None:
    config = ParallelConfig.parse("dp=4,tp=2,mb=1,zero=1,sp=on,pg_overlap=on")
    assert config.param_gather_overlap
    assert "pg_overlap=on" in config.to_string()
    assert ParallelConfig.parse(config.to_string()) == config
    assert "pg_overlap" not in ParallelConfig.parse("dp=4,zero=1").to_string()
    assert ParallelConfig.parse("dp=4,zero=2,param_gather_overlap=on").param_gather_overlap
    for text in ("dp=4,zero=0,pg_overlap=on", "dp=4,zero=3,pg_overlap=on",
                 "dp=1,tp=4,zero=1,pg_overlap=on"):
        with pytest.raises(CostModelError, match=r"pg_overlap=on needs zero=1 or 2 and dp > 1"):
            ParallelConfig.parse(text)


def test_only_the_gather_beyond_the_forward_is_charged() -> None:
    on = ParallelConfig.parse("dp=4,zero=1,pg_overlap=on")
    off = ParallelConfig.parse("dp=4,zero=1")
    assert hidden_gather(0.3, 0.1, on) == pytest.approx(0.2)
    assert hidden_gather(0.05, 0.1, on) == 0.0
    assert hidden_gather(0.3, 0.1, off) == 0.3


@pytest.mark.parametrize("config", ["dp=8,tp=1,mb=1,zero=1", "dp=4,tp=2,mb=1,zero=1,sp=on",
                                    "dp=8,tp=1,mb=1,zero=2"])
def test_overlap_takes_the_gather_off_the_step(gpt_512, config) -> None:  # type: ignore[no-untyped-def]
    """The step falls by what ``post`` loses, at most the forward of one microbatch per
    stage; compute and the gradient reduction are unchanged."""
    cluster = Cluster.load("dgx-a100-80g")
    base = ParallelConfig.parse(config)
    off = estimate(gpt_512, cluster, base, batch=8)
    on = estimate(gpt_512, cluster, base.replace(param_gather_overlap=True), batch=8)
    post_off = float(off.stage_plan.costs.post.sum())
    post_on = float(on.stage_plan.costs.post.sum())
    forward = float(on.stage_plan.costs.forward.sum())
    assert 0 <= post_on < post_off
    assert post_off - post_on <= forward * (1 + 1e-9)
    assert on.step_time_s < off.step_time_s
    assert on.breakdown["compute"] == pytest.approx(off.breakdown["compute"])
    assert on.breakdown["dp_comm"] <= off.breakdown["dp_comm"]
