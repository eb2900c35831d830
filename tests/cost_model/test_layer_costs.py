"""Segment costs price every node with ``cost_model.compute.op_time.node_time_s`` (the intra-op
solver's function), multi-output nodes included."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxplan.cluster_specs import Cluster
from fxplan.cost_model import CostModelError, ParallelConfig, estimate
from fxplan.cost_model.compute.op_time import node_time_s
from fxplan.cost_model.step.layer_costs import graph_segments, segment_cost
from fxplan.api import capture


class MaxHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        values, _ = torch.max(y, dim=-1)  # a node whose dtype is a tuple
        return values.sum()


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return capture(MaxHead(), inputs=torch.randn(8, 32))


@pytest.fixture(scope="module")
def device():  # type: ignore[no-untyped-def]
    return Cluster.load("dgx-a100-80g").device_groups[0]


def test_multi_output_node_is_priced(graph, device) -> None:  # type: ignore[no-untyped-def]
    assert any(isinstance(info.dtype, tuple) for _, info in graph.nodes())
    segments = graph_segments(graph)
    for key in ("pre", "post"):
        cost = segment_cost(graph, key, tp=1, sequence_parallel=False, recompute="none",
                            microbatch=4, device=device)
        infos = dict((n.name, i) for n, i in graph.nodes())
        names = segments.names(key)
        # microbatch 4 of a batch-8 capture: each node does half its captured work
        assert cost.forward_s == pytest.approx(
            sum(node_time_s(infos[n], device, shard_factor=2) for n in names), rel=1e-12)
        assert cost.backward_s == pytest.approx(
            sum(node_time_s(infos[n], device, shard_factor=2, backward=True) for n in names),
            rel=1e-12)
    result = estimate(graph, Cluster.load("dgx-a100-80g"), ParallelConfig.parse("dp=8,mb=1"), batch=8)
    assert result.step_time_s > 0


@pytest.mark.parametrize("spec, seq", [("convnet-small", None), ("mlp-small", None),
                                       ("gpt-tiny", 64)])
def test_seq_is_read_from_a_token_input_only(spec, seq) -> None:  # type: ignore[no-untyped-def]
    graph = capture(spec, batch=2)
    assert graph_segments(graph).seq == seq
    cluster = Cluster.load("dgx-a100-80g")
    data = estimate(graph, cluster, ParallelConfig.parse("dp=8,mb=1"), batch=8).to_dict()
    assert data["seq"] == seq
    assert data["samples_per_s"] == pytest.approx(8 / data["step_time_s"])
    if seq is None:
        assert data["tokens_per_s"] is None
    else:
        assert data["tokens_per_s"] == pytest.approx(data["samples_per_s"] * seq)


def test_sequence_parallel_is_checked_against_the_sequence_not_channels() -> None:
    # convnet-small's input is (batch, 3, H, W): 3 channels are no sequence to split over tp=2,
    # so sp=on is accepted there and priced (its tp collectives differ from sp=off's) ...
    cluster = Cluster.load("dgx-a100-80g")
    graph = capture("convnet-small", batch=2)
    on = estimate(graph, cluster, ParallelConfig.parse("dp=4,tp=2,mb=1,sp=on"), batch=8)
    off = estimate(graph, cluster, ParallelConfig.parse("dp=4,tp=2,mb=1,sp=off"), batch=8)
    assert on.to_dict()["seq"] is None and on.fits
    assert on.config.sequence_parallel and not off.config.sequence_parallel
    assert on.breakdown["tp_comm"] != off.breakdown["tp_comm"]
    # ... while a token sequence that tp does not divide is refused, with the arithmetic
    odd = capture("gpt:layers=2,hidden=64,heads=4,vocab=128,seq=63", batch=2)
    with pytest.raises(CostModelError, match=r"splits seq=63 over tp=2 \(63 mod 2 = 1\)"):
        estimate(odd, cluster, ParallelConfig.parse("dp=4,tp=2,mb=1,sp=on"), batch=8)


def test_name_indexes_and_memo_belong_to_the_graph() -> None:
    """The cost model memoises in the graph's own ``memo`` (a new capture starts empty), and
    the graph's name indexes agree with ``info``."""
    first = capture(MaxHead(), inputs=torch.randn(8, 32))
    segments = graph_segments(first)
    assert graph_segments(first) is segments and first.memo["segments"] is segments
    assert capture(MaxHead(), inputs=torch.randn(8, 32)).memo == {}
    assert first.nodes_by_name is first.nodes_by_name
    for name, node in first.nodes_by_name.items():
        assert first.info(name) is first.infos_by_name[name] is node.meta["fxplan"]
