"""The report on a heterogeneous cluster: the mesh line, the capacity and the memory
table per device group, and the MFU against every device's own peak."""

from __future__ import annotations

import io
import re

from rich.console import Console

import fxplan
from fxplan.report.terminal import capacity_text, mesh_levels, plan_summary, render_report

CLUSTER = "hetero-v100-a100:v100.nodes=1,a100.nodes=1"
MODEL = "gpt:layers=8,hidden=512,heads=8,vocab=4096,seq=512"


def test_report_names_each_group_with_its_own_device_levels_and_capacity() -> None:
    plan = fxplan.search(MODEL, CLUSTER, batch=32, progress=False,
                         constraints={"pp": 2, "tp": 2, "dp": 4})
    line = mesh_levels(plan)
    assert "v100 (stage 0, V100-SXM2-32GB, fp16): dp over nvlink-v100, tp over nvlink-v100" in line
    assert "a100 (stage 1, A100-SXM4-80GB, bf16): dp over nvswitch-a100, tp over nvswitch-a100" \
        in line
    assert capacity_text(plan) == "32 GiB (v100), 80 GiB (a100)"
    out = io.StringIO()
    render_report(plan, Console(file=out, width=220))
    text = out.getvalue()
    assert "of every device's own peak" in text
    assert re.search(r"v100 peak .* of 32 GiB, a100 peak .* of 80 GiB per device", text)
    rows = plan.estimate["memory_breakdown_gib"]
    for s, group in enumerate(("v100", "a100")):
        use = f"{100 * rows[s]['total'] / rows[s]['capacity']:.2g} %"
        assert re.search(rf"^│\s+{s} │\s+{group} │.*{re.escape(use)} │$", text, re.M), use
    assert [g["group"] for g in plan_summary(plan)["stage_groups"]] == ["v100", "a100"]


def test_report_on_one_kind_of_device_is_unchanged() -> None:
    plan = fxplan.search(MODEL, "dgx-a100-80g:devices=2", batch=8, progress=False,
                         constraints={"pp": 2})
    assert mesh_levels(plan) == "pp over nvswitch"
    assert capacity_text(plan) == "80 GiB"
