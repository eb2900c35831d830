"""``fxplan plan --emit program.py`` writes a program that trains like ``fxplan launch``: both
run 2 steps of the same plan on 2 CPU ranks (same seed, synthetic data) and log the same
losses. The launch also records its measured trace (``--trace``) beside the predicted one."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from fxplan.cli.main import main
from fxplan.core.loopback import loopback_torchrun
from launch_here import launch_here


def _losses(run_dir) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if "loss" in row]


@pytest.mark.multirank
def test_emitted_program_trains_like_launch(tmp_path, capfd, monkeypatch):
    plan, program = tmp_path / "plan.json", tmp_path / "program.py"
    assert main(["plan", "gpt-tiny", "--cluster", "local-cpu:devices=2", "--batch", "4",
                 "--constrain", "pp=2,mb=2", "--json", "-o", str(plan),
                 "--emit", str(program)]) == 0
    capfd.readouterr()
    sockets, torchrun = loopback_torchrun(2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **sockets}
    common = ["--data", "synthetic", "--steps", "2", "--seed", "3"]
    ran = subprocess.run(
        [*torchrun, str(program), *common, "--run-dir", str(tmp_path / "prog")],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    launched = launch_here(capfd, str(plan), *common, "--run-dir", str(tmp_path / "launch"),
                           "--trace")
    assert launched.returncode == 0, launched.stderr[-3000:]
    program_losses, launch_losses = _losses(tmp_path / "prog"), _losses(tmp_path / "launch")
    assert len(program_losses) == 2 and program_losses == launch_losses
    summary = json.loads((tmp_path / "prog" / "summary.json").read_text())
    assert summary["plan"] == json.loads(plan.read_text())["summary"]
    trace_dir = tmp_path / "launch" / "trace"
    predicted = json.loads((trace_dir / "predicted.json").read_text())
    assert {e["pid"] for e in predicted["traceEvents"] if e["ph"] == "X"} == {0, 1}
    for rank in (0, 1):
        measured = json.loads((trace_dir / f"measured-rank{rank}.json").read_text())
        assert any(e.get("ph") == "X" for e in measured["traceEvents"])
