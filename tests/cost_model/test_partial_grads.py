"""The Partial-gradient reduction under sequence parallelism (:mod:`fxplan.cost_model.comm.partial_grads`):
which parameters, and one flattened tp all-reduce per stage after the backward."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.core.config import ParallelConfig
from fxplan.cost_model.comm.partial_grads import partial_grad_params

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
    from fxplan.cost_model.comm.collectives import collective_time_s

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



def test_sp_collectives_are_the_runtimes(tiny) -> None:  # type: ignore[no-untyped-def]
    """What the module-level runtime issues (benchmarks/dtensor_comm_counts.py on gpt-tiny
    tp=2 sp): per layer forward 2 gathers + 2 reduce-scatters, backward the same (the
    column-parallel input is saved gathered: no re-gather for the weight gradient, on any
    device); the head prices the final norm's gathered output only (the logits' gather for
    the loss is left unpriced, as the intra-op layout's vocabulary-parallel loss has none:
    cost_model.layer_costs._tp_collectives); the positions cost no collective under sp
    (runtime.tp_positions: each tp rank looks up its own), the token embedding's
    reduce-scatter and its gradient's gather are all of the embedding segment."""
    from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost
    from fxplan.cost_model.parallel.tp_layout import tp_layout

    key, names = graph_segments(tiny).layers[0]
    layout = tp_layout(tiny)
    columns, rows = len(set(names) & layout.column), len(set(names) & layout.row)
    assert (columns, rows) == (2, 2)            # qkv, fc1; proj, fc2
    for spec in ("local-cpu:devices=2", GPU):
        device = Cluster.load(spec).device_groups[0]

        def seg(part: str, sp: bool):  # type: ignore[no-untyped-def]
            return segment_cost(tiny, part, tp=2, sequence_parallel=sp, recompute="none",
                                microbatch=8, device=device)

        def kinds(events) -> list[str]:  # type: ignore[no-untyped-def]
            return sorted(kind for kind, _ in events)

        layer = seg(key, True)
        assert kinds(layer.tp_forward) == ["all_gather"] * columns + ["reduce_scatter"] * rows
        assert kinds(layer.tp_backward) == ["all_gather"] * rows + ["reduce_scatter"] * columns
        assert sum(kind == "all_gather" for kind, _ in seg(key, False).tp_backward) == 0
        head = seg("post", True)   # gather the final norm's output (the logits: not priced)
        assert kinds(head.tp_forward) == ["all_gather"], spec
        pre = seg("pre", True)
        assert kinds(pre.tp_forward) == ["reduce_scatter"], spec         # wte only
        assert kinds(pre.tp_backward) == ["all_gather"], spec            # wte's, no positions'
        assert "all_gather" not in kinds(seg("pre", False).tp_backward)
