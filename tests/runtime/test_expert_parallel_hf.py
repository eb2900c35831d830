"""Expert parallelism on Hugging Face mixtures of experts (``transformers`` ≥ 5's routed experts
modules, built from configs only): a tiny Mixtral (4 experts, top-2, no capacity) and a tiny
Qwen2-MoE (a gated shared expert beside them) trained 3 SGD steps in fp32 under dp·ep plans on
pooled gloo ranks; losses and every parameter (gathered) within a relative 1e-5 of one process,
under the user's parameter names, each rank holding E/ep experts (1/(dp/ep) of them with
ZeRO ≥ 1: expert ZeRO); a Mixtral whose config asks for the router logits trains with
``transformers``' auxiliary loss (one process: ``CE + coef · aux_loss``) under ep and plain
dp; and a plain dp=2 (ep=1) tiny Mixtral on the user's module (the module probe runs routed
experts by shape)."""

from __future__ import annotations

import pytest
from torch_versions import skip_without_expert_zero

pytest.importorskip("transformers")

CASES = {
    "mixtral_dp2_ep2": ("mixtral", dict(dp=2, ep=2)),
    "mixtral_dp4_ep2": ("mixtral", dict(dp=4, ep=2, microbatch_size=1)),
    "qwen_moe_dp2_ep2_zero2": ("qwen-moe", dict(dp=2, ep=2, zero=2)),
    # attention tensor-parallel (q/k/v/o projections), experts whole per EP rank
    "mixtral_dp2_ep2_tp2": ("mixtral", dict(dp=2, ep=2, tp=2)),
    # expert ZeRO-3 over the dp/ep = 2 ranks of each expert, and the router's auxiliary loss
    "mixtral_aux_dp4_ep2_zero3": ("mixtral-aux", dict(dp=4, ep=2, zero=3, microbatch_size=1)),
}


def _plan_json(kind: str, kwargs: dict) -> str:
    from rt_module_cases import build, plan_for

    return plan_for(build(kind, meta=True), **kwargs).to_json()


@pytest.mark.parametrize("name", list(CASES))
def test_hf_experts_train_like_one_process(rank_pool, name):
    kind, kwargs = CASES[name]
    skip_without_expert_zero(kwargs)
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind=kind,
                           plan_json=_plan_json(kind, kwargs))[0]
    assert report["path"] == "module", report["fallbacks"]
    assert not report["missing"] and not report["extra"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, (report["worst"], report)
    assert report["losses"][-1] < report["losses"][0], report
    mixtral = kind.startswith("mixtral")
    sparse = 2 if mixtral else 1                    # Qwen2-MoE: decoder_sparse_step=2
    names = {f"model.layers.{i}.mlp.experts.{w}" for i in range(2) for w in
             ("gate_up_proj", "down_proj") if mixtral or i == 1}
    assert set(report["experts"]) == names and len(names) == 2 * sparse, report["experts"]
    edp = kwargs["dp"] // kwargs["ep"] if kwargs.get("zero", 0) else 1   # expert ZeRO
    for local, whole in report["experts"].values():
        assert local[0] * kwargs["ep"] * edp == whole[0] == 4 and local[1:] == whole[1:]
    split = {k.rsplit(".", 2)[-2] for k in report["tp_split"]}   # tp > 1: attention only
    assert split <= {"q_proj", "k_proj", "v_proj", "o_proj", "embed_tokens", "lm_head"}, split
    assert ({"q_proj", "o_proj"} <= split) == (kwargs.get("tp", 1) > 1), split
    assert not any("[router-aux]" in f or "[expert-parallel] ZeRO" in f
                   for f in report["fallbacks"]), report["fallbacks"]


def test_hf_router_aux_loss_plain_data_parallel(rank_pool):
    """dp=2, ep=1: the router's auxiliary loss (output_router_logits) is in the training loss
    and computed from both replicas' routing, as one process on the global batch."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="mixtral-aux",
                           plan_json=_plan_json("mixtral-aux", dict(dp=2)))[0]
    assert report["path"] == "module" and not report["fallbacks"], report["fallbacks"]
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, (report["worst"], report)


def test_hf_mixtral_plain_data_parallel_runs_at_module_level(rank_pool):
    """dp=2, ep=1 (as ``fxplan launch`` builds it: on meta, then materialised): the module
    probe runs the routed experts by shape, so the plan runs on the user's module, experts
    whole on each rank, within 1e-5 of one process."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="mixtral",
                           plan_json=_plan_json("mixtral", dict(dp=2)), meta=True)[0]
    assert report["path"] == "module", report["fallbacks"]
    assert not report["fallbacks"] and not report["experts"], report
    assert not report["missing"] and not report["extra"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, (report["worst"], report)
    assert report["losses"][-1] < report["losses"][0], report
