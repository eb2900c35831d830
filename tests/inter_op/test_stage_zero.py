"""A ZeRO stage per pipeline rank chosen with the split (:mod:`fxplan.inter_op.stage_zero`):
the threshold method is exact for ``T̂`` — checked against every combination, on random
terms and on the search's own candidates priced by the surrogate and the memory formula."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fxplan.api import capture_for_search
from fxplan.cluster_specs import Cluster, training_dtype
from fxplan.core.config import ParallelConfig
from fxplan.core.zero_bubble_dp import after_step_refusal
from fxplan.inter_op import search_state
from fxplan.inter_op.progress import Budget, PhaseTimer
from fxplan.inter_op.space import options
from fxplan.inter_op.stage_devices import rank_limits
from fxplan.inter_op.stage_memory import stage_totals
from fxplan.inter_op.stage_zero import RankOptions, choose_rungs, tied_holders
from fxplan.inter_op.surrogate import surrogate_step_s


def _brute(c: ParallelConfig, opts: RankOptions) -> float:
    """``min T̂`` over every combination of fitting stages, by the formula itself (1F1B: rank
    ``s`` ends its last backward ``Σ_{j<s} β_j`` before the first)."""
    p, b, m = c.pp, (c.pp - 1) / c.virtual_stages, c.num_microbatches
    slack = np.concatenate([[0.0], np.cumsum(opts.drain[:-1])])
    best = np.inf
    for pick in itertools.product(range(len(opts.rungs)), repeat=p):
        rows = np.arange(p)
        if not opts.fits[rows, pick].all():
            continue
        w, e = opts.w[rows, pick], opts.e[rows, pick]
        best = min(best, (m + b) * w.max() + (e - slack).max())
    return best


@pytest.mark.parametrize("seed", range(40))
def test_threshold_choice_is_the_minimum_over_all_combinations(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p, zeros = int(rng.integers(2, 5)), (0, 1, 2, 3)
    c = ParallelConfig(dp=2, pp=p, num_microbatches=int(rng.integers(1, 9)))
    opts = RankOptions(zeros, rng.uniform(1, 2, (p, 4)), rng.uniform(0, 5, (p, 4)),
                       rng.uniform(size=(p, 4)) < 0.7, rng.uniform(0, 2, p))
    chosen = choose_rungs(c, opts)
    brute = _brute(c, opts)
    if not np.isfinite(brute):
        assert chosen is None
        return
    stages, t = chosen
    assert t == pytest.approx(brute, rel=1e-12)
    rows, cols = np.arange(p), [zeros.index(z) for z in stages]
    assert opts.fits[rows, cols].all()


@pytest.fixture(scope="module")
def search():  # type: ignore[no-untyped-def]
    """gpt-1.7b on one DGX-1 (16 GB V100s), pp=2 × dp=4: memory is tight enough that the
    ranks' activations in flight decide their ZeRO stages."""
    cluster = Cluster.load("dgx1-v100-16g:nodes=1")
    graph = capture_for_search("gpt-1.7b", dtype=training_dtype(cluster))
    return search_state._Search(graph, cluster, 32, {"pp": 2, "dp": 4}, 8, PhaseTimer(),
                          Budget(None), False)


def test_search_keeps_the_cheapest_stages_per_rank(search) -> None:  # type: ignore[no-untyped-def]
    """For every candidate the search scores, no combination of the ranks' stages for its
    split is cheaper by ``T̂`` among those that fit, and a mixed plan's ``T̂`` is the
    surrogate's own price of it."""
    (family, (zmin, _)), = search.families().items()
    prof = search.profile
    mixed = 0
    for c in options(family, batch=32, layers=prof.num_layers, seq=prof.segments.seq,
                     per_stage_recompute=search.per_stage, tied_ends=True):
        scored = search._score(c.replace(zero_stage=zmin))
        if scored is None:
            continue
        placed = scored.config
        profile, profs, devs = search._profiles(placed)
        mems = search._memory(devs)
        prices = []
        holders = tied_holders(placed, profile)
        assert holders == (0, 1)   # gpt-1.7b ties its embedding and head
        for combo in itertools.product((0, 1, 2, 3), repeat=placed.pp):
            trial = placed.replace(zero_stage=max(combo), zero_stages=combo)
            # the tied holders keep one gradient layout (stage_zero docstring)
            alike = len({trial.at_pipeline_rank(r).shards_params_with_fsdp for r in holders}) == 1
            # and beside a zero-bubble schedule only the stages the runtime runs there
            runs = after_step_refusal(trial) is None
            if alike and runs and (stage_totals(trial, profile, mems) <= rank_limits(mems)).all():
                prices.append(surrogate_step_s(trial, profile, search.cluster, profs))
        assert min(prices) >= scored.surrogate_s * (1 - 1e-9), placed.summary()
        if placed.zero_stages is not None:
            mixed += 1
            assert len({placed.at_pipeline_rank(r).shards_params_with_fsdp for r in holders}) == 1
            assert surrogate_step_s(placed, profile, search.cluster, profs) == \
                pytest.approx(scored.surrogate_s, rel=1e-12)
    assert mixed >= 1


