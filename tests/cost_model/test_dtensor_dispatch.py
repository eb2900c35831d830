"""DTensor's host work per node under tensor parallelism (:mod:`fxplan.cost_model.host.dtensor_dispatch`):
which nodes run on DTensors and how many ordinary and view ops each dispatches."""

from __future__ import annotations

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.cost_model.host.dtensor_dispatch import dispatch_s, dtensor_ops


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    import torch

    from fxplan.api import capture

    return capture("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32", batch=1,
                   dtype=torch.float32)


def _totals(graph, key: str, sp: bool) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.step.layer_costs import graph_segments
    from fxplan.cost_model.parallel.tp_layout import tp_layout

    layout = tp_layout(graph)
    rows = [dtensor_ops(graph, n, layout, split=True, sp=sp)
            for n in graph_segments(graph).names(key)]
    return tuple(sum(r[i] for r in rows) for i in range(4))


def test_a_layer_dispatches_its_linears_and_under_sp_its_residual_stream(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.step.layer_costs import graph_segments

    key = graph_segments(tiny).layers[0][0]
    # 4 linears (1 op + 3 views forward, 1 op + 7 views backward each); the attention core
    # and the MLP activation run on local tensors inside their regions
    assert _totals(tiny, key, sp=False) == (4, 4, 12, 28)
    # under sp also 2 norms, 2 residual adds and 2 dropouts (4 ops forward, 1 backward)
    assert _totals(tiny, key, sp=True) == (4 + 2 + 2 + 8, 4 + 2 + 2 + 2, 12, 28)
    # before the layers: the vocabulary-parallel lookup, the add of the positions (plain:
    # constant indices) and the dropout; the inputs (tokens, targets) stay plain
    assert _totals(tiny, "pre", sp=True) == (1 + 1 + 4, 1 + 1 + 1, 0, 0)
    assert _totals(tiny, "post", sp=True) == (2, 2, 3, 7)   # final norm, head; not the loss


def test_local_cpu_prices_views_and_gpus_nothing() -> None:
    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    assert cpu.host.dtensor_view_op_us > cpu.host.dtensor_op_us > 0   # calibrated: a view costs ≈ 2 ops
    fwd, bwd = dispatch_s((1, 1, 3, 7), cpu.host)
    assert fwd == pytest.approx((cpu.host.dtensor_op_us + 3 * cpu.host.dtensor_view_op_us) * 1e-6)
    assert bwd == pytest.approx((cpu.host.dtensor_backward_op_us + 7 * cpu.host.dtensor_view_op_us) * 1e-6)
    slow = Cluster.load("local-cpu:devices=2,eager_op_us=9.22").device_groups[0]
    assert slow.host.dtensor_view_op_us == pytest.approx(2 * cpu.host.dtensor_view_op_us, rel=1e-3)
    for spec in ("dgx-a100-80g", "dgx-h100"):    # no host costs: nothing to dispatch
        assert Cluster.load(spec).device_groups[0].host is None


def test_the_styles_boundaries_are_counted_per_parallelized_node(tiny) -> None:  # type: ignore[no-untyped-def]
    from fxplan.cost_model.host.dtensor_dispatch import style_boundaries
    from fxplan.cost_model.step.layer_costs import graph_segments
    from fxplan.cost_model.parallel.tp_layout import tp_layout

    layout, segments = tp_layout(tiny), graph_segments(tiny)

    def totals(key: str, sp: bool) -> tuple[int, ...]:
        rows = [style_boundaries(tiny, n, layout, sp=sp, in_layer=key not in ("pre", "post"))
                for n in segments.names(key)]
        return tuple(sum(r[i] for r in rows) for i in range(4))

    key = segments.layers[0][0]
    # a layer: 2 row-parallel linears wrap their local input and redistribute their bias
    # (Replicate → Partial); 2 column-parallel outputs handed on as local tensors
    assert totals(key, sp=True) == totals(key, sp=False) == (2, 2, 2, 0)
    # the vocabulary-parallel lookup (indices in, the weight's gradient out) and, under sp
    # only, the positions' own rows (PositionShard)
    assert totals("pre", sp=True) == (2, 2, 0, 1)
    assert totals("pre", sp=False) == (1, 1, 0, 1)
    # the LM head: its output handed to the loss, the gradient sliced back
    assert totals("post", sp=True) == (0, 0, 1, 1)


def test_the_boundaries_cost_host_time_on_local_cpu_only() -> None:
    from fxplan.cost_model.host.dtensor_dispatch import boundary_s

    cpu = Cluster.load("local-cpu:devices=2").device_groups[0]
    fwd, bwd = boundary_s((2, 1, 3, 1), cpu.host)
    assert fwd == pytest.approx((2 * cpu.host.dtensor_from_local_us
                                 + cpu.host.dtensor_local_redistribute_us) * 1e-6)
    assert bwd == pytest.approx((3 * cpu.host.dtensor_to_local_backward_us
                                 + cpu.host.dtensor_local_redistribute_us) * 1e-6)
    assert min(cpu.host.dtensor_from_local_us, cpu.host.dtensor_to_local_backward_us,
               cpu.host.dtensor_local_redistribute_us) > 0
    for spec in ("dgx-a100-80g", "dgx-h100"):
        assert Cluster.load(spec).device_groups[0].host is None
