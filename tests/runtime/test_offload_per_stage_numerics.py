"""An offload per pipeline rank (``offload_stages``) trains like one process: each rank wraps
its stage under its own offload (FSDP2's ``CPUOffloadPolicy`` only on the
``optimizer+params`` ranks, the host optimizer on the ``optimizer`` ones),
pp=2 × dp=2 on gloo ranks, 3 SGD steps in fp32, losses and every parameter within a relative
1e-5 of the single-process model. The tiny GPT ties its embedding (pipeline rank 0) and head
(rank 1): on CPU both holders' gradients are host tensors and are summed as any other."""

from __future__ import annotations

import dataclasses

import pytest


def _plan(zero_stages, offload_stages, schedule):  # type: ignore[no-untyped-def]
    from rt_plans import make_plan

    plan = make_plan(pp=2, dp=2, schedule=schedule, num_microbatches=2, microbatch_size=1)
    config = plan.config.replace(zero_stage=max(zero_stages), zero_stages=zero_stages,
                                 offload_stages=offload_stages)
    return dataclasses.replace(plan, config=config)


@pytest.mark.parametrize("zero_stages, offload_stages, schedule", [
    ((3, 3), ("optimizer+params", "none"), "1f1b"),
    ((3, 1), ("none", "none"), "gpipe"),        # a control: the plain per-rank ZeRO path
    ((2, 3), ("optimizer", "none"), "1f1b"),    # offload=optimizer: the host optimizer
])
def test_offload_per_stage_matches_single_process(rank_pool, zero_stages, offload_stages,  # type: ignore[no-untyped-def]
                                                  schedule):
    plan = _plan(zero_stages, offload_stages, schedule)
    assert plan.config.rank_offloads == offload_stages
    report = rank_pool.run("rt_cases:train_matches_reference", plan_json=plan.to_json())[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]
    # offload runs as priced: no fallback line
    assert not [f for f in report["fallbacks"] if "offload" in f], report["fallbacks"]


def test_only_the_offloading_rank_wraps_with_cpu_offload(rank_pool):  # type: ignore[no-untyped-def]
    """offload_stages=optimizer+params/none at ZeRO-3 on pp=2 × dp=2: every FSDP2 group of
    pipeline rank 0 takes ``CPUOffloadPolicy``, none of rank 1's."""
    plan = _plan((3, 3), ("optimizer+params", "none"), "gpipe")
    reports = [r for r in rank_pool.run("rt_zero_cases:rank_wrappers",
                                        plan_json=plan.to_json()) if r is not None]
    assert {r["pp"] for r in reports} == {0, 1} and len(reports) == 4
    for r in reports:
        assert all(w.startswith("FSDP") for w in r["wrappers"]), r
        want = ["CPUOffloadPolicy"] if r["pp"] == 0 else ["OffloadPolicy"]
        assert r["offload_policies"] == want, r


@pytest.mark.parametrize("load", [
    # resume: the same plan, save → load → continue
    dict(zero=3, offload_stages=("optimizer+params", "none")),
    # an offload per rank → no offload on any rank
    dict(zero=3),
])
def test_checkpoint_of_an_offload_per_rank_plan_reshards(rank_pool, tmp_path, load):  # type: ignore[no-untyped-def]
    """2 momentum-SGD steps under ZeRO-3 with pipeline rank 0 offloading (its parameters and
    optimizer state on the host), save, load into a model built on meta, 1 more step: the same
    as 3 uninterrupted steps in one process, parameters and optimizer state alike."""
    common = dict(pp=2, dp=2, num_microbatches=2, schedule="gpipe")
    save = {**common, "zero": 3, "offload_stages": ("optimizer+params", "none")}
    report = rank_pool.run("rt_ckpt_cases:optimizer_state_reshards", save_plan=save,
                           load_plan={**common, **load}, path=str(tmp_path / "ckpt"))[0]
    assert not report["param_diffs"] and not report["optim_diffs"], report
    assert report["optim_keys"] > 0, report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
