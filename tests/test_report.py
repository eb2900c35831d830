"""The plan report: one row per pipeline stage, numbered by stage even when stages are alike."""

from __future__ import annotations

import io
import re

from rich.console import Console

import fxplan
from fxplan.report import render_report


def test_memory_rows_are_numbered_by_stage_even_when_stages_are_identical():
    # pp=8 over 24 identical layers: the middle stages have equal memory breakdowns.
    plan = fxplan.search("gpt-1.7b", "dgx-a100-80g:nodes=4", batch=512, progress=False,
                          constraints={"pp": 8, "schedule": "gpipe"})
    out = io.StringIO()
    render_report(plan, Console(file=out, width=200))
    table = out.getvalue()[out.getvalue().index("memory per rank"):]
    assert re.findall(r"^│\s+(\d+) │", table, re.M) == [str(s) for s in range(8)]
