"""An offload per pipeline rank chosen with the split (:mod:`fxplan.inter_op.stage_zero`): where
nothing fits without offload, the early ranks of 1F1B — the fullest, with more microbatches
in flight — offload and the later ones do not, which the step simulator finds faster than
every plan that offloads all ranks alike; the choice is the cheapest combination of the rungs the runtime runs."""

from __future__ import annotations

import io
import itertools

import pytest

from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config_fields import OFFLOAD_POLICIES

#: Llama (untied head) 8 × 4096 at 4096 tokens on one DGX A100, pp=4 × dp=2, 1F1B, with most
#: of each GPU held back: no split fits on the device at any ZeRO stage. Priced in Megatron-LM's
#: layout of the model states (16-bit weights and gradients, fp32 masters): ``early``, 70.2 GiB
#: held back (9.8 GiB left), the first two ranks — four and three microbatches in flight —
#: offload their optimizer states and the others stay on the device; ``middle``, a 128k
#: vocabulary at 69 GiB held back, whose split leaves the embedding's rank light and offloads
#: the two middle ranks. In the runtime's layout (fp32 parameters and gradients, 8 B of
#: moments: offloading saves 8 B where Megatron's saves 12, ZeRO-3 keeps 16/N either way)
#: ``runtime`` at 70.2 GiB: the first rank, one layer beside the embedding, keeps every state
#: on the device (ZeRO-0), the middle ones offload.
CASES = {
    "early": ("llama:layers=8,hidden=4096,heads=32,vocab=32000,seq=4096", "70.2GiB", "megatron"),
    "middle": ("llama:layers=8,hidden=4096,heads=32,vocab=128256,seq=4096", "69GiB", "megatron"),
    "runtime": ("llama:layers=8,hidden=4096,heads=32,vocab=32000,seq=4096", "70.2GiB", "runtime"),
}
CONSTRAINTS = {"pp": 4, "tp": 1, "schedule": "1f1b", "recompute": "none",
               "microbatch_size": 1}


@pytest.fixture(scope="module", params=sorted(CASES))
def squeezed(request):  # type: ignore[no-untyped-def]
    import fxplan
    from fxplan.api import capture_for_search

    model, headroom, layout = CASES[request.param]
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search(model, dtype=training_dtype(cluster))

    def plan(**extra):  # type: ignore[no-untyped-def]
        return fxplan.search(graph, cluster, batch=64, progress=False,
                             constraints={**CONSTRAINTS, **extra}, memory_headroom=headroom,
                             state_layout=layout)

    return request.param, graph, cluster, plan(), plan


def test_the_ranks_that_need_it_offload_and_the_plan_beats_offloading_every_rank(  # type: ignore[no-untyped-def]
        squeezed) -> None:
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config

    case, graph, cluster, plan, search = squeezed
    offloads = plan.config.rank_offloads
    assert plan.config.offload_stages is not None, plan.summary
    assert offloads[-1] == "none", plan.summary
    if case == "early":   # the fullest ranks of 1F1B
        assert offloads == ("optimizer", "optimizer", "none", "none"), plan.summary
    if case == "runtime":   # the middle ranks; the first holds every state on the device
        assert offloads == ("none", "optimizer", "optimizer", "none"), plan.summary
        assert plan.config.rank_zero_stages[0] == 0, plan.summary
    assert plan.estimate["fits"]
    headroom = plan.estimate["memory_headroom"]
    layout = CASES[case][2]
    assert plan.estimate["state_layout"] == layout
    again = estimate(graph, cluster, priced_config(plan), batch=64, memory_headroom=headroom,
                     state_layout=layout)
    assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    # nothing fits on the device (no plan without offload), and the first pass finds this one:
    # a candidate that fits at no plan-wide rung fits with a rung per rank (joint_rungs.py)
    from fxplan.inter_op import InfeasibleError

    with pytest.raises(InfeasibleError):
        search(offload="none")
    assert not any("nothing fits in device memory" in f for f in plan.fallbacks)
    # the same split with its highest rung on every rank: slower
    top = priced_config(plan).uniform(plan.zero_stage, plan.offload)
    every = estimate(graph, cluster, top, batch=64, memory_headroom=headroom,
                     state_layout=layout)
    assert every.step_time_s > plan.estimate["step_time_s"]


