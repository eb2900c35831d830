"""``runtime.apply.offload`` and ``runtime.apply.fp8`` without a process group: what the runtime refuses,
the FSDP2 policy it passes, and FP8 left alone when the plan does not ask for it."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

from fxplan.runtime.apply.fp8 import apply_fp8
from fxplan.runtime.apply.offload import (RuntimeSupportError, check_runnable, offload_fallback,
                                    offload_policy)
from tests.core.test_plan import make_plan


def _plan(**config):   # pp=2 dp=2 tp=1, zero=1 by default
    plan = make_plan()
    return dataclasses.replace(plan, config=plan.config.replace(**config))


def test_offload_policy_only_when_offloading() -> None:
    assert offload_policy(_plan()) is None
    policy = offload_policy(_plan(zero_stage=3, offload="optimizer+params"))
    assert isinstance(policy, CPUOffloadPolicy) and isinstance(policy, OffloadPolicy)
    assert policy.pin_memory == torch.cuda.is_available()
    assert offload_fallback(_plan(zero_stage=3, offload="optimizer")) is not None
    assert offload_fallback(_plan(zero_stage=3, offload="optimizer+params")) is None


def test_refusals_name_what_would_run_it() -> None:
    check_runnable(_plan(zero_stage=3, offload="optimizer"), "cpu")
    check_runnable(_plan(zero_stage=2, offload="optimizer"), "gpu")   # fully_shard, no reshard
    with pytest.raises(RuntimeSupportError, match="zero=3,offload=optimizer\\+params"):
        check_runnable(_plan(zero_stage=1, offload="optimizer"), "gpu")   # tp=1: ZeroRedundancy
    with pytest.raises(RuntimeSupportError, match="fp8 is not runnable on CPU"):
        check_runnable(_plan(fp8=True), "cpu")


def test_fp8_conversion_is_a_no_op_without_fp8_and_refused_on_cpu() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32))
    assert apply_fp8(model, _plan()) is model
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeSupportError, match="not runnable on CPU"):
            apply_fp8(model, _plan(fp8=True))


def test_each_pipeline_rank_is_judged_under_its_own_stage_and_offload() -> None:
    """offload_stages: a rank that offloads must have its stage sharded by FSDP2; a rank that
    does not offload may run any stage."""
    check_runnable(_plan(zero_stage=3, zero_stages=(3, 1),
                        offload_stages=("optimizer+params", "none")), "gpu")
    with pytest.raises(RuntimeSupportError, match="offload=optimizer with zero=1 on pipeline "
                                                  "rank 1"):
        check_runnable(_plan(zero_stage=3, zero_stages=(3, 1),
                             offload_stages=("none", "optimizer")), "gpu")
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
    assert offload_refusal(alike, users, "cuda") is None
