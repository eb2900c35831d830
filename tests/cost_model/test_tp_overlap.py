"""``tp_overlap``: sequence-parallel collectives pipelined with their GEMMs (Megatron-Core
``--tp-comm-overlap``) cost only what exceeds the GEMM, ``max(0, t_comm − t_gemm)``."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model import CostModelError, ParallelConfig, estimate
from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost

def test_config_text_round_trips_and_needs_sequence_parallel() -> None:
    config = ParallelConfig.parse("dp=2,tp=2,mb=1,sp=on,tp_overlap=on")
    assert config.tp_comm_overlap
    assert "tp_overlap=on" in config.to_string()
    assert ParallelConfig.parse(config.to_string()) == config
    assert "tp_overlap" not in ParallelConfig.parse("dp=2,tp=2,sp=on").to_string()
    with pytest.raises(CostModelError, match=r"tp_overlap=on needs tp > 1 and sp=on"):
        ParallelConfig.parse("dp=2,tp=2,sp=off,tp_overlap=on")
    with pytest.raises(CostModelError, match=r"needs tp > 1"):
        ParallelConfig.parse("dp=4,tp=1,tp_overlap=on")


def test_each_linear_collective_carries_its_gemm(gpt_512) -> None:  # type: ignore[no-untyped-def]
    device = Cluster.load("dgx-h100").device_groups[0]
    key = graph_segments(gpt_512).layers[0][0]
    on = segment_cost(gpt_512, key, tp=2, sequence_parallel=True, recompute="none",
                      microbatch=1, device=device)
    assert len(on.tp_forward_gemm_s) == len(on.tp_forward) == 4   # AG, RS per linear pair
    assert len(on.tp_backward_gemm_s) == len(on.tp_backward) == 4
    assert all(g > 0 for g in on.tp_forward_gemm_s + on.tp_backward_gemm_s)
    # the GEMMs pipelined with the collectives are the layer's matrix products, no more
    assert sum(on.tp_forward_gemm_s) < on.forward_s
    off = segment_cost(gpt_512, key, tp=2, sequence_parallel=False, recompute="none",
                       microbatch=1, device=device)
    assert not any(off.tp_forward_gemm_s + off.tp_backward_gemm_s)   # all-reduce: no overlap
    full = segment_cost(gpt_512, key, tp=2, sequence_parallel=True, recompute="full",
                        microbatch=1, device=device)
    assert full.tp_backward_gemm_s == on.tp_forward_gemm_s + on.tp_backward_gemm_s


@pytest.mark.parametrize("cluster", ["dgx-h100", "aws-p3-v100"])
def test_overlap_hides_at_most_the_gemm_time(gpt_512, cluster) -> None:  # type: ignore[no-untyped-def]
    """Exposed tp time falls, by no more than the paired GEMMs' seconds (overlap is bounded
    by the GEMM, not free), and the compute is unchanged."""
    cl = Cluster.load(cluster)
    base = ParallelConfig.parse("dp=4,tp=2,pp=1,mb=1,sp=on")
    off = estimate(gpt_512, cl, base, batch=4)
    on = estimate(gpt_512, cl, base.replace(tp_comm_overlap=True), batch=4)
    device = cl.device_groups[0]
    segments = graph_segments(gpt_512)
    keys = ["pre", *(k for k, _ in segments.layers), "post"]
    gemm = sum(sum(c.tp_forward_gemm_s) + sum(c.tp_backward_gemm_s)
               for c in (segment_cost(gpt_512, k, tp=2, sequence_parallel=True, recompute="none",
                                      microbatch=1, device=device) for k in keys))
    assert 0 < on.breakdown["tp_comm"] < off.breakdown["tp_comm"]
    assert off.breakdown["tp_comm"] - on.breakdown["tp_comm"] <= gemm * (1 + 1e-9)
    assert on.breakdown["compute"] == pytest.approx(off.breakdown["compute"])


def test_userbuffers_collectives_that_hold_sms(gpt_512) -> None:  # type: ignore[no-untyped-def]
    """Transformer Engine's defaults: the row-parallel outputs' reduce-scatters (``pipeline``)
    forward; the column-parallel inputs' all-gathers and their gradients' reduce-scatters
    (``bulk``) backward; the ``ring_exchange`` all-gathers run on copy engines; the embedding
    and head have no userbuffers."""
    device = Cluster.load("dgx-h100").device_groups[0]
    segments = graph_segments(gpt_512)
    key = segments.layers[0][0]
    on = segment_cost(gpt_512, key, tp=2, sequence_parallel=True, recompute="none",
                      microbatch=1, device=device)
    assert [kind for kind, _ in on.tp_sm_forward] == ["reduce_scatter"] * 2
    assert sorted(kind for kind, _ in on.tp_sm_backward) == ["all_gather"] * 2 + ["reduce_scatter"] * 2
    for outer in ("pre", "post"):
        cost = segment_cost(gpt_512, outer, tp=2, sequence_parallel=True, recompute="none",
                            microbatch=1, device=device)
        assert cost.tp_sm_forward == cost.tp_sm_backward == ()
    off = segment_cost(gpt_512, key, tp=2, sequence_parallel=False, recompute="none",
                       microbatch=1, device=device)
    assert off.tp_sm_forward == off.tp_sm_backward == ()
    full = segment_cost(gpt_512, key, tp=2, sequence_parallel=True, recompute="full",
                        microbatch=1, device=device)
    assert full.tp_sm_backward == on.tp_sm_forward + on.tp_sm_backward


def test_sms_held_by_overlapped_collectives_slow_the_gemms(gpt_512) -> None:  # type: ignore[no-untyped-def]
    """Each such collective of duration t holds 16 of the N SMs: the tp row grows by
    Σ t·16/(N − 16) per microbatch; a device without an SM count prices none of it."""
    from fxplan.cost_model.comm.collectives import collective_time_s
    from fxplan.cost_model.step.stage_collectives import UB_COMM_SMS

    config = ParallelConfig.parse("dp=4,tp=2,pp=1,mb=1,sp=on,tp_overlap=on")
    priced = Cluster.load("dgx-h100")
    bare = Cluster.load(f"dgx-h100:h100.sm_count={UB_COMM_SMS}")   # no SM left for a GEMM
    device = priced.device_groups[0]
    n = priced.device_groups[0].sm_count
    assert n == 132
    held = 0.0
    for key, _ in graph_segments(gpt_512).layers:
        cost = segment_cost(gpt_512, key, tp=2, sequence_parallel=True, recompute="none",
                            microbatch=1, device=device)
        held += sum(collective_time_s(kind, nbytes, (0, 1), priced)
                    for kind, nbytes in cost.tp_sm_forward + cost.tp_sm_backward)
    on = estimate(gpt_512, priced, config, batch=4)
    off = estimate(gpt_512, bare, config, batch=4)
    assert held > 0
    assert on.breakdown["tp_comm"] - off.breakdown["tp_comm"] == pytest.approx(
        held * UB_COMM_SMS / (n - UB_COMM_SMS))
    assert on.breakdown["compute"] == pytest.approx(off.breakdown["compute"])
