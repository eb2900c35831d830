"""The predicted Chrome trace: every stage has events; durations add up to the simulator's
numbers (busy time per stage, the critical stage's compute, each stage's step time)."""

from __future__ import annotations

import json

import pytest

from fxplan.cluster_specs import Cluster
from fxplan.api import capture_for_search
from fxplan.core.config import ParallelConfig
from fxplan.cost_model import estimate
from fxplan.report.trace import LANES, predicted_trace, write_trace


@pytest.fixture(scope="module")
def result():
    cluster = Cluster.load("dgx-a100-80g:nodes=2")
    graph = capture_for_search("gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1024", seq=128,
                               dtype="bfloat16")
    config = ParallelConfig.parse("pp=4,dp=2,tp=2,mb=1,schedule=interleaved:2")
    return estimate(graph, cluster, config, batch=16)


def test_trace_sums_to_the_simulated_step(result, tmp_path):
    path = write_trace(predicted_trace(result, title="t"), tmp_path / "t.json")
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    sim = result.simulation
    p = sim.timeline.order.stages
    assert {e["pid"] for e in events} == set(range(p))
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "thread_name"}
    assert names[(0, 0)] == LANES[0] == "compute"
    for s in range(p):
        ops = [e for e in events if e["pid"] == s and e["tid"] <= 3]
        assert sum(e["dur"] for e in ops) == pytest.approx(sim.timeline.busy[s] * 1e6, rel=1e-9)
        last = max(e["ts"] + e["dur"] for e in events if e["pid"] == s)
        assert last == pytest.approx(sim.stage_time[s] * 1e6, rel=1e-9)
        assert {e["args"]["microbatch"] for e in ops} == set(range(result.config.num_microbatches))
    c = result.critical_stage
    compute = sum(e["dur"] for e in events if e["pid"] == c and e["tid"] == 0)
    assert compute == pytest.approx(result.breakdown["compute"] * 1e6, rel=1e-9)
    tp = sum(e["dur"] for e in events if e["pid"] == c and e["tid"] == 1)
    assert tp == pytest.approx(result.breakdown["tp_comm"] * 1e6, rel=1e-9) and tp > 0
    assert any(e["tid"] == 4 for e in events)   # dp gradient buckets (dp=2)
    end = max(e["ts"] + e["dur"] for e in events)
    assert end == pytest.approx(result.step_time_s * 1e6, rel=1e-9)
    assert trace["otherData"]["step_time_s"] == result.step_time_s
