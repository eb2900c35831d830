"""The plan report: one row per pipeline stage, numbered by stage even when stages are alike."""

from __future__ import annotations

import io
import re

from rich.console import Console

import fxplan
from fxplan.report.terminal import render_report


def test_memory_rows_are_numbered_by_stage_even_when_stages_are_identical():
    # pp=8 over 24 identical layers: the middle stages have equal memory breakdowns.
    plan = fxplan.search("gpt-1.7b", "dgx-a100-80g:nodes=4", batch=512, progress=False,
                          constraints={"pp": 8, "schedule": "gpipe"})
    out = io.StringIO()
    render_report(plan, Console(file=out, width=200))
    table = out.getvalue()[out.getvalue().index("memory per rank"):]
    assert re.findall(r"^│\s+(\d+) │", table, re.M) == [str(s) for s in range(8)]


def _plan_with_runners(runners):  # type: ignore[no-untyped-def]
    from fxplan.core.config import ParallelConfig
    from fxplan.core.plan import Plan

    config = ParallelConfig.parse("dp=4,tp=2,pp=1,mb=1,schedule=1f1b").resolve(16)
    est = {"step_time_s": 0.0222788, "tokens_per_s": 1.5e5, "tflops_per_device": 125.3,
           "mfu": 0.306, "max_memory_gib": 36.6, "capacity_gib": 40.0, "fits": True,
           "breakdown": {"compute": 0.02, "tp_comm": 0.0022788, "bubble": 1.421e-14},
           "memory_breakdown_gib": []}
    return Plan(model="m", cluster="c", graph_fingerprint="g", cluster_fingerprint="f",
                batch=16, seq=None, config=config, estimate=est, runners_up=tuple(runners))


def test_runners_up_list_each_configuration_once() -> None:
    from fxplan.report.terminal import unique_runners_up

    other = {"summary": "pp=1 dp=8 tp=1 | …", "config": "dp=8,tp=1", "mfu": 0.3,
             "peak_memory_gib": 30.0}
    runners = [dict(other, step_time_s=0.03, delta_s=0.0077, delta_pct=35.0, layout="intra-op"),
               dict(other, step_time_s=0.025, delta_s=0.0027, delta_pct=12.0,
                    layout="megatron-default")]
    plan = _plan_with_runners(runners)
    runners.append(dict(runners[0], summary=plan.summary, config=plan.config.to_string()))
    plan = _plan_with_runners(runners)
    shown = unique_runners_up(plan)
    assert [r["step_time_s"] for r in shown] == [0.025]     # the faster of the two, chosen dropped


def test_report_numbers_are_formatted_and_labelled() -> None:
    out = io.StringIO()
    render_report(_plan_with_runners([]), Console(file=out, width=200))
    text = out.getvalue()
    assert not re.search(r"\d\.\d+e[-+]\d", text), text         # no 1.421e-14
    assert "22.3 ms" in text and "bubble" not in text             # noise is not a term
    assert "125 TFLOP/s per device (counting recompute)" in text and "MFU 30.6 %" in text
