"""The Partial-gradient reduction under sequence parallelism (:mod:`fxplan.cost_model.partial_grads`):
which parameters, and one flattened tp all-reduce per stage after the backward."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.partial_grads import partial_grad_params

GPU = "dgx-a100-80g"


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    import torch

    from fxplan.api import capture

    return capture("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32", batch=1,
                   dtype=torch.float32)


def test_layer_norms_and_positions_are_partial_only_under_sp(tiny) -> None:  # type: ignore[no-untyped-def]
    sp = partial_grad_params(tiny, ParallelConfig.parse("tp=2,sp=on"))
    # 5 layer norms (2 per block + the final one), weight and bias each, and the positions
    # (the runtime measured the same 11 on gpt-tiny: benchmarks/dtensor_comm_counts.py)
    assert len(sp) == 11, sorted(sp)
    assert sum(tiny.params[n].shape[0] == 64 for n in sp) == 10, sorted(sp)
    assert partial_grad_params(tiny, ParallelConfig.parse("tp=2")) == frozenset()
    assert partial_grad_params(tiny, ParallelConfig.parse("dp=2")) == frozenset()


def test_sp_prices_one_all_reduce_of_the_partial_gradients(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model import estimate
    from fxplan.cost_model.collectives import collective_time_s

    cluster = Cluster.load("local-cpu:devices=2")
    sp = estimate(tiny, cluster, ParallelConfig.parse("tp=2,sp=on,mb=8"), batch=8)
    elements = sum(tiny.params[n].numel for n in partial_grad_params(
        tiny, ParallelConfig.parse("tp=2,sp=on")))
    one = collective_time_s("all_reduce", 4.0 * elements, range(2), cluster)
    assert one > 0
    # tp=2, dp=1: nothing else after the backward but the trainer's 8-byte gradient-norm
    # all-reduce over tp (cost_model.step_scalars; the stage counts parameters as segments
    # hold them, within 1 % of the captured shapes)
    norm = collective_time_s("all_reduce", 8.0, range(2), cluster)
    assert sp.breakdown["dp_comm"] == pytest.approx(one + norm, rel=0.01)
    assert estimate(tiny, cluster, ParallelConfig.parse("tp=2,mb=8"),
                    batch=8).breakdown["dp_comm"] == pytest.approx(norm)



def test_sp_regathers_column_inputs_in_the_backward_only_without_overlap(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.layer_costs import graph_segments, segment_cost
    from fxplan.cost_model.tp_layout import tp_layout

    key, names = graph_segments(tiny).layers[0]
    layout = tp_layout(tiny)
    columns, rows = len(set(names) & layout.column), len(set(names) & layout.row)
    assert (columns, rows) == (2, 2)            # qkv, fc1; proj, fc2
    # local-cpu (ω = 0): one more backward all-gather per column-parallel linear (measured:
    # benchmarks/dtensor_comm_counts.py); a GPU (ω = 1) overlaps it: unchanged
    for spec, extra in (("local-cpu:devices=2", columns), (GPU, 0)):
        device = Cluster.load(spec).device_groups[0]
        for sp, expected in ((True, rows + extra), (False, 0)):
            seg = segment_cost(tiny, key, tp=2, sequence_parallel=sp, recompute="none",
                               microbatch=8, device=device)
            assert sum(kind == "all_gather" for kind, _ in seg.tp_backward) == expected, spec