#: pp=4 on one DGX A100 with most of each GPU held back: the first rank, four microbatches in
#: flight under 1F1B, needs ZeRO-1 where the others fit without it
SQUEEZED = ("gpt:layers=8,hidden=4096,heads=32,vocab=8192,seq=512",
            {"pp": 4, "tp": 1, "schedule": "1f1b", "recompute": "none"}, "72GiB")


@pytest.fixture(scope="module")
def squeezed():  # type: ignore[no-untyped-def]
    import fxplan

    model, constraints, headroom = SQUEEZED
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search(model, dtype=training_dtype(cluster))
    plan = fxplan.search(graph, cluster, batch=64, progress=False, constraints=constraints,
                         memory_headroom=headroom)
    return graph, cluster, plan


def test_search_plans_a_zero_stage_per_rank_and_prices_it(squeezed) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model import estimate
    from fxplan.inter_op.pricing import priced_config
    from fxplan.report.terminal import plan_summary, zero_line

    graph, cluster, plan = squeezed
    stages = plan.config.zero_stages
    assert stages is not None and stages[0] > stages[-1], plan.summary
    assert plan.estimate["fits"]
    again = estimate(graph, cluster, priced_config(plan), batch=64,
                     memory_headroom=plan.estimate["memory_headroom"])
    assert again.step_time_s == pytest.approx(plan.estimate["step_time_s"], rel=1e-12)
    # the first rank could not run the others' stage: its memory needs the higher one
    lower = estimate(graph, cluster, priced_config(plan).replace(zero_stages=None,
                                                                  zero_stage=min(stages)),
                     batch=64, memory_headroom=plan.estimate["memory_headroom"])
    assert not lower.memory[0].fits and all(m.fits for m in again.memory)
    assert f"zero={plan.config.zero_text}" in plan.summary
    assert zero_line(plan).startswith(f"ZeRO-{max(stages)} on pipeline ranks 0")
    assert plan_summary(plan)["zero_stages"] == list(stages)
    assert type(plan).from_json(plan.to_json()).config == plan.config


@pytest.mark.parametrize("target", ["megatron", "deepspeed", "torchtitan"])
def test_exports_apply_the_strongest_stage_and_price_it(squeezed, target: str) -> None:  # type: ignore[no-untyped-def]
    """No framework sets the ZeRO stage per pipeline rank: the export writes the strongest on
    every rank, says so, and prices the difference."""
    from fxplan.export import export_plan

    _, _, plan = squeezed
    out = export_plan(plan, target)
    text = " ".join(out.notes)
    assert f"ZeRO stage per pipeline rank ({plan.config.zero_text})" in text, out.notes
    assert "zero_stages=one for every pipeline rank" in text, out.notes


def test_explain_keeps_the_stages_per_rank_only_for_the_same_pipeline(squeezed) -> None:  # type: ignore[no-untyped-def]
    from fxplan.report.explain import alternative_config

    _, _, plan = squeezed
    same, notes = alternative_config(plan, {"microbatch_size": 2})
    assert same.zero_stages == plan.config.zero_stages and not any("ZeRO per" in n for n in notes)
    other, notes = alternative_config(plan, {"zero_stage": 2})
    assert other.zero_stages is None and other.zero_stage == 2
    assert any("ZeRO per stage" in n for n in notes), notes


def test_a_zero_constraint_keeps_one_stage_for_every_rank() -> None:
    """Constraints that name the ZeRO stages (an expert's grid: 0 or 1) keep one for all ranks,
    as the recompute constraint keeps one policy for all layers."""
    import fxplan

    model, constraints, headroom = SQUEEZED
    cluster = Cluster.load("dgx-a100-80g:nodes=1")
    graph = capture_for_search(model, dtype=training_dtype(cluster))
    plan = fxplan.search(graph, cluster, batch=64, progress=False,
                         constraints={**constraints, "zero_stage": [0, 1]},
                         memory_headroom=headroom)
    assert plan.config.zero_stages is None and plan.zero_stage in (0, 1), plan.summary
