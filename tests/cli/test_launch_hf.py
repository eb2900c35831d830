"""``fxplan launch`` of a Hugging Face model: a tiny ``hf:llama`` planned with ``--constrain``
runs at module level (the user's module, ``parallelize_module`` with sequence parallelism and
FSDP2 on a 2×2 mesh) on 4 CPU ranks, says so in the log and the summary, and learns."""

from __future__ import annotations

import json

import pytest

from launch_here import launch_here

LLAMA = ("hf:llama:num_hidden_layers=2,hidden_size=32,intermediate_size=64,num_attention_heads=4,"
         "num_key_value_heads=2,vocab_size=64,max_position_embeddings=16")


@pytest.mark.multirank
def test_launch_hf_llama_runs_the_plan_on_the_users_module(tmp_path, capfd):
    pytest.importorskip("transformers")
    from fxplan.cli.main import main

    plan = tmp_path / "plan.json"  # planned by the CLI verb in this process (no second import)
    assert main(["plan", LLAMA, "--cluster", "local-cpu:devices=4", "--batch", "4", "--seq", "8",
                 "--constrain", "tp=2,dp=2,sp=true,zero=3", "-o", str(plan)]) == 0, \
        capfd.readouterr().err[-3000:]
    run = tmp_path / "run"
    done = launch_here(capfd, str(plan), "--data", "synthetic", "--steps", "6",
                       "--log-every", "1", "--run-dir", str(run))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "applied: module level" in done.stdout, done.stdout
    assert "fallback:" not in done.stdout, done.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["applied"] == "module"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss"] < rows[0]["loss"], rows
