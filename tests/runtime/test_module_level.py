"""The module-level runtime: plans found by the search (with constraints) for a tiny Hugging Face
Llama and a user ``nn.TransformerEncoder`` model run on the user's module (``path == "module"``)
and train like one process: 3 SGD steps in fp32, losses and every parameter within a relative
1e-5 of the single-process model (the tolerance of ``test_numerics.py``), on 4 gloo ranks."""

from __future__ import annotations

import functools

import pytest

from rt_module_cases import SPECS, encoder_mlp_tp_plan

pytest.importorskip("transformers")

CLUSTER = "local-cpu:devices=4"
TOL = 1e-5

CONSTRAINTS = {
    "dp_zero3": dict(dp=4, zero_stage=3),
    "tp_sp_dp": dict(tp=2, dp=2, sequence_parallel=True),
    "tp_sp_zero3": dict(tp=2, dp=2, sequence_parallel=True, zero_stage=3),
    "tp_dp_zero0": dict(tp=2, dp=2, zero_stage=0, sequence_parallel=False),
    "pp_dp": dict(pp=2, dp=2, zero_stage=1),
    "pp_dp_zero3": dict(pp=2, dp=2, zero_stage=3, microbatch_size=1),
    "pp_tp": dict(pp=2, tp=2, sequence_parallel=False),
    "pp_tp_sp": dict(pp=2, tp=2, sequence_parallel=True),
    "tp_dp_selective": dict(tp=2, dp=2, sequence_parallel=False, recompute="selective"),
    "pp_dp_selective": dict(pp=2, dp=2, zero_stage=1, recompute="selective"),
}


@functools.lru_cache(maxsize=None)
def plan_json(kind: str, name: str) -> str:
    """The search's plan for ``kind`` under constraint set ``name`` (searched once per session)."""
    import fxplan

    model = SPECS[kind]
    seq = 8 if kind.startswith("llama") else None
    plan = fxplan.search(model, CLUSTER, batch=4, seq=seq, constraints=CONSTRAINTS[name],
                         progress=False)
    return plan.to_json()


def _check(report: dict) -> None:
    assert report["path"] == "module", report["fallbacks"]
    assert not report["missing"] and not report["extra"], report
    assert report["loss_error"] <= TOL, report
    assert report["param_error"] <= TOL, (report["worst"], report)
    assert report["losses"][-1] < report["losses"][0], report


@pytest.mark.parametrize("name", list(CONSTRAINTS))
def test_hf_llama_trains_like_one_process(rank_pool, name):
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="llama",
                           plan_json=plan_json("llama", name))[0]
    _check(report)


@pytest.mark.parametrize("name", ["dp_zero3", "pp_dp"])
def test_encoder_trains_like_one_process(rank_pool, name):
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="encoder",
                           plan_json=plan_json("encoder", name))[0]
    _check(report)


@pytest.mark.parametrize("name", ["tp_sp_dp", "pp_dp", "pp_tp_sp"])
def test_tied_llama_trains_like_one_process(rank_pool, name):
    """``tie_word_embeddings=True``: the embedding and the LM head share one Parameter. Under
    tp both use it as one ``Shard(0)`` DTensor (vocabulary-parallel embedding, column-parallel
    head); under pp the first and last stages hold copies whose gradients are summed each
    step. Either way it trains like one process and goes by one name (no missing / extra
    key against the unsharded model's ``named_parameters``), and the gathered parameters load
    into the unsharded tied model (the head's key is the only one missing: it is the same
    Parameter as the embedding's, which the load fills)."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="llama-tied",
                           plan_json=plan_json("llama-tied", name))[0]
    _check(report)
    assert report["tied_equal"], report
    assert report["loads_back"] and report["missing_on_load"] == ["lm_head.weight"], report


@pytest.mark.parametrize("kind", ["llama", "llama-tied"])
def test_hf_llama_built_on_meta(rank_pool, kind):
    """As ``fxplan launch`` builds it: parameters on meta, each rank materialising its stage
    from the seeded builder (pipeline and data parallel; the tied head's copy on the last
    stage takes the embedding's values)."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind=kind,
                           plan_json=plan_json(kind, "pp_dp"), meta=True)[0]
    _check(report)
    assert report["tied_equal"], report


def test_encoder_mlp_tensor_parallel(rank_pool):
    """A hand-written 2×2 ZeRO-3 plan sharding ``nn.TransformerEncoderLayer``'s MLP over tp
    (the search keeps this model replicated over tp, see docs/runtime.md)."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="encoder",
                           plan_json=encoder_mlp_tp_plan())[0]
    _check(report)


@pytest.mark.parametrize("zero", [0, 1, 3])
def test_encoder_attention_tensor_parallel(rank_pool, zero):
    """``nn.MultiheadAttention`` head-parallel (its fused ``in_proj_weight`` split per head
    group, ``out_proj`` row-parallel) and the MLP split, on a 2×2 (dp, tp) mesh."""
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="encoder",
                           plan_json=encoder_mlp_tp_plan(attention=True, zero=zero))[0]
    _check(report)


def test_encoder_attention_sequence_parallel(rank_pool):
    """Head-parallel attention under sequence parallelism: the sequence-sharded stream is
    all-gathered into the attention and reduce-scattered out of it (ZeRO-3 on 2×2)."""
    overrides = {"emb.weight": "RS(0)", "head.weight": "RS(0)", "head.bias": "RS(0)"}
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="encoder",
                           plan_json=encoder_mlp_tp_plan(attention=True, sp=True,
                                                         extra=overrides))[0]
    _check(report)


def test_encoder_searched_tensor_parallel(rank_pool):
    """The search's own tp=2, dp=2 plan for a wider encoder splits the attention by heads
    (``in_proj_weight`` ``S(0)``, ``out_proj.weight`` ``S(1)`` over tp) and the MLP, and runs
    it at module level like one process."""
    import fxplan

    text = plan_json("encoder-wide", "tp_dp_zero0")
    params = fxplan.Plan.from_json(text).placements.params
    prefix = "encoder.layers.1.self_attn."
    assert str(params[prefix + "in_proj_weight"][-1]) == "S(0)", params
    assert str(params[prefix + "out_proj.weight"][-1]) == "S(1)", params
    report = rank_pool.run("rt_module_cases:train_matches_reference", kind="encoder-wide",
                           plan_json=text)[0]
    _check(report)


@pytest.mark.parametrize("kind,name", [("llama", "tp_sp_zero3"), ("llama", "dp_zero3"),
                                       ("llama-tied", "tp_sp_zero3")])
def test_hf_state_dict_round_trip(rank_pool, kind, name):
    """An HF-format state dict loads into the sharded model; the gathered full state dict after
    a step loads back into the unsharded model with ``strict=True`` and equal values (for the
    tied Llama: the embedding and the head one tensor, under the unsharded model's keys)."""
    report = rank_pool.run("rt_module_cases:state_dict_round_trip", kind=kind,
                           plan_json=plan_json(kind, name))[0]
    assert report["path"] == "module"
    assert report["keys_equal"], report
    assert report["load_error"] == 0.0, report
    assert report["back_error"] == 0.0, report
    assert report["changed"] > 0, report
