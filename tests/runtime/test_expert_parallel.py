"""Expert parallelism trains like one process: moe-tiny (4 experts, top-2, capacity factor 0.5
so that tokens are dropped) for 3 SGD steps in fp32 under dp·ep plans on 4 pooled gloo ranks;
losses, the first step's auxiliary losses and every parameter (gathered) within a relative
1e-5 of the single-process model, each rank holding E/ep experts (with ZeRO ≥ 1, 1/(dp/ep) of
them: expert ZeRO, weights and optimizer state)."""

from __future__ import annotations

import pytest
import torch

from fxplan.runtime.apply.offload import RuntimeSupportError
from torch_versions import skip_without_expert_zero

CASES = {
    "dp2_ep2": dict(dp=2, ep=2),
    "dp4_ep2": dict(dp=4, ep=2, microbatch_size=1),
    "dp4_ep2_zero1": dict(dp=4, ep=2, zero=1, microbatch_size=1),
    "dp4_ep2_zero2": dict(dp=4, ep=2, zero=2, microbatch_size=1),
    "dp4_ep2_zero3_recompute": dict(dp=4, ep=2, zero=3, microbatch_size=1, recompute="full"),
    "dp2_ep2_zero1_recompute": dict(dp=2, ep=2, zero=1, recompute="full"),
    # attention tensor-parallel, experts whole per EP rank, each tp rank its chunk of the rows
    "dp2_ep2_tp2": dict(dp=2, ep=2, tp=2),
    "dp2_ep2_tp2_zero3": dict(dp=2, ep=2, tp=2, zero=3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_expert_parallel_matches_single_process(rank_pool, name):
    kwargs = CASES[name]
    skip_without_expert_zero(kwargs)
    report = rank_pool.run("rt_ep_cases:train_ep_matches_reference", plan_kwargs=kwargs)[0]
    assert report["path"] == "module" and not report["missing"], report
    assert report["dropped"] > 0, report            # the capacity drops assignments
    assert report["loss_error"] <= 1e-5, report
    assert report["aux_error"] <= 1e-5, report
    assert report["norm_error"] <= 1e-5, report     # the trainer's clipping norm
    assert report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]
    ep, edp = kwargs["ep"], kwargs["dp"] // kwargs["ep"]
    # expert ZeRO: with ZeRO ≥ 1 each of the dp/ep ranks holding the same experts keeps 1/edp
    sharded = edp if kwargs.get("zero", 0) > 0 else 1
    assert len(report["expert_shapes"]) == 4 * 2, report   # w1 b1 w2 b2 in 2 MoE layers
    for key, shape in report["expert_shapes"].items():
        assert shape[0] * ep * sharded == report["expert_global"][key][0] == 4, (key, shape)
    assert report["expert_state"] == report["expert_shapes"], report   # SGD momentum buffers
    assert not [f for f in report["fallbacks"] if f.startswith("[expert-parallel] ZeRO")], \
        report["fallbacks"]
    # tp > 1: the attention's QKV and projection are split over tp, the experts are not
    split = {k.rpartition(".")[0].rpartition(".")[2] for k in report["tp_split"]}
    assert split == ({"qkv", "proj", "wte"} if kwargs.get("tp", 1) > 1 else set()), \
        report["tp_split"]


def test_selective_recompute_beside_experts_with_fused_attention(rank_pool):
    """A block holding experts whose attention is one fused call keeps selective recompute
    (only that call is checkpointed; the experts are not replayed) and trains like one
    process; written out, the module level refuses it
    (``test_the_module_level_leaves_a_written_out_selective_to_the_graph_rewrite``)."""
    report = rank_pool.run("rt_ep_cases:train_ep_matches_reference", attention="sdpa",
                           plan_kwargs=dict(dp=2, ep=2, recompute="selective"))[0]
    assert report["path"] == "module", report["fallbacks"]
    assert not [f for f in report["fallbacks"] if "recompute" in f], report["fallbacks"]
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["aux_error"] <= 1e-5 and report["norm_error"] <= 1e-5, report


@pytest.mark.parametrize("kwargs", [dict(dp=2, ep=2), dict(dp=4, ep=2, zero=3, microbatch_size=1)],
                         ids=["dp2_ep2", "dp4_ep2_zero3"])
def test_sharded_checkpoint_loads_into_the_unsharded_model(rank_pool, tmp_path, kwargs):
    """Built on meta as the launch worker builds it (each rank materialises its experts from
    the seeded builder), trained one step, saved sharded, loaded whole; with expert ZeRO-3
    each rank saves 1/(dp/ep) of its experts."""
    skip_without_expert_zero(kwargs)
    report = rank_pool.run("rt_ep_cases:train_ep_matches_reference", plan_kwargs=kwargs,
                           steps=1, checkpoint=str(tmp_path / "ckpt"), meta=True)[0]
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["loaded_error"] == 0.0, report


def test_sequence_parallel_with_experts_is_refused():
    from rt_ep_cases import build_moe, make_ep_plan

    from fxplan.runtime.apply.graph import apply_plan

    plan = make_ep_plan(dp=2, ep=2, tp=2, sp=True)
    with pytest.raises(RuntimeSupportError, match="ep=2 with tp=2 and sequence parallelism: "
                                                  ".*--constrain sp=off"):
        apply_plan(build_moe(), plan, None)


def test_expert_weights_in_no_known_layer_are_refused_before_any_collective():
    """3-D expert weights the runtime cannot split (neither MoELayer's step methods nor a
    routed experts module) are refused by apply_plan before a process group is needed."""
    from rt_ep_cases import make_ep_plan

    from fxplan.runtime.apply.graph import apply_plan

    class Unknown(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.experts = torch.nn.Parameter(torch.zeros(4, 8, 8))

    with pytest.raises(RuntimeSupportError, match="ep=2: the model's expert weights are not in "
                                                  "a layer .*--constrain ep=1"):
        apply_plan(Unknown(), make_ep_plan(dp=2, ep=2), None)