def test_the_plan_beats_the_best_plan_offloading_every_rank_alike(  # type: ignore[no-untyped-def]
        squeezed) -> None:
    """The best plan offloading every rank alike (a constraint naming offload keeps it
    plan-wide) is no faster under the step simulator.

    On ``middle`` it is slower (5.5302 s against 5.1031 s). On ``early`` and ``runtime`` the
    two are as fast: in 1F1B the later ranks end their last backwards before the first
    (:func:`~fxplan.inter_op.surrogate.drain_slack`) and their host steps hide in that, so
    offloading them costs nothing; on ``early`` both price 4.4118 s by ``T̂`` and 4.3693 s
    simulated (the per-rank plan offloads ranks 0 and 1 at ZeRO 2/1/1/1, the plan-wide one
    every rank at the same stages), on ``runtime`` 5.1810 and 5.0549 s."""
    case, _, _, plan, search = squeezed
    alike = search(offload=list(OFFLOAD_POLICIES))
    assert alike.config.offload_stages is None and alike.offload != "none", alike.summary
    if case == "middle":
        assert alike.estimate["step_time_s"] > plan.estimate["step_time_s"]
    else:
        assert alike.estimate["step_time_s"] >= plan.estimate["step_time_s"] * (1 - 1e-12)


def test_a_tie_by_the_closed_form_goes_to_the_less_work() -> None:
    """At 69.3 GiB held back (runtime layout) rank 0 at ZeRO-3 and rank 0 without ZeRO-3's
    gathers price alike by ``T̂`` (5.1293 s; every rank's host step hides behind rank 2's),
    but ZeRO-3's gathers lengthen the pipeline's fill: of tied choices the search takes the
    one with less work summed over the ranks (:func:`fxplan.inter_op.stage_zero.
    least_work_rungs`), ZeRO 0/1/1/1 with rank 2 offloading, which the simulator prices as
    fast as offloading every rank (5.0120 s) where ZeRO 3/2/1/3 took 5.0198 s."""
    import fxplan
    from fxplan.api import capture_for_search

    model, _, layout = CASES["runtime"]
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search(model, dtype=training_dtype(cluster))

    def plan(**extra):  # type: ignore[no-untyped-def]
        return fxplan.search(graph, cluster, batch=64, progress=False,
                             constraints={**CONSTRAINTS, **extra}, memory_headroom="69.3GiB",
                             state_layout=layout)

    free, alike = plan(), plan(offload=list(OFFLOAD_POLICIES))
    assert 3 not in free.config.rank_zero_stages, free.summary
    assert free.estimate["step_time_s"] <= alike.estimate["step_time_s"] * (1 + 1e-12)


def test_the_choice_is_the_cheapest_runnable_combination(squeezed) -> None:  # type: ignore[no-untyped-def]
    """Every combination of the rungs the runtime runs (``optimizer`` offload at every ZeRO
    stage, ``optimizer+params`` only where FSDP2 shards the rank) for the plan's split that fits prices no lower by ``T̂`` than the plan's (host
    memory does not bind here)."""
    from fxplan.inter_op import search_state
    from fxplan.inter_op.offload import memory_rungs
    from fxplan.inter_op.progress import Budget, PhaseTimer
    from fxplan.inter_op.stage_devices import rank_limits
    from fxplan.inter_op.stage_memory import stage_totals
    from fxplan.inter_op.surrogate import surrogate_step_s
    from fxplan.cost_model.memory.headroom import parse_headroom

    case, graph, cluster, plan, _ = squeezed
    state = search_state._Search(graph, cluster, 64, CONSTRAINTS, 8, PhaseTimer(), Budget(None),
                           False, parse_headroom(CASES[case][1]), state_layout=CASES[case][2])
    placed = plan.config.replace(placements=None)
    prof, profs, devs = state._profiles(placed)
    mems = state._memory(devs)
    rungs = [(z, o) for z, o in memory_rungs(placed.dp)
             if o != "optimizer+params" or placed.uniform(z, o).shards_params_with_fsdp]
    chosen = surrogate_step_s(placed, prof, cluster, profs)
    best = float("inf")
    for combo in itertools.product(rungs, repeat=placed.pp):
        zeros, offs = zip(*combo)
        trial = placed.replace(zero_stage=max(zeros), zero_stages=zeros,
                               offload=max(offs, key=OFFLOAD_POLICIES.index),
                               offload_stages=offs)
        if (stage_totals(trial, prof, mems) <= rank_limits(mems)).all():
            best = min(best, surrogate_step_s(trial, prof, cluster, profs))
    assert chosen == pytest.approx(best, rel=1e-12)


