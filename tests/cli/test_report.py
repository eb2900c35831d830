"""``fxplan report plan.json``: the terminal report, ``--html`` and ``--trace`` of a saved plan
(the page's own checks: tests/test_report_html.py; the trace's: tests/test_trace.py)."""

from __future__ import annotations

import json

import pytest

import fxplan
from fxplan.cli.main import main


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    plan = fxplan.search("gpt-tiny", "local-cpu:devices=4", batch=16, progress=False,
                         constraints={"pp": 2})
    return plan, plan.save(tmp_path_factory.mktemp("report") / "plan.json")


def test_report_writes_page_and_trace_and_prints_the_report(plan_file, tmp_path, capsys):
    plan, path = plan_file
    html, trace = tmp_path / "p.html", tmp_path / "t.json"
    assert main(["report", str(path), "--html", str(html), "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert plan.summary in out and "memory per rank" in out
    assert f"report page written to {html}" in out and f"predicted trace written to {trace}" in out
    assert html.read_text().startswith("<!DOCTYPE html>")
    data = json.loads(trace.read_text())
    assert data["otherData"]["step_time_s"] == pytest.approx(plan.estimate["step_time_s"], rel=1e-9)
    assert {e["pid"] for e in data["traceEvents"] if e["ph"] == "X"} == {0, 1}


def test_report_refuses_a_plan_for_another_cluster(plan_file, tmp_path, capsys):
    _, path = plan_file
    data = json.loads(path.read_text())
    data["cluster_fingerprint"] = "0" * len(data["cluster_fingerprint"])
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    assert main(["report", str(other), "--html", str(tmp_path / "x.html")]) == 2
    assert "fingerprint" in capsys.readouterr().err.lower()
    assert not (tmp_path / "x.html").exists()
