"""With ``pp > 1`` (GPipe, 1F1B) the dp gradient reduction runs inside the last microbatch's
backward of each stage, block by block (:class:`fxplan.runtime.train.pipeline.ReduceInLastBackward`
for FSDP2; DDP's reducer, armed by torch for the last backward) — under ZeRO-2/3 inside every
microbatch's backward —, not in a pass after the schedule (pooled gloo ranks, pp=2 × dp=2; the values are test_numerics.py's ``pp_dp*`` cases)."""

from __future__ import annotations

import pytest

CASES = {
    "zero3_gpipe": (dict(pp=2, dp=2, zero=3, num_microbatches=2, schedule="gpipe"), "fsdp"),
    "zero2_1f1b": (dict(pp=2, dp=2, zero=2, num_microbatches=2, microbatch_size=1), "fsdp"),
    "ddp_1f1b": (dict(pp=2, dp=2, zero=0, num_microbatches=2), "ddp"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pipelined_step_reduces_in_backward(rank_pool, name):
    plan_kwargs, kind = CASES[name]
    for report in rank_pool.run("rt_step_cases:step_gradient_syncs", plan_kwargs=plan_kwargs):
        assert not report["plain_loop"], report
        per_step = report["per_step"]
        assert per_step[0] > 0 and len(set(per_step)) == 1, report
        assert report["in_backward"] == per_step, report  # none left for a pass after it
        if kind == "fsdp":  # one reduce-scatter per FSDP group (the stage's block + its
            # root) per step, per microbatch under ZeRO-2/3
            reductions = plan_kwargs["num_microbatches"] if plan_kwargs["zero"] >= 2 else 1
            assert report["fsdp_groups"] == 2, report
            assert per_step[0] == 2 * reductions, report
        else:  # every DDP bucket reduced once, not once per microbatch
            assert report["repeated_buckets"] == [0, 0], report
