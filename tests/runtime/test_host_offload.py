"""``offload=optimizer`` on gloo ranks: the optimizer steps on the host
(:mod:`fxplan.runtime.train.host_optimizer`) at every ZeRO stage the cost model prices it, and
the run equals one process.

Each case trains 2 steps under plan A, saves parameters and optimizer state, loads them under
plan B into a model built on meta, trains 1 more step, and compares with 3 uninterrupted steps
in one process (momentum SGD: losses and every parameter within a relative 1e-5; the loaded
state bit for bit equal to the saved). The trainer itself (AdamW, clipping, the lr schedule)
is resumed from a training checkpoint and must give the uninterrupted losses bit for bit."""

from __future__ import annotations

import pytest

HOST = "HostSGD"
OFFLOAD = dict(offload="optimizer")

#: name → (plan A, plan B, this rank's local optimizer class under A and B on rank 0)
CASES = {
    # ZeRO-0 at dp=1: one rank, a plain module
    "zero0_dp1": (dict(**OFFLOAD), None, (HOST, HOST)),
    # ZeRO-0 beside tp: replicate over dp, DTensor parameters (tp shards) on the host
    "zero0_dp2_tp2": (dict(dp=2, tp=2, **OFFLOAD), None, (HOST, HOST)),
    # ZeRO-1 at tp=ep=1: ZeroRedundancyOptimizer, its partition stepped on the host
    "zero1_dp4": (dict(dp=4, zero=1, **OFFLOAD), None, (HOST, HOST)),
    # ZeRO-2 beside tp: FSDP2 on a 2-D mesh, dp×tp shards on the host
    "zero2_dp2_tp2": (dict(dp=2, tp=2, zero=2, **OFFLOAD), None, (HOST, HOST)),
    "zero3_dp4": (dict(dp=4, zero=3, **OFFLOAD), None, (HOST, HOST)),
    # an offload per pipeline rank: rank 0 ZeRO-1 offloaded, rank 1 ZeRO-3 on the device
    "per_rank_pp2": (dict(pp=2, dp=2, zero=3, zero_stages=(1, 3),
                          offload_stages=("optimizer", "none"), num_microbatches=2,
                          schedule="gpipe"), None, (HOST, HOST)),
    # the search's MoE/V100 choice, without experts: ZeRO-1, the optimizer offloaded on every
    # pipeline rank
    "zero1_pp2_every_rank": (dict(pp=2, dp=2, zero=1, num_microbatches=2, **OFFLOAD), None,
                             (HOST, HOST)),
    # written with offload, read without, and the other way round
    "offload_to_device": (dict(dp=4, zero=3, **OFFLOAD), dict(dp=2, tp=2, zero=1,
                                                               microbatch_size=4),
                          (HOST, "SGD")),
    "device_to_offload": (dict(dp=4, zero=1), dict(dp=2, tp=2, zero=2, microbatch_size=4,
                                                   **OFFLOAD), ("SGD", HOST)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_offload_optimizer_trains_and_resumes_like_one_process(rank_pool, tmp_path, name):
    save, load, kinds = CASES[name]
    report = rank_pool.run("rt_ckpt_cases:optimizer_state_reshards", save_plan=save,
                           load_plan=load or save, path=str(tmp_path / "ckpt"))[0]
    assert report["optimizers"] == list(kinds), report
    assert not report["param_diffs"] and not report["optim_diffs"], report
    assert any(k.endswith(".momentum_buffer") for k in report["optim_keys_list"]), report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]


def test_adam_state_on_the_host_loads_exactly(rank_pool, tmp_path):
    """Adam's moments and step kept on the host as DTensors of the parameters' dp×tp layout
    load bit for bit; Adam amplifies reduction-order rounding, so after the further step only
    the losses are compared with one process (as ``test_checkpoint``'s Adam case)."""
    plan = dict(dp=2, tp=2, zero=2, **OFFLOAD)
    report = rank_pool.run("rt_ckpt_cases:optimizer_state_reshards", optimizer="adam",
                           save_plan=plan, load_plan=plan, path=str(tmp_path / "ckpt"))[0]
    assert report["optimizers"] == ["HostAdam", "HostAdam"], report
    assert not report["param_diffs"] and not report["optim_diffs"], report
    assert any(k.endswith(".exp_avg_sq") for k in report["optim_keys_list"]), report
    assert report["loss_error"] <= 1e-5, report


def test_the_trainer_resumed_gives_the_uninterrupted_losses(rank_pool, token_file, tmp_path):
    """The trainer's AdamW on the host under ZeRO-1 (``ZeroRedundancyOptimizer``), dp=2:
    interrupted after step 10's training checkpoint and resumed to 20, bit for bit the run
    that was not interrupted."""
    report = rank_pool.run(
        "rt_resume_cases:resume_matches_uninterrupted",
        plan_kwargs=dict(dp=2, zero=1, microbatch_size=2, num_microbatches=2, **OFFLOAD),
        token_file=token_file, tmp=str(tmp_path), dropout=0.0,
        config=dict(steps=20, optimizer="adamw", lr=3e-3, warmup_steps=3, grad_clip=1.0))[0]
    assert len(report["whole"]) == 20 and len(report["resumed"]) == 10, report
    assert report["resumed"] == report["whole"][10:], report
    assert report["whole"][-1] < report["whole"][0], report


@pytest.mark.parametrize("zero", [0, 1])
def test_zb_beside_data_parallelism_steps_on_the_host(rank_pool, zero):
    """pp=2 × dp=2 under ``zb`` (m = 4): no wrapper, the gradients averaged over dp after the
    schedule's step, then the host optimizer (ZeRO-1: ZeroRedundancyOptimizer's partition on
    the host); 3 SGD steps within the suite's relative 1e-5 of one process."""
    report = rank_pool.run("rt_cases:train_matches_reference", plan_kwargs=dict(
        pp=2, dp=2, zero=zero, schedule="zb", num_microbatches=4, microbatch_size=1,
        **OFFLOAD))[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0], report


def test_experts_step_on_the_host_over_their_own_replicas(rank_pool):
    """The search's MoE choice in small: ZeRO-1 beside ep = dp = 2 (FSDP2, the experts over
    their dp/ep = 1 replicas: whole per rank), the optimizer offloaded. Losses, the clipping's
    norm and every parameter within the suite's 1e-5 of one process, and each expert's host
    state the size of its local tensor (the whole expert share: what ``Ψ_o`` counts)."""
    from torch_versions import skip_without_expert_zero

    kwargs = dict(dp=2, ep=2, zero=1, **OFFLOAD)
    skip_without_expert_zero(kwargs)
    report = rank_pool.run("rt_ep_cases:train_ep_matches_reference", plan_kwargs=kwargs)[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["norm_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report
    assert report["expert_state"] == report["expert_shapes"], report
    assert all(shape[0] * 2 == 4 for shape in report["expert_shapes"].values()), report
