"""``fxplan launch``: a real torchrun of a GPT plan on 4 CPU ranks, and the refusals that
happen before any process starts."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

MODEL = "gpt-tiny:dropout=0,seq=16"


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """The planner's plan for gpt-tiny on 4 local CPU ranks."""
    from fxplan import search

    plan = search(MODEL, "local-cpu:devices=4", batch=8, seq=16, progress=False)
    return plan.save(tmp_path_factory.mktemp("launch") / "plan.json")


def launch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fxplan.cli.main", "launch", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_launch_trains_gpt_on_4_cpu_ranks(plan_file):
    done = launch(str(plan_file), "--steps", "4")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", done.stdout, re.M)]
    assert len(losses) == 4, done.stdout
    assert losses[-1] < losses[0], losses
    assert "tokens/s" in done.stdout and "peak mem" in done.stdout
    assert re.search(r"step time +predicted .* measured", done.stdout)
    assert re.search(r"peak memory per rank +predicted .* measured", done.stdout)
    assert "terminate called" not in done.stderr  # clean exits


def test_dry_run_prints_torchrun_command(plan_file):
    done = launch(str(plan_file), "--dry-run", "--nnodes", "2", "--node-rank", "1",
                  "--rdzv-endpoint", "host0:29500")
    assert done.returncode == 0, done.stderr
    assert "--nproc-per-node=2" in done.stdout and "--node-rank=1" in done.stdout
    assert "--rdzv-endpoint=host0:29500" in done.stdout
    assert "fxplan.worker" in done.stdout


def test_world_size_mismatch_refused_before_start(plan_file, monkeypatch, capsys):
    from fxplan.cli.main import main

    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *args, **kwargs: started.append(args))
    assert main(["launch", str(plan_file), "--nproc-per-node", "2"]) == 2
    assert started == []  # refused before any process was started
    pp, dp, tp = json.loads(plan_file.read_text())["mesh_shape"]
    assert f"needs world size pp·dp·tp = {pp}·{dp}·{tp} = 4, but 2 processes" in capsys.readouterr().err


def test_plan_for_another_model_refused(plan_file):
    done = launch(str(plan_file), "--model", MODEL + ",layers=3", "--dry-run")
    assert done.returncode == 2
    assert "was made for model" in done.stderr and "re-plan" in done.stderr


def test_plan_for_another_cluster_refused(plan_file, tmp_path):
    data = json.loads(plan_file.read_text())
    data["cluster_fingerprint"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    done = launch(str(other), "--dry-run")
    assert done.returncode == 2
    assert "was made for cluster" in done.stderr


def test_training_goes_on_after_a_replan_for_fewer_devices(plan_file, tmp_path):
    """Train on 4 ranks and save; re-plan for 2 ranks (two devices gone); resume there.

    The resumed run starts from the saved parameters and optimizer state, resharded into the
    new mesh: its first loss is below the first run's last printed loss (which was measured
    before that run's last update), not back at the initial loss.
    """
    from fxplan import search

    ckpt = tmp_path / "ckpt"
    first = launch(str(plan_file), "--steps", "3", "--save", str(ckpt))
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    before = [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", first.stdout, re.M)]
    assert "saved parameters and optimizer state" in first.stdout

    smaller = search(MODEL, "local-cpu:devices=2", batch=8, seq=16, progress=False)
    second_plan = smaller.save(tmp_path / "plan2.json")
    second = launch(str(second_plan), "--steps", "2", "--resume", str(ckpt))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    after = [float(x) for x in re.findall(r"^step +\d+ +loss (\S+)", second.stdout, re.M)]
    assert "resumed parameters and optimizer state" in second.stdout
    assert after[0] < before[-1] < before[0], (before, after)
    assert "terminate called" not in first.stderr + second.stderr


def test_resume_from_a_missing_checkpoint_is_refused_before_start(plan_file, tmp_path):
    done = launch(str(plan_file), "--resume", str(tmp_path / "nowhere"), "--dry-run")
    assert done.returncode == 2
    assert "no such checkpoint directory" in done.stderr