def test_reports_and_exports_name_the_offload_per_rank(squeezed) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from fxplan.export import export_plan
    from fxplan.plan_context import simulate_plan
    from fxplan.report.explain import alternative_config
    from fxplan.report.html import render_html
    from fxplan.report.terminal import offload_stage_line, plan_summary, render_report

    _, graph, cluster, plan, _ = squeezed
    offloads = plan.config.rank_offloads
    assert plan_summary(plan)["offload_stages"] == list(offloads)
    out = io.StringIO()
    render_report(plan, Console(file=out, width=200))
    assert f"offload         per stage: {offload_stage_line(plan)}" in out.getvalue()
    assert "on the host: " in out.getvalue() and " per offloading rank, " in out.getvalue()
    page = render_html(plan, graph, simulate_plan(plan, graph, cluster))
    assert f"— per stage: {offload_stage_line(plan)}" in page
    assert f"offload={plan.config.offload_text}" in plan.summary
    ranks = ", ".join(str(r) for r, o in enumerate(offloads) if o == plan.offload)
    assert offload_stage_line(plan).startswith(f"{plan.offload} on pipeline ranks {ranks} · ")
    assert type(plan).from_json(plan.to_json()).config == plan.config
    out = export_plan(plan, "deepspeed")
    text = " ".join(out.notes)
    assert f"offload per pipeline rank ({plan.config.offload_text})" in text, out.notes
    assert "offload_stages=one for every pipeline rank" in text, out.notes
    same, notes = alternative_config(plan, {"microbatch_size": 2})
    assert same.offload_stages == plan.config.offload_stages, notes
    other, notes = alternative_config(plan, {"offload": "optimizer+params", "zero_stage": 3})
    assert other.offload_stages is None and any("offload per stage" in n for n in notes), notes


def test_tied_holders_offload_alike() -> None:
    """GPT ties its embedding (rank 0) and head (the last rank): in the offload pass every
    candidate that offloads per rank gives both holders the same kind of rung — gradient
    layout and whether it offloads — since the runtime sums a tied weight's gradients only
    where both sit alike (:func:`fxplan.runtime.apply.tied.offload_refusal`)."""
    from fxplan.api import capture_for_search
    from fxplan.cost_model.memory.headroom import parse_headroom
    from fxplan.inter_op import search_state
    from fxplan.inter_op.progress import Budget, PhaseTimer
    from fxplan.inter_op.stage_zero import tied_holders
    from fxplan.inter_op.surrogate import surrogate_step_s

    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search("gpt:layers=8,hidden=4096,heads=32,vocab=32000,seq=4096",
                               dtype=training_dtype(cluster))
    state = search_state._Search(graph, cluster, 64, {"pp": 4, "tp": 1, "dp": 2}, 8, PhaseTimer(),
                           Budget(None), False, parse_headroom("58GiB"))
    state.rungs.start_offload()
    mixed = 0
    for family, (zero, off) in state.families().items():
        for c in state._options(family):
            scored = state._score(c.replace(zero_stage=zero, offload=off))
            if scored is None or scored.config.offload_stages is None:
                continue
            mixed += 1
            placed = scored.config
            prof, profs, _ = state._profiles(placed)
            holders = tied_holders(placed, prof)
            assert holders == (0, 3)
            kinds = {(placed.at_pipeline_rank(r).shards_params_with_fsdp,
                      placed.offload_of(r) != "none") for r in holders}
            assert len(kinds) == 1, placed.summary()
            assert surrogate_step_s(placed, prof, cluster, profs) == \
                pytest.approx(scored.surrogate_s, rel=1e-12)
    assert mixed >= 1
