"""Each plan dimension trains like one process: 3 SGD steps in fp32, losses and every parameter
(gathered) within a relative 1e-5 of the single-process model (gloo, pooled ranks)."""

from __future__ import annotations

import pytest
from torch_versions import needs

CASES = {
    "dp": dict(dp=2),
    "zero1": dict(dp=2, zero=1),
    "zero2": dict(dp=2, zero=2),
    "zero2_accumulate": dict(dp=2, zero=2, num_microbatches=2),   # gathered until the last backward
    "pp_dp_zero2": dict(pp=2, dp=2, zero=2, num_microbatches=2, microbatch_size=1),
    "zero3": dict(dp=2, zero=3),
    "zero3_accumulate": dict(dp=2, zero=3, num_microbatches=2),   # reduce-scatter per microbatch
    "zero3_offload": dict(dp=2, zero=3, offload="optimizer+params"),   # FSDP2 CPUOffloadPolicy
    "zero3_offload_optimizer": dict(dp=2, zero=3, offload="optimizer"),  # the host optimizer
    "dp_tp_zero3_offload": dict(dp=2, tp=2, zero=3, offload="optimizer+params"),
    "dp_tp_zero2_offload_optimizer": dict(dp=2, tp=2, zero=2, offload="optimizer"),
    "tp": dict(tp=2),
    "tp_sp": dict(tp=2, sp=True),
    "pp_gpipe": dict(pp=2, schedule="gpipe", num_microbatches=2),
    "pp_1f1b": dict(pp=2, schedule="1f1b", num_microbatches=4, microbatch_size=1),
    "pp_interleaved": dict(pp=2, schedule="interleaved:2", num_microbatches=2, layers=4),
    "pp_zb": dict(pp=2, schedule="zb", num_microbatches=4, microbatch_size=1),
    "pp_zb2": dict(pp=2, schedule="zb:2", num_microbatches=2, layers=4),
    "pp_tp_zb": dict(pp=2, tp=2, schedule="zb", num_microbatches=2, sp=True),
    "dp_tp": dict(dp=2, tp=2, zero=2),
    "dp_tp_zero0": dict(dp=2, tp=2, zero=0),
    "dp_tp_zero1": dict(dp=2, tp=2, zero=1),  # runs as FSDP2 (a reported fallback)
    "pp_dp": dict(pp=2, dp=2, zero=1, num_microbatches=2),
    "pp_dp_zero3": dict(pp=2, dp=2, zero=3, num_microbatches=2, schedule="gpipe"),
    "pp_tp": dict(pp=2, tp=2, num_microbatches=2, sp=True),
    "pp_tp_nosp": dict(pp=2, tp=2, num_microbatches=2),
    "recompute": dict(dp=2, recompute="full", num_microbatches=2),
    "recompute_selective": dict(tp=2, recompute="selective"),
}


#: Cases whose plan runs as the graph rewrite with tp > 1 (the module level refuses selective
#: recompute of the zoo GPT's written-out attention): a torch without the feature refuses them.
GRAPH_REWRITE_TP = {"recompute_selective"}


@pytest.mark.parametrize("name", [pytest.param(name, marks=needs("dtensor_view_sharding"))
                                  if name in GRAPH_REWRITE_TP else name for name in CASES])
def test_matches_single_process(rank_pool, name):
    kwargs = CASES[name]
    results = rank_pool.run("rt_cases:train_matches_reference", plan_kwargs=kwargs)
    report = results[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5, report
    assert report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]
    if name.startswith("pp"):  # the zoo GPT's prologue (wte, wpe, drop) is cut at module level
        assert report["path"] == "module", report["fallbacks"]
    zero1_as_fsdp = [f for f in report["fallbacks"] if "ZeRO-1 with tp=2 runs as FSDP2" in f]
    assert len(zero1_as_fsdp) == (name == "dp_tp_zero1"), report["fallbacks"]
    # offload runs as priced (offload=optimizer: runtime.train.host_optimizer): no fallback
    assert not [f for f in report["fallbacks"] if "offload" in f], report["fallbacks"]


@pytest.mark.parametrize("name", [pytest.param("pp_tp", marks=needs("dtensor_view_sharding")),
                                  "pp_dp"])
def test_graph_rewrite_pipeline_matches_single_process(rank_pool, name):
    """The graph rewrite's pipeline (what runs a pp plan the module level refuses), asked for
    by ``path="graph"``: the zoo GPT's pp plans run at module level by default. Without tp it
    runs on every supported torch."""
    report = rank_pool.run("rt_cases:train_matches_reference", path="graph",
                           plan_kwargs=CASES[name])[0]
    assert report["path"] == "graph", report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report


def test_planner_found_local_cpu_plan(rank_pool):
    """The plan the search finds for gpt-tiny on ``local-cpu:devices=4`` trains like one process."""
    import fxplan

    plan = fxplan.search("gpt-tiny:dropout=0,seq=16", "local-cpu:devices=4", batch=8, seq=16,
                          progress=False)
    results = rank_pool.run("rt_cases:train_matches_reference", plan_json=plan.to_json())
    report = results[0]
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, (plan.summary, report)


def test_recompute_per_stage_matches_single_process(rank_pool):
    """pp=2 whose stages recompute different numbers of their layers (what the search chooses
    where memory needs it: both of stage 0's in full, one of stage 1's, the last none) trains
    like one process."""
    import dataclasses

    from rt_plans import make_plan

    plan = make_plan(pp=2, layers=4, recompute="full", num_microbatches=4, microbatch_size=1)
    plan = dataclasses.replace(plan, config=plan.config.replace(stage_layers=(2, 2),
                                                                recompute_layers=(2, 1)))
    assert plan.block_recompute == ("full", "full", "full", "none")
    report = rank_pool.run("rt_cases:train_matches_reference", plan_kwargs={"layers": 4},
                           plan_json=plan.to_json())[0]
    assert not report["missing"], report
    assert report["loss_error"] <= 1e-5 and report["param_error"] <= 1e-5, report
    assert report["losses"][-1] < report["losses"][0]
    assert report["path"] == "module", report["fallbacks"]
