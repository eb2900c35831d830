"""``fxplan launch``: real torchruns of a GPT plan on 4 CPU ranks (training from a token file,
resuming after a re-plan), and the refusals that happen before any process starts. Command
and argument checks without torchrun: ``tests/planner/test_cli_launch.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

from launch_here import launch_here
from processes import descendants

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


def _listening(pids: set[int]) -> set[str]:
    """``ADDR:PORT`` (hex, as /proc/net/tcp{,6} write them) of LISTEN sockets of ``pids``."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1])
    return found


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1, ::1


@pytest.fixture(scope="module")
def first_run(plan_file, tmp_path_factory):
    """One real launch that two tests go on from: 4 SGD steps from a token file on the 4 ranks
    of ``plan_file``, a checkpoint every 2 steps in ``run1/checkpoints``. Returns ``(directory,
    tokens file, completed launch)``."""
    from rt_trainer_cases import make_token_file

    root = tmp_path_factory.mktemp("first")
    tokens = make_token_file(str(root / "tokens.bin"))
    done = launch(str(plan_file), *_resume_flags(tokens), "--run-dir", str(root / "run1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root, tokens, done


def _resume_flags(tokens: str) -> tuple[str, ...]:
    return ("--data", tokens, "--steps", "4", "--optimizer", "sgd", "--lr", "0.3",
            "--checkpoint-every", "2")


def _metrics_losses(run_dir) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row["loss"] for row in map(json.loads, lines)}


@pytest.mark.multirank
def test_launch_trains_50_steps_from_a_token_file_on_loopback_only(plan_file, tmp_path):
    """A real torchrun on 4 CPU ranks: 50 steps from a token file; the loss falls, every
    metric is logged, the summary is written, and while it runs every listening socket of the
    launch's processes is bound to loopback (read from /proc/net/tcp and tcp6)."""
    from rt_trainer_cases import make_token_file

    tokens = make_token_file(str(tmp_path / "tokens.bin"))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fxplan.cli.main", "launch", str(plan_file), "--data", tokens,
         "--steps", "50", "--lr", "3e-3", "--warmup-steps", "5", "--log-every", "10",
         "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sockets: set[str] = set()
    while proc.poll() is None:
        sockets |= _listening(descendants(proc.pid))
        time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert sockets, "no listening socket seen while the launch ran"
    assert all(address.startswith(LOOPBACK) for address in sockets), sockets
    assert stdout.startswith("running: ") and "fxplan.runtime.launch.torchrun" in stdout.splitlines()[0]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [10, 20, 30, 40, 50]
    for key in ("step", "loss", "grad_norm", "lr", "tokens_per_s_per_device",
                "tflops_per_device", "mfu", "peak_memory_gib", "memory_pct"):
        assert all(isinstance(row[key], (int, float)) for row in rows), key
    assert rows[-1]["loss"] < rows[0]["loss"], rows
    assert rows[-1]["lr"] == pytest.approx(3e-4)
    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("predicted_step_time_s", "measured_step_time_s", "predicted_peak_memory_gib",
                "measured_peak_memory_gib", "plan"):
        assert summary[key] is not None, key
    assert re.search(r"^step time +[\d.]+ +[\d.]+ ms$", stdout, re.M), stdout
    assert re.search(r"^step +50 +loss \S+ +grad_norm \S+ +lr \S+ .* MFU \S+%", stdout, re.M)
    assert "terminate called" not in stderr  # clean exits


def test_fewer_processes_than_the_plan_replan_instead_of_refusal(plan_file, capsys):
    """``--nproc-per-node 2`` for a 4-rank plan: not refused; torchrun starts 2 processes and
    the launch replans for them (docs/elastic.md; run for real in test_launch_elastic.py)."""
    from fxplan.cli.main import main

    assert main(["launch", str(plan_file), "--data", "synthetic", "--nproc-per-node", "2",
                 "--print-command"]) == 0
    out = capsys.readouterr().out
    assert "replanning for 2 ranks" in out and "replan: degrees:" in out
    assert "--nproc-per-node=2" in out.splitlines()[-1]


def test_plan_for_another_model_refused(plan_file, capfd):
    done = launch_here(capfd, str(plan_file), "--data", "synthetic", "--model",
                       MODEL + ",layers=3", "--dry-run")
    assert done.returncode == 2
    assert "was made for model" in done.stderr and "re-plan" in done.stderr


def test_plan_for_another_cluster_refused(plan_file, tmp_path, capfd):
    data = json.loads(plan_file.read_text())
    data["cluster_fingerprint"] = "0" * 64
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    done = launch_here(capfd, str(other), "--data", "synthetic", "--dry-run")
    assert done.returncode == 2
    assert "was made for cluster" in done.stderr


@pytest.mark.multirank
def test_training_goes_on_after_a_replan_for_fewer_devices(first_run, tmp_path, capfd):
    """The shared first run (4 steps on 4 ranks, a checkpoint every 2); re-plan for 2 ranks (two
    devices gone); resume there from its step-2 checkpoint to step 4 (``--steps`` is the total)
    and ``--save`` at the end.

    The resumed run starts from the saved parameters and optimizer state, resharded into the
    new mesh, at the next sample: steps 3 and 4 have the first run's losses within float
    tolerance (same global batch and data order; only the all-reduce order differs; a model
    not restored would be back at the initial loss). The ``--save`` directory is a complete
    checkpoint that a launch accepts as ``--resume`` (manifest and hashes verified).
    """
    from fxplan import search

    root, tokens, first = first_run
    smaller = search(MODEL, "local-cpu:devices=2", batch=8, seq=16, progress=False)
    second_plan = smaller.save(tmp_path / "plan2.json")
    ckpt = tmp_path / "ckpt"
    second = launch_here(capfd, str(second_plan), *_resume_flags(tokens), "--save", str(ckpt),
                         "--resume", str(root / "run1" / "checkpoints" / "step-2"),
                         "--run-dir", str(tmp_path / "run2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "resumed parameters, optimizer state and data position" in second.stdout
    assert "random generators not restored" in second.stdout  # 4 ranks saved, 2 resume
    assert "saved parameters, optimizer state and data position" in second.stdout
    whole, after = _metrics_losses(root / "run1"), _metrics_losses(tmp_path / "run2")
    assert sorted(after) == [3, 4], after
    print("max |Δloss| steps 3–4 on 2 ranks:", max(abs(whole[s] - after[s]) for s in (3, 4)))
    assert after == pytest.approx({s: whole[s] for s in (3, 4)}, rel=1e-5, abs=1e-6)
    assert "terminate called" not in first.stderr + second.stderr
    accepted = launch_here(capfd, str(second_plan), "--data", tokens, "--resume", str(ckpt),
                           "--run-dir", str(tmp_path / "run3"), "--print-command")
    assert accepted.returncode == 0, accepted.stderr
    assert "manifest and file hashes verified" in accepted.stdout


def test_resume_from_a_missing_checkpoint_is_refused_before_start(plan_file, tmp_path, capfd):
    done = launch_here(capfd, str(plan_file), "--data", "synthetic", "--resume",
                       str(tmp_path / "nowhere"), "--dry-run")
    assert done.returncode == 2
    assert "no such checkpoint directory" in done.stderr


@pytest.mark.multirank
def test_resumed_launch_continues_at_the_next_sample(plan_file, first_run, tmp_path, capfd):
    """Two real launches: the shared first run (4 steps with a checkpoint every 2), then a
    resume from ``step-2`` into another run directory gives steps 3 and 4 with the first run's
    losses exactly (metrics.jsonl holds full floats), and its metrics start at step 3."""
    root, tokens, _ = first_run
    checkpoints = root / "run1" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["latest", "step-2", "step-4"]
    assert (checkpoints / "latest").read_text().strip() == "step-4"
    second = launch_here(capfd, str(plan_file), *_resume_flags(tokens), "--run-dir",
                         str(tmp_path / "run2"), "--resume", str(checkpoints / "step-2"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "going on at step 3 (global sample 16)" in second.stdout

    whole, resumed = _metrics_losses(root / "run1"), _metrics_losses(tmp_path / "run2")
    assert sorted(resumed) == [3, 4], resumed
    print("max |Δloss| steps 3–4:", max(abs(whole[s] - resumed[s]) for s in (3, 4)))
    assert [resumed[3], resumed[4]] == [whole[3], whole[4]], (whole, resumed)
    assert sorted(p.name for p in (tmp_path / "run2" / "checkpoints").iterdir()) == \
        ["latest", "step-4"]
