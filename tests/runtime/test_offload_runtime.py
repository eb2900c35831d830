"""``runtime.apply.offload`` and ``runtime.apply.fp8`` without a process group: what the runtime refuses,
the FSDP2 policy it passes, and FP8 left alone when the plan does not ask for it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from fxplan.runtime.apply.fp8 import apply_fp8
from fxplan.runtime.apply.offload import RuntimeSupportError, check_runnable, offload_policy
from tests.core.test_plan import make_plan


def _plan(**config):   # pp=2 dp=2 tp=1, zero=1 by default
    plan = make_plan()
    config = plan.config.replace(**config)
    return dataclasses.replace(plan, config=config, batch=config.replicas
                               * config.microbatch_size * config.num_microbatches)


def test_offload_policy_only_when_the_parameters_are_offloaded() -> None:
    """FSDP2's CPU offload for ``optimizer+params``; ``offload=optimizer`` keeps the
    parameters on the device (its optimizer steps on the host: ``host_optimizer``)."""
    assert offload_policy(_plan()) is None
    policy = offload_policy(_plan(zero_stage=3, offload="optimizer+params"))
    assert isinstance(policy, CPUOffloadPolicy) and isinstance(policy, OffloadPolicy)
    assert policy.pin_memory == torch.cuda.is_available()
    assert offload_policy(_plan(zero_stage=3, offload="optimizer")) is None


@pytest.mark.parametrize("zero, dp, tp", [(0, 1, 1), (0, 2, 1), (1, 2, 1), (1, 1, 2), (2, 2, 1),
                                          (3, 2, 2)])
@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_offload_optimizer_runs_at_every_zero_stage(zero, dp, tp, device) -> None:
    """Every (ZeRO stage, dp, tp) the cost model prices ``offload=optimizer`` at, ZeRO-0 at
    dp=1 and ZeRO-1 at tp=ep=1 (``ZeroRedundancyOptimizer``) included."""
    check_runnable(_plan(zero_stage=zero, dp=dp, tp=tp, offload="optimizer"), device)


def test_refusals_name_what_would_run_it() -> None:
    check_runnable(_plan(zero_stage=3, offload="optimizer+params"), "gpu")
    with pytest.raises(RuntimeSupportError, match="zero=3,offload=optimizer\\+params"):
        check_runnable(_plan(zero_stage=3, dp=1, offload="optimizer+params"), "gpu")   # no FSDP2
    with pytest.raises(RuntimeSupportError, match="fp8 is not runnable on CPU"):
        check_runnable(_plan(fp8=True), "cpu")


def test_fp8_conversion_is_a_no_op_without_fp8_and_refused_on_cpu() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32))
    assert apply_fp8(model, _plan()) is model
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeSupportError, match="not runnable on CPU"):
            apply_fp8(model, _plan(fp8=True))


def test_each_pipeline_rank_is_judged_under_its_own_stage_and_offload() -> None:
    """offload_stages: a rank that offloads its parameters must have its stage sharded by
    FSDP2; a rank that offloads its optimizer only, or nothing, may run any stage."""
    check_runnable(_plan(zero_stage=3, zero_stages=(3, 1),
                        offload_stages=("optimizer+params", "none")), "gpu")
    check_runnable(_plan(zero_stage=3, zero_stages=(3, 1),
                         offload_stages=("none", "optimizer")), "gpu")
    with pytest.raises(RuntimeSupportError, match="offload=optimizer\\+params with zero=3 on "
                                                  "pipeline rank 1, dp=1"):
        check_runnable(_plan(zero_stage=3, dp=1, offload_stages=("none", "optimizer+params")),
                       "gpu")
    rank0 = _plan(zero_stage=3, offload_stages=("optimizer+params", "none")).at_pipeline_rank(0)
    rank1 = _plan(zero_stage=3, offload_stages=("optimizer+params", "none")).at_pipeline_rank(1)
    assert isinstance(offload_policy(rank0), CPUOffloadPolicy) and offload_policy(rank1) is None


def test_a_weight_tied_across_offloading_and_on_device_ranks_is_refused_on_gpus() -> None:
    from fxplan.runtime.apply.tied import offload_refusal

    plan = _plan(zero_stage=3, offload_stages=("optimizer+params", "none"))
    users = {"wte.weight": (0, 1)}
    assert offload_refusal(plan, users, "cpu") is None   # host tensors on both
    why = offload_refusal(plan, users, "cuda")
    assert why is not None and "'wte.weight' is tied between pipeline ranks [0, 1]" in why
    assert offload_refusal(plan, {"wte.weight": (0,)}, "cuda") is None
    alike = _plan(zero_stage=3, offload_stages=("optimizer+params", "optimizer"))
    assert offload_refusal(alike, users, "cuda") is None   # both step on the host
    host_and_device = _plan(zero_stage=1, offload_stages=("optimizer", "none"))
    assert "steps its copy on the host's CPU" in offload_refusal(host_and_device, users, "cuda")
