"""``rank_memory_rows``: ZeRO stage and offload given once or per pipeline rank, the ranks priced
together as arrays equal to the one-rank formula, entry by entry."""

from __future__ import annotations

import numpy as np
import pytest

from fxplan.cost_model.memory.breakdown import MEMORY_ROWS, model_state_bytes
from fxplan.cost_model.memory.runtime import cuda_context_bytes, fragmentation_bytes, nccl_bytes
from fxplan.cost_model.parallel.expert_parallel import model_states
from fxplan.cost_model.step.pipeline_schedules import inflight_counts
from fxplan.cost_model.memory.rank_memory import buffer_bytes, rank_memory_rows

P = 4
OFFLOADS = ("none", "optimizer", "optimizer+params")


def _inputs(ep: int = 1, contexts: tuple | None = (None, 0.6, None, None),
            kinds: tuple = ("gpu", "gpu", "cpu", "gpu")) -> dict:
    rng = np.random.default_rng(7)
    return dict(params=rng.uniform(1e8, 3e9, P), saved=rng.uniform(1e8, 2e9, (P, 1)),
                working=rng.uniform(1e7, 1e8, P), max_output_bytes=rng.uniform(1e6, 1e8, P),
                max_segment_params=rng.uniform(1e7, 1e8, P), reserved=[1e9] * P,
                capacity=[80 * 2.0**30] * P, tp=4, dp=8, sequence_parallel=True,
                kinds=list(kinds), headroom=[2e9, 2e9, 0.0, 2e9],
                contexts=None if contexts is None else list(contexts),
                expert_params=rng.uniform(1e7, 5e7, P) if ep > 1 else (), ep=ep)


def _order():
    return inflight_counts("1f1b", P, 1, 8)


def _breakdowns(order, **inputs) -> list:
    """One :class:`MemoryBreakdown` per rank from the rows."""
    return rank_memory_rows(order, **inputs).breakdowns()


@pytest.mark.parametrize("offload", OFFLOADS)
def test_offload_per_rank_of_equal_entries_is_the_plan_wide_one(offload):
    one = _breakdowns(_order(), **_inputs(), zero_stage=3, offload=offload)
    each = _breakdowns(_order(), **_inputs(), zero_stage=[3] * P, offload=[offload] * P)
    assert one == each


@pytest.mark.parametrize("ep", [1, 2])
def test_mixed_offload_and_zero_price_each_rank_by_its_own_entry(ep):
    zeros, offloads = [3, 1, 3, 2], ["optimizer+params", "none", "none", "optimizer"]
    mixed = _breakdowns(_order(), **_inputs(ep), zero_stage=zeros, offload=offloads)
    for s, (zero, offload) in enumerate(zip(zeros, offloads)):
        alone = _breakdowns(_order(), **_inputs(ep), zero_stage=zero, offload=offload)[s]
        assert mixed[s] == alone
    # the entries differ where the rungs do: the ranks are not priced alike
    assert mixed[0].params == 0.0 and mixed[0].host > 0.0
    assert mixed[1].optimizer > 0.0 and mixed[1].host == 0.0
    assert mixed[3].optimizer == 0.0 and mixed[3].host > 0.0


@pytest.mark.parametrize("kinds", [("gpu",) * P, ("gpu", "gpu", "cpu", "gpu")])
@pytest.mark.parametrize("contexts", [None, (None, 0.6, None, None)])
@pytest.mark.parametrize("ep", [1, 2])
def test_each_rank_equals_the_one_rank_formula(ep, contexts, kinds):
    """Every field of every rank is the float the scalar functions give for that rank."""
    zeros, offloads = [0, 1, 2, 3], ["none", "optimizer", "none", "optimizer+params"]
    x = _inputs(ep, contexts, kinds)
    got = _breakdowns(_order(), **x, zero_stage=zeros, offload=offloads)
    acts = _order().peak_inflight(x["saved"])
    for s in range(P):
        psi, kind = float(x["params"][s]), x["kinds"][s]
        states = (model_states(psi, float(x["expert_params"][s]), dp=8, ep=ep,
                               zero_stage=zeros[s], offload=offloads[s]) if ep > 1 else
                  model_state_bytes(psi, 8, zeros[s], offload=offloads[s]))
        buffers = buffer_bytes(float(x["max_output_bytes"][s]),
                               float(x["max_segment_params"][s]), pp=P, tp=4, dp=8,
                               zero_stage=zeros[s], sequence_parallel=True)
        work, act = float(x["working"][s]), float(acts[s])
        m = got[s]
        assert (m.params, m.grads, m.optimizer, m.host) == (
            states.params, states.grads, states.optimizer, states.host)
        assert (m.activations, m.recompute_working, m.buffers) == (act, work, buffers)
        assert m.cuda_context == cuda_context_bytes(kind, contexts and contexts[s])
        assert m.nccl == nccl_bytes(kind, pp=P, dp=8, tp=4)
        assert m.fragmentation == fragmentation_bytes(kind, act + work + buffers)
        assert m.headroom == x["headroom"][s]


def test_rows_total_is_each_breakdowns_total():
    rows = rank_memory_rows(_order(), **_inputs(), zero_stage=[1, 2, 3, 3],
                            offload=["none", "optimizer", "none", "optimizer+params"])
    totals = [m.total for m in rows.breakdowns()]
    assert rows.total.tolist() == totals
    assert set(MEMORY_ROWS) <= set(rows.rows)


@pytest.mark.parametrize("name,value", [("zero_stage", [3, 3]), ("offload", ["none"] * 5)])
def test_a_per_rank_list_of_the_wrong_length_is_refused(name, value):
    given = {"zero_stage": 3, "offload": "none", name: value}
    with pytest.raises(ValueError, match=f"{name} gives {len(value)} entries for {P}"):
        _breakdowns(_order(), **_inputs(), **given)


def test_an_unknown_offload_in_the_list_is_refused():
    with pytest.raises(ValueError, match="offload must be"):
        _breakdowns(_order(), **_inputs(), zero_stage=3, offload=["none", "disk", "none", "none"])


@pytest.mark.parametrize("kind,v", [("1f1b", 1), ("gpipe", 1), ("interleaved", 2),
                                    ("interleaved", 3), ("zb", 2), ("zbv", 2), ("dualpipev", 2)])
def test_peak_inflight_of_all_ranks_at_once_is_each_ranks_own(kind, v):
    """The stacked product (ranks of unequal profile lengths padded) gives each rank exactly
    the float of its own ``profiles[s] @ w[s]``."""
    rng = np.random.default_rng(3)
    for p, m in [(2, 4), (4, 8), (4, 17), (8, 16)]:
        counts = inflight_counts(kind, p, v, m)
        w = rng.uniform(0.0, 5e9, (p, v))
        own = [float((counts.profiles[s] @ w[s]).max()) for s in range(p)]
        assert counts.peak_inflight(w).tolist() == own
