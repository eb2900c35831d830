"""For every row of Megatron-LM SC'21 Table 1, the plan found is predicted at least as fast as
the published configuration, estimated by the same cost model, and fits in memory.

The published configuration (t, p, d = n/(t·p), the row's batch, s = 2048, full recompute,
interleaving and microbatch by the fixed rule) is priced by the cost-model engineer's helper,
``benchmarks/megatron_table.py:predict``; the plan by :func:`fxplan.search` on
``dgx-a100-80g:nodes=gpus/8``. One capture per model, reused by both.
"""

from __future__ import annotations

import runpy
from pathlib import Path
from types import SimpleNamespace

import pytest

from fxplan.cluster_specs import Cluster
from fxplan import search
from fxplan.api import capture_for_search

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "megatron_table.py"
megatron_table = SimpleNamespace(**runpy.run_path(str(SCRIPT), run_name="megatron_table_for_plans"))

ROWS = megatron_table.load_rows()
#: From this many GPUs a row's search takes a minute or more on 2 cores: ``slow``.
SLOW_GPUS = 1536


@pytest.mark.parametrize("row", [pytest.param(r, id=r.preset, marks=[pytest.mark.slow]
                                              if r.gpus >= SLOW_GPUS else [])
                                 for r in ROWS])
def test_plan_at_least_as_fast_as_published(row) -> None:  # type: ignore[no-untyped-def]
    graph = capture_for_search(row.preset, seq=megatron_table.SEQ)
    cluster = Cluster.load(f"dgx-a100-80g:nodes={row.gpus // 8}")
    plan = search(graph, cluster, batch=row.batch, progress=False)
    published = megatron_table.predict(row, graph, cluster).estimate
    assert plan.estimate["fits"], plan.summary
    assert plan.estimate["max_memory_gib"] <= plan.estimate["capacity_gib"]
    assert plan.estimate["step_time_s"] <= published.step_time_s * (1 + 1e-9), (
        f"{row.preset}: plan {plan.summary} {plan.estimate['step_time_s']:.3f} s slower than "
        f"published {published.config.summary()} {published.step_time_s:.3f} s")
