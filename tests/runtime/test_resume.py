"""Training checkpoints on 2 pooled gloo ranks: a run interrupted after step 10's checkpoint
and resumed to step 20 gives the losses of the run that was not interrupted (parameters,
optimizer state, step, data position and every rank's generators restored), and a save that
crashes half-way leaves the previous checkpoint complete and the one a resume finds."""

from __future__ import annotations

import pytest


CASES = {
    "sgd_dp2": (dict(dp=2, microbatch_size=2, num_microbatches=2),
                dict(steps=20, optimizer="sgd", lr=0.5, warmup_steps=3, grad_clip=1.0,
                     weight_decay=0.0), 0.0),
    "adamw_pp2_dropout": (dict(pp=2, microbatch_size=2, num_microbatches=4, schedule="1f1b"),
                          dict(steps=20, optimizer="adamw", lr=3e-3, warmup_steps=3,
                               grad_clip=1.0), 0.1),
    "adamw_dp2_zero3_dropout": (dict(dp=2, zero=3, microbatch_size=2, num_microbatches=2),
                                dict(steps=20, optimizer="adamw", lr=3e-3, warmup_steps=3,
                                     grad_clip=1.0), 0.1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_resumed_run_gives_the_uninterrupted_losses(rank_pool, token_file, tmp_path, name):
    plan_kwargs, config, dropout = CASES[name]
    report = rank_pool.run("rt_resume_cases:resume_matches_uninterrupted", plan_kwargs=plan_kwargs,
                           token_file=token_file, config=config, tmp=str(tmp_path),
                           dropout=dropout)[0]
    assert len(report["whole"]) == 20 and len(report["resumed"]) == 10, report
    assert report["committed"] == ["latest", "step-10"], report
    print(f"{name}: max |Δloss| steps 11–20 = {report['max_abs_diff']:.3g}")
    assert report["resumed"] == report["whole"][10:], report  # bit for bit
    assert report["max_abs_diff"] == 0.0


def test_a_crash_during_save_leaves_the_previous_checkpoint(rank_pool, token_file, tmp_path):
    plan_kwargs, config, _ = CASES["sgd_dp2"]
    report = rank_pool.run("rt_resume_cases:crash_during_save", plan_kwargs=plan_kwargs,
                           token_file=token_file, config={**config, "steps": 6},
                           tmp=str(tmp_path))[0]
    assert report["error"] == "disk full (simulated)", report
    staging = [e for e in report["entries"] if e.startswith("step-4.tmp-")]
    assert len(staging) == 1 and "step-4" not in report["entries"], report
    assert ".metadata" in report["staging_files"], report  # DCP had written its files
    assert "fxplan-manifest.json" not in report["staging_files"], report
    assert report["latest"] == "step-2" and report["resumes_from"] == "step-2", report
    assert report["manifest_step"] == 2
