"""A ZeRO stage per pipeline rank (``zero_stages``) trains like one process: each rank wraps
its stage and builds its optimizer under its own stage (pp=2 × dp=2 on gloo ranks, 3 SGD steps
in fp32, losses and every parameter within a relative 1e-5 of the single-process model)."""

from __future__ import annotations

import dataclasses

import pytest


@pytest.mark.parametrize("zero_stages, schedule", [((3, 1), "gpipe"), ((2, 1), "1f1b"),
                                                   ((0, 3), "1f1b")])
def test_zero_per_stage_matches_single_process(rank_pool, zero_stages, schedule):  # type: ignore[no-untyped-def]
    from rt_plans import make_plan

    plan = make_plan(pp=2, dp=2, schedule=schedule, num_microbatches=2, microbatch_size=1)
    plan = dataclasses.replace(plan, config=plan.config.replace(
        zero_stage=max(zero_stages), zero_stages=zero_stages))
    assert plan.config.zero_stages == zero_stages
    report = rank_pool.run("rt_cases:train_matches_reference", plan_json=plan.to_json())[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]


@pytest.mark.parametrize("save, load", [
    # resume: the same mixed plan, save → load → continue
    (dict(zero_stages=(3, 1)), dict(zero_stages=(3, 1))),
    # a ZeRO stage per rank → one stage for every rank
    (dict(zero_stages=(3, 1)), dict(zero=2)),
])
def test_checkpoint_of_a_mixed_plan_reshards(rank_pool, tmp_path, save, load):  # type: ignore[no-untyped-def]
    """2 momentum-SGD steps under a plan whose pipeline ranks run ZeRO-3 and ZeRO-1, save, load
    (into a model built on meta), 1 more step: the same as 3 uninterrupted steps in one
    process, parameters and optimizer state alike."""
    common = dict(pp=2, dp=2, num_microbatches=2, schedule="gpipe")
    save = {**common, "zero": max(save.get("zero_stages", (0,))), **save}
    load = {**common, "zero": max(load.get("zero_stages", (load.get("zero", 0),))), **load}
    report = rank_pool.run("rt_ckpt_cases:optimizer_state_reshards", save_plan=save,
                           load_plan=load, path=str(tmp_path / "ckpt"))[0]
    assert not report["param_diffs"] and not report["optim_diffs"], report
    assert report["optim_keys"] > 0, report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report


def test_each_rank_wraps_under_its_own_stage(rank_pool):  # type: ignore[no-untyped-def]
    """zero_stages=3/1 on pp=2 × dp=2: the ranks of pipeline rank 0 wrap their stage in FSDP2
    (ZeRO-3) with a plain optimizer, those of pipeline rank 1 in DDP with
    ``ZeroRedundancyOptimizer`` (ZeRO-1 at tp = 1)."""
    from rt_plans import make_plan

    plan = make_plan(pp=2, dp=2, zero=3, zero_stages=(3, 1), num_microbatches=2,
                     microbatch_size=1, schedule="gpipe")
    reports = [r for r in rank_pool.run("rt_zero_cases:rank_wrappers",
                                        plan_json=plan.to_json()) if r is not None]
    assert {r["pp"] for r in reports} == {0, 1} and len(reports) == 4
    for r in reports:
        if r["pp"] == 0:
            assert all(w.startswith("FSDP") for w in r["wrappers"]), r
            assert r["optimizer"] == "SGD", r
        else:
            assert r["wrappers"] == ["DistributedDataParallel"], r
            assert r["optimizer"] == "ZeroRedundancyOptimizer", r
