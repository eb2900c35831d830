"""A ``pp = 1`` step is a plain gradient-accumulation loop (:mod:`fxplan.runtime.train.accumulate`):
no pipeline schedule, and the dp gradient reduction runs once per step, inside the last
microbatch's backward — under ZeRO-2/3 inside every microbatch's backward, so that no unsharded
gradient is kept between microbatches (pooled gloo ranks; the values are test_numerics.py's
business)."""

from __future__ import annotations

import pytest

CASES = {
    "zero3": (dict(dp=2, zero=3, num_microbatches=2), "fsdp"),
    "zero2": (dict(dp=2, zero=2, num_microbatches=3, microbatch_size=1), "fsdp"),
    "ddp": (dict(dp=2, zero=0, num_microbatches=2), "ddp"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pp1_step_reduces_in_backward(rank_pool, name):
    plan_kwargs, kind = CASES[name]
    report = rank_pool.run("rt_step_cases:step_gradient_syncs", plan_kwargs=plan_kwargs)[0]
    assert report["plain_loop"], report
    per_step = report["per_step"]
    assert per_step[0] > 0 and len(set(per_step)) == 1, report
    assert report["in_backward"] == per_step, report  # overlapped with the backward
    if kind == "fsdp":  # one reduce-scatter per FSDP group (2 blocks + the stage root) per
        # step, per microbatch under ZeRO-2/3
        reductions = plan_kwargs["num_microbatches"] if plan_kwargs["zero"] >= 2 else 1
        assert report["fsdp_groups"] == 3, report
        assert per_step[0] == 3 * reductions, report
    else:  # every DDP bucket reduced once, not once per microbatch
        assert report["repeated_buckets"] == [0, 0], report
