"""``make gpu-check``'s CPU form (``benchmarks/gpu_check.py`` on a machine without a GPU): the
whole script runs — doctor, calibrate, validate, the hand-written loop, two ranks — and writes
its JSON and Markdown with numbers, not placeholders."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.multirank
def test_the_cpu_form_runs_every_step_and_writes_its_results(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu",
                           "--out-dir", str(tmp_path)], capture_output=True, text=True,
                          timeout=1800, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "running the shortened CPU form" in done.stdout.splitlines()[0]
    (json_file,) = tmp_path.glob("*-cpu.json")
    md = json_file.with_suffix(".md").read_text()
    record = json.loads(json_file.read_text())
    assert record["mode"] == "cpu" and record["doctor"]["checks"]
    rows = {r["quantity"]: r for r in record["calibration"]["rows"]}
    assert rows["process baseline per rank"]["written"]
    (single,) = record["single_device"]
    assert "error" not in single, single
    for key in ("measured_step_s", "step_error", "calibrated_step_error", "memory_error"):
        assert math.isfinite(single[key]), key
    numerics = record["numerics"]
    # fp32 on CPU: the launch and the hand-written loop train the same model on the same data
    assert len(numerics["launch_losses"]) == len(numerics["handwritten_losses"]) == 3
    assert numerics["max_relative_loss_difference"] < 1e-5
    (dp,) = record["multi_device"]
    assert "error" not in dp, dp
    assert dp["max_relative_loss_difference"] < 1e-5           # dp=2 trains like one rank
    assert "## One device: predicted against measured" in md and "failed" not in md
